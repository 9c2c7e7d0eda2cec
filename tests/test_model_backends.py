"""The model backends: prices, resolving a model name (keys, endpoints), the OpenAI and Anthropic
clients against the loopback chat server, retries and Retry-After."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from helpers.chat_server import ChatServer, Reply
from helpers.chat_server import Status as HttpStatus
from kernelwright.core.config import ModelConfig, RetryPolicy
from kernelwright.models import ModelError, ModelSetupError, resolve_model
from kernelwright.models.chat import Usage
from kernelwright.models.pricing import PriceTable

needs_clients = pytest.mark.skipif(
    importlib.util.find_spec("openai") is None or importlib.util.find_spec("anthropic") is None,
    reason="needs the openai and anthropic clients",
)
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, request_timeout_s=5.0)


def test_price_table_matches_prefixes_and_takes_user_files(tmp_path):
    table = PriceTable.load()
    assert table.cost("gpt-4o-mini-2024-07-18", Usage(1_000_000, 0)) == pytest.approx(0.15)
    assert table.cost("gpt-4o-2024-08-06", Usage(0, 1_000_000)) == pytest.approx(10.0)
    assert table.cost("my-local-model", Usage(10, 10)) is None
    (tmp_path / "p.toml").write_text('["my-local-model"]\ninput = 1.0\noutput = 2.0\n')
    (tmp_path / "p.json").write_text(json.dumps({"gpt-4o": {"input": 0, "output": 0}}))
    assert PriceTable.load(tmp_path / "p.toml").cost("my-local-model", Usage(1_000_000, 1_000_000)) == pytest.approx(
        3.0
    )
    assert PriceTable.load(tmp_path / "p.json").cost("gpt-4o", Usage(5, 5)) == 0
    (tmp_path / "bad.json").write_text('{"m": 3}')
    with pytest.raises(ModelSetupError, match="fix the file"):
        PriceTable.load(tmp_path / "bad.json")


@pytest.mark.slow
@needs_clients
def test_missing_keys_and_endpoints_are_one_line_errors(monkeypatch, tmp_path):
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ModelSetupError, match="set OPENAI_API_KEY, or pass --base-url"):
        resolve_model("openai:gpt-5", "coder", ModelConfig())
    with pytest.raises(ModelSetupError, match="set ANTHROPIC_API_KEY"):
        resolve_model("anthropic:claude-sonnet-4-kw-test", "judge", ModelConfig())
    with pytest.raises(ModelSetupError, match="set MY_KEY"):
        resolve_model("gpt-5", "coder", ModelConfig(api_key_env="MY_KEY"))
    with pytest.raises(ModelSetupError, match="replay run directory not found"):
        resolve_model(f"replay:{tmp_path / 'nope'}", "coder", ModelConfig())
    local = resolve_model("qwen2.5-coder:7b", "coder", ModelConfig(base_url="http://127.0.0.1:9/v1"))
    assert local.model == "qwen2.5-coder:7b"  # a bare name (with ollama's colon) served at --base-url


@needs_clients
def test_the_sdks_response_schemas_are_built_before_a_rounds_coders_call_at_once():
    """The SDKs build their response models' pydantic schemas at first use, not thread-safely: three
    coders of one round, first calls at once, raised AttributeError ('type object ChatCompletion has
    no attribute __pydantic_core_schema__') once in a suite. A backend builds them when it is made,
    in the thread that makes it. Checked in a fresh interpreter (another test may have built them)."""
    code = (
        "import os\n"
        "os.environ['OPENAI_API_KEY'] = os.environ['ANTHROPIC_API_KEY'] = 'sk-test'\n"
        "from openai.types.chat import ChatCompletion\n"
        "from anthropic.types import Message\n"
        "from kernelwright.core.config import ModelConfig\n"
        "from kernelwright.models import resolve_model\n"
        "before = (ChatCompletion.__pydantic_complete__, Message.__pydantic_complete__)\n"
        "resolve_model('openai:gpt-5', 'coder', ModelConfig())\n"
        "resolve_model('anthropic:claude-sonnet-4-kw-test', 'judge', ModelConfig())\n"
        "print(before, (ChatCompletion.__pydantic_complete__, Message.__pydantic_complete__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["(False,", "False)", "(True,", "True)"], out.stdout  # (deferred at import)


@needs_clients
def test_openai_backend_counts_tokens_and_cost(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ChatServer({"gpt-4o": [Reply("one two three")]}) as server:
        model = resolve_model("openai:gpt-4o", "coder", ModelConfig(base_url=server.base_url, retry=FAST))
        done = model.complete([{"role": "user", "content": "a b c d"}])
    assert done.text == "one two three" and done.usage == Usage(4, 3)
    assert done.cost_usd == pytest.approx((4 * 2.5 + 3 * 10.0) / 1e6)
    assert server.log[0]["auth"] == "Bearer sk-test"


@needs_clients
def test_anthropic_backend_through_the_messages_api(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    script = {"claude-sonnet-4-kw-test": [HttpStatus(529, "overloaded"), Reply("the answer")]}
    with ChatServer(script) as server:
        model = resolve_model(
            "anthropic:claude-sonnet-4-kw-test", "judge", ModelConfig(base_url=server.root_url, retry=FAST)
        )
        done = model.complete([{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}])
    assert done.text == "the answer" and done.usage == Usage(1, 2)
    assert [a.status_code for a in done.attempts] == [529, None]
    assert done.cost_usd == pytest.approx((1 * 3.0 + 2 * 15.0) / 1e6)


@needs_clients
def test_retries_give_up_with_every_attempt_recorded():
    script = {"m": [HttpStatus(500), HttpStatus(503), HttpStatus(502)], "k": [HttpStatus(401, "bad key")]}
    with ChatServer(script) as server:
        cfg = ModelConfig(base_url=server.base_url, retry=FAST)
        with pytest.raises(ModelError, match="gave up after 3 attempts") as info:
            resolve_model("m", "coder", cfg).complete([{"role": "user", "content": "x"}])
        assert [a.status_code for a in info.value.attempts] == [500, 503, 502]
        assert [a.retry_after_s for a in info.value.attempts] == [0.01, 0.02, None]  # exponential back-off
        with pytest.raises(ModelError, match="401") as info:
            resolve_model("k", "coder", cfg).complete([{"role": "user", "content": "x"}])
        assert len(info.value.attempts) == 1  # a bad key is not retried
    assert server.served("k") == ["Status"]


@needs_clients
def test_retry_after_header_is_honoured():
    with ChatServer({"m": [HttpStatus(429, retry_after="0.04"), Reply("ok")]}) as server:
        done = resolve_model("m", "coder", ModelConfig(base_url=server.base_url, retry=FAST)).complete(
            [{"role": "user", "content": "x"}]
        )
    assert done.attempts[0].retry_after_s == pytest.approx(0.04)
