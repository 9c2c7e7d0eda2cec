"""Providers and prompts a user can change without forking: LiteLLM (the optional extra) against
the loopback chat server, its clear one-line error when it is not installed, prices from LiteLLM's
table with the hand-kept one as the fallback, and a folder of prompt templates from the settings file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from replay_runs import FakeEngine, recorded_answers
from typer.testing import CliRunner

from conftest import ADD_ONE
from helpers.chat_server import ChatServer, Reply, Status
from kernelwright.cli.main import app
from kernelwright.core.config import ModelConfig, RetryPolicy
from kernelwright.models import ModelSetupError, resolve_model
from kernelwright.models.chat import Usage
from kernelwright.models.pricing import BUILTIN, PriceTable, litellm_price

needs_litellm = pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None, reason="needs the litellm extra (pip install 'kernelwright[litellm]')"
)

CODE = "```python\nimport torch.nn as nn\n\n# SPEED=1.3\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n```"  # noqa: E501
PERF = "```json\n" + json.dumps({"bottleneck": "b", "optimisation": "o", "expected_speedup": 1.2}) + "\n```"


@needs_litellm
def test_litellm_reaches_an_openai_protocol_server_and_retries_what_is_retryable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    script = {"coder": [Status(429, retry_after="0"), Reply("one two three")]}
    with ChatServer(script) as server:
        cfg = ModelConfig(base_url=server.base_url, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01))
        model = resolve_model("litellm:openai/coder", "coder", cfg)
        done = model.complete([{"role": "user", "content": "write a kernel"}])
    assert model.name == "litellm:openai/coder"
    assert done.text == "one two three" and done.usage.completion_tokens == 3
    assert [a.ok for a in done.attempts] == [False, True] and done.attempts[0].status_code == 429
    assert server.served("coder") == ["Status", "Reply"]  # LiteLLM's own retries are off: ours counted both
    assert done.cost_usd is None  # a local model has no price


@needs_litellm
def test_optimize_with_litellm_models_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setattr("kernelwright.loop.forge.engine_evaluator", lambda cfg, warm=True: FakeEngine())
    with ChatServer({}, respond=lambda model, messages: Reply(CODE if model == "coder" else PERF)) as server:
        out = CliRunner().invoke(
            app,
            [
                "optimize",
                str(ADD_ONE),
                "--coder",
                "litellm:openai/coder",
                "--judge",
                "litellm:openai/judge",
                "--base-url",
                server.base_url,
                "--rounds",
                "2",
                "--device",
                "cpu",
                "--no-profile",
                "--out",
                str(tmp_path / "run"),
                "--json",
            ],
        )
    assert out.exit_code == 0, out.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["coder"] == "litellm:openai/coder" and summary["best"]["speedup"] == 1.3
    assert summary["tokens"]["total"] > 0


def test_without_litellm_the_prefix_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)  # an import of it fails, as where it is not installed
    with pytest.raises(ModelSetupError) as info:
        resolve_model("litellm:gemini/gemini-2.5-pro", "coder", ModelConfig())
    assert str(info.value) == (
        "litellm:gemini/gemini-2.5-pro: LiteLLM is not installed; pip install 'kernelwright[litellm]'"
    )
    out = CliRunner().invoke(
        app, ["optimize", str(ADD_ONE), "--coder", "litellm:gemini/gemini-2.5-pro", "--device", "cpu"]
    )
    assert out.exit_code == 2 and "pip install 'kernelwright[litellm]'" in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


def test_prices_come_from_litellm_when_installed_else_the_hand_table(tmp_path, monkeypatch):
    table = PriceTable.load()
    if importlib.util.find_spec("litellm") is not None:
        import litellm

        entry = litellm.model_cost["gemini/gemini-2.5-pro"]
        assert table.cost("gemini/gemini-2.5-pro", Usage(1_000_000, 1_000_000)) == pytest.approx(
            (entry["input_cost_per_token"] + entry["output_cost_per_token"]) * 1e6
        )
        assert litellm_price("gpt-4o") is not None
    (tmp_path / "p.json").write_text(json.dumps({"gemini-2.5-pro": {"input": 0, "output": 0}}))
    assert PriceTable.load(tmp_path / "p.json").cost("gemini/gemini-2.5-pro", Usage(5, 5)) == 0  # the user's first
    # no LiteLLM: the hand table, and None (unknown, never 0) for what it does not list
    monkeypatch.setattr("kernelwright.models.pricing.litellm_table", lambda: {})
    assert PriceTable.load().cost("gpt-4o", Usage(1_000_000, 0)) == pytest.approx(BUILTIN["gpt-4o"].input_per_mtok)
    assert PriceTable.load().cost("gemini/gemini-2.5-pro", Usage(1, 1)) is None


# ---- prompt templates from the settings file -------------------------------------------------


def test_a_prompt_folder_in_the_settings_file_replaces_the_templates_it_holds(tmp_path, monkeypatch):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "coder_first.j2").write_text(
        "OUR HOUSE PROMPT for {{ device }} ({{ backend }}):\n```python\n{{ problem_code | trim }}\n```\n"
    )
    (tmp_path / "kernelwright.toml").write_text('[model]\nprompt_dir = "prompts"\n')
    monkeypatch.setattr("kernelwright.loop.forge.engine_evaluator", lambda cfg, warm=True: FakeEngine())
    answers = recorded_answers(tmp_path / "answers")
    args = [
        "optimize",
        str(ADD_ONE),
        "--coder",
        f"replay:{answers}",
        "--rounds",
        "2",
        "--device",
        "cpu",
        "--no-profile",
        "--config",
        str(tmp_path / "kernelwright.toml"),
    ]
    out = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert out.exit_code == 0, out.output
    first, second = sorted((tmp_path / "run").glob("0*_*"))
    prompt = (first / "coder_prompt.md").read_text()
    assert prompt.startswith("OUR HOUSE PROMPT for the CPU (cpp):") and "torch.relu(x) + 1.0" in prompt
    assert "Your job is to FIX" in (second / "coder_prompt.md").read_text()  # the bundled repair prompt
    assert "OUR HOUSE" not in (first / "judge_prompt.md").read_text()

    # a file that replaces no template is a typo: said before any model call, one line, exit 2
    (prompts / "coder_frist.j2").write_text("x")
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run2")])
    assert bad.exit_code == 2 and "coder_frist.j2 replace no template" in bad.output
    assert not (tmp_path / "run2").exists()


def test_the_readme_documents_the_prompt_folder_and_litellm():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "prompt_dir" in readme and "kernelwright[litellm]" in readme
