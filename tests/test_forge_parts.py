"""The forge loop's parts, fast (no engine, no build): prompts, answer extraction, Judge parsing,
prices, model resolution and retries (against the loopback server), and the loop's rules with
a fake evaluator."""

from __future__ import annotations

import importlib.util
import json

import jinja2
import pytest

from kernelwright import prompts
from kernelwright.config import LoopConfig, ModelConfig, RetryPolicy
from kernelwright.extract import (
    FailureCritique,
    JudgeParseError,
    OutputRuleError,
    PerformanceCritique,
    extract_code,
    parse_judge,
)
from kernelwright.loop import Forge
from kernelwright.models import ModelError, ModelSetupError, resolve_model
from kernelwright.models.base import Completion, Usage
from kernelwright.models.pricing import PriceTable
from kernelwright.models.replay import ReplayChat
from kernelwright.result import EvalResult, Status
from kernelwright.rundir import RunDir, RunDirError, read_summary

from chat_server import ChatServer, Reply, Status as HttpStatus
from conftest import EXAMPLES, FIXTURES

CUDA_CANDIDATE = (EXAMPLES / "cuda_swish" / "candidate.py").read_text()
CPP_CANDIDATE = (EXAMPLES / "cpu_swish" / "candidate.py").read_text()
ADD_ONE = FIXTURES / "problems" / "add_one.py"
needs_clients = pytest.mark.skipif(
    importlib.util.find_spec("openai") is None or importlib.util.find_spec("anthropic") is None,
    reason="needs the openai and anthropic clients")
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, request_timeout_s=5.0)


def block(code: str, prose: str = "Here you go.") -> str:
    return f"{prose}\n```python\n{code}```\n"


# ---- prompts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cuda", "triton", "cpp"])
def test_every_prompt_renders_for_every_backend(backend):
    passed = EvalResult(status=Status.PASSED, correct=True, speedup=1.5, candidate_ms=1.0, reference_ms=1.5,
                        device="dev")
    failed = EvalResult(status=Status.COMPILE_ERROR, error_log="boom")
    crit = FailureCritique("a", "b", "c")
    perf = PerformanceCritique("x", "y", "2x")
    texts = [
        prompts.render("coder_first", backend=backend, device="the CPU", problem_code="P"),
        prompts.render("coder_repair", backend=backend, error_log="E", old_code="O", critique=crit, verdict="incorrect"),
        prompts.render("coder_repair", backend=backend, error_log="E", old_code="O", critique=None, verdict="format_error"),
        prompts.render("coder_optimise", backend=backend, device="d", result=passed, old_code="O", critique=perf,
                       last_attempt=None, problem_code="P"),
        prompts.render("judge_failure", backend=backend, problem_code="P", code="C", result=failed, history=[], profile=""),
        prompts.render("judge_performance", backend=backend, problem_code="P", code="C", result=passed,
                       history=[{"round": 0, "verdict": "passed", "speedup": 1.5}], profile="dram 80%"),
    ]
    assert all("OUTPUT RULES" in t for t in texts[:4])
    word = {"cuda": "`source`", "triton": "@triton.jit", "cpp": "CPU only"}[backend]
    assert all(word in t for t in texts[:4])
    assert '"critical_issue"' in texts[4] and '"expected_speedup"' in texts[5] and "dram 80%" in texts[5]
    assert "minimal_fix_hint: Answer with exactly one" in texts[2]


def test_repair_prompt_has_the_seed_layout():
    text = prompts.render("coder_repair", backend="cuda", error_log="nvcc: error X", old_code="OLD",
                          critique=FailureCritique("ISSUE", "WHY", "HINT"), verdict="compile_error")
    assert text.startswith("You are a senior CUDA-extension developer. Your job is to FIX the compilation or "
                           "runtime errors in the Python script shown below.")
    marks = ["OUTPUT RULES", "1. Imports: `torch`, `torch.nn`, `load_inline`", "2. `source`", "3. `cpp_src`",
             "4. ONE `load_inline` call", "5. `class ModelNew(nn.Module)`",
             "__main__", "ERROR LOG", "nvcc: error X", "OLD CODE (read-only)", "OLD", "Main Critical Problem",
             "critical_issue: ISSUE", "why_it_matters: WHY", "minimal_fix_hint: HINT"]
    positions = [text.index(m) for m in marks]
    assert positions == sorted(positions)
    assert text.rstrip().endswith("```python\n\n```")


def test_a_missing_prompt_variable_is_an_error_not_a_blank():
    with pytest.raises(jinja2.UndefinedError):
        prompts.render("coder_first", backend="cuda", device="d")


# ---- extraction ------------------------------------------------------------------------------

def test_code_is_extracted_from_prose_and_checked():
    assert extract_code(block(CUDA_CANDIDATE), "cuda") == CUDA_CANDIDATE
    assert extract_code(block(CPP_CANDIDATE), "cpp") == CPP_CANDIDATE


@pytest.mark.parametrize("answer, backend, message", [
    ("I would fuse the kernels.", "cuda", "no code block"),
    (block(CUDA_CANDIDATE + '\nif __name__ == "__main__":\n    print(ModelNew(4))\n'), "cuda", "__main__"),
    (block(CUDA_CANDIDATE + "\nprint(ModelNew(4)(torch.randn(2, 4)))\n"), "cuda", "testing code"),
    (block(CUDA_CANDIDATE + "\ndef get_inputs():\n    return []\n"), "cuda", "testing code: def get_inputs"),
    (block(CUDA_CANDIDATE.replace("cpp_src = ", "cpp_header = ") + "\ncpp_src = cpp_header\n"), "cuda",
     "sections out of order: load_inline"),
    (block(CPP_CANDIDATE + "\nimport math\n"), "cpp", "an import at line"),
    (block("import torch\nclass ModelNew(:\n  pass\n"), "cuda", "not valid Python"),
    (block("import torch\nx = 1\n"), "cuda", "no class ModelNew"),
    (block(CPP_CANDIDATE) + block(CPP_CANDIDATE), "cpp", "2 code blocks define ModelNew"),
])
def test_answers_that_break_the_output_rules_are_format_errors(answer, backend, message):
    with pytest.raises(OutputRuleError, match=message.replace("(", r"\(")):
        extract_code(answer, backend)


def test_judge_json_is_read_robustly():
    fenced = 'Sure.\n```json\n{"critical_issue": "a", "why_it_matters": "b", "minimal_fix_hint": "c"}\n```'
    assert parse_judge(fenced, FailureCritique) == FailureCritique("a", "b", "c")
    loose = 'Analysis {not json} then {"bottleneck": "mem", "optimization": "fuse", "expected_speedup": 2} done'
    assert parse_judge(loose, PerformanceCritique) == PerformanceCritique("mem", "fuse", "2")
    with pytest.raises(JudgeParseError, match="critical_issue"):
        parse_judge('{"critical_issue": "only one field"}', FailureCritique)


# ---- prices and models -----------------------------------------------------------------------

def test_price_table_matches_prefixes_and_takes_user_files(tmp_path):
    table = PriceTable.load()
    assert table.cost("gpt-4o-mini-2024-07-18", Usage(1_000_000, 0)) == pytest.approx(0.15)
    assert table.cost("gpt-4o-2024-08-06", Usage(0, 1_000_000)) == pytest.approx(10.0)
    assert table.cost("my-local-model", Usage(10, 10)) is None
    (tmp_path / "p.toml").write_text('["my-local-model"]\ninput = 1.0\noutput = 2.0\n')
    (tmp_path / "p.json").write_text(json.dumps({"gpt-4o": {"input": 0, "output": 0}}))
    assert PriceTable.load(tmp_path / "p.toml").cost("my-local-model", Usage(1_000_000, 1_000_000)) == pytest.approx(3.0)
    assert PriceTable.load(tmp_path / "p.json").cost("gpt-4o", Usage(5, 5)) == 0
    (tmp_path / "bad.json").write_text('{"m": 3}')
    with pytest.raises(ModelSetupError, match="fix the file"):
        PriceTable.load(tmp_path / "bad.json")


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
        model = resolve_model("anthropic:claude-sonnet-4-kw-test", "judge",
                              ModelConfig(base_url=server.root_url, retry=FAST))
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
            [{"role": "user", "content": "x"}])
    assert done.attempts[0].retry_after_s == pytest.approx(0.04)


# ---- the loop's rules, with a fake engine ----------------------------------------------------

class Scripted:
    """A model that answers from a list and counts 100 tokens per call."""

    def __init__(self, answers, name="scripted"):
        self.answers, self.name, self.prompts = list(answers), name, []

    def complete(self, messages):
        self.prompts.append(messages[-1]["content"])
        if not self.answers:
            raise ModelError(f"{self.name}: 503 InternalServerError (gave up after 5 attempts)")
        return Completion(text=self.answers.pop(0), usage=Usage(60, 40), model=self.name, cost_usd=0.01)


def code(speedup: float | None) -> str:
    """A candidate whose fake evaluation passes at `speedup` (None: incorrect)."""
    return f"import torch.nn as nn\nSPEEDUP = {speedup!r}\nclass ModelNew(nn.Module):\n    pass\n"


def fake_engine(calls):
    def evaluate(problem, text, on_stage):
        calls.append(text)
        on_stage("correctness")
        value = eval(text.split("SPEEDUP = ")[1].splitlines()[0])
        if value is None:
            return EvalResult(status=Status.INCORRECT, error_log="Outputs are not close")
        return EvalResult(status=Status.PASSED, correct=True, speedup=value, candidate_ms=1.0 / value,
                          reference_ms=1.0, device="fake")
    return evaluate


PERF = json.dumps({"bottleneck": "b", "optimisation": "o", "expected_speedup": "2x"})
FAIL = json.dumps({"critical_issue": "i", "why_it_matters": "w", "minimal_fix_hint": "h"})


def forge(tmp_path, coder_answers, judge_answers, **cfg):
    coder, judge, calls = Scripted(coder_answers, "coder"), Scripted(judge_answers, "judge"), []
    rec = RunDir(tmp_path / "run", ADD_ONE, {})
    f = Forge(ADD_ONE, coder, judge, fake_engine(calls), LoopConfig(**cfg), device="cpu", recorder=rec)
    return f, coder, judge, calls


def test_a_regression_never_replaces_the_best(tmp_path):
    f, coder, _, _ = forge(tmp_path, [block(code(2.0)), block(code(1.2)), block(code(None)), block(code(2.5))],
                           [PERF, PERF, FAIL], rounds=4)
    state = f.run()
    assert [r.verdict for r in state.rounds] == ["passed", "passed", "incorrect", "passed"]
    assert [r.became_best for r in state.rounds] == [True, False, False, True]
    assert state.best.index == 3
    # after the regression the Coder is shown the best code, and told the attempt was not kept
    assert "SPEEDUP = 2.0" in coder.prompts[2] and "slower than this code (2.000x)" in coder.prompts[2]
    assert "SPEEDUP = None" in coder.prompts[3] and "ERROR LOG" in coder.prompts[3]  # repair of the failure
    assert (tmp_path / "run" / "best.py").read_text() == code(2.5)


def test_target_speedup_stops_early_and_skips_the_judge(tmp_path):
    f, _, judge, _ = forge(tmp_path, [block(code(1.1)), block(code(3.0)), block(code(4.0))], [PERF], rounds=10,
                           target_speedup=2.5)
    state = f.run()
    assert len(state.rounds) == 2 and state.stop_reason == "target speedup 2.5x reached"
    assert len(judge.prompts) == 1


def test_token_and_cost_budgets_stop_the_run(tmp_path):
    f, *_ = forge(tmp_path, [block(code(1.1))] * 5, [PERF] * 5, rounds=10, max_tokens=350)
    state = f.run()
    assert state.usage.total_tokens >= 350 and len(state.rounds) == 2  # 2 rounds x (coder + judge) x 100
    assert state.stop_reason.startswith("token budget spent")
    f, *_ = forge(tmp_path / "b", [block(code(1.1))] * 5, [PERF] * 5, rounds=10, max_cost_usd=0.03)
    assert f.run().stop_reason.startswith("cost budget spent")


def test_a_model_that_fails_for_good_ends_the_run_with_the_best_kept(tmp_path):
    f, *_ = forge(tmp_path, [block(code(1.5))], [PERF], rounds=5)
    state = f.run()
    assert state.stop_reason.startswith("coder failed: coder: 503") and state.best.index == 0
    summary = read_summary(tmp_path / "run")
    assert summary["state"] == "finished" and summary["best"]["round"] == 0
    assert [r["verdict"] for r in summary["rounds"]] == ["passed", "model_error"]


def test_an_unreadable_judge_answer_is_recorded_and_the_loop_goes_on(tmp_path):
    f, coder, _, _ = forge(tmp_path, [block(code(None)), block(code(1.5))], ["I am not sure."], rounds=2)
    state = f.run()
    assert "no JSON object" in state.rounds[0].judge_error and state.rounds[0].critique is None
    assert "no review was available" in coder.prompts[1]
    assert state.best.index == 1


def test_a_format_error_spends_no_evaluation_and_no_judge(tmp_path):
    f, coder, judge, calls = forge(tmp_path, ["just prose", block(code(1.5))], [], rounds=2)
    state = f.run()
    assert state.rounds[0].verdict == "format_error" and not state.rounds[0].evaluated
    assert len(calls) == 1 and judge.prompts == []
    assert "Output rules broken: no code block" in coder.prompts[1] and "just prose" in coder.prompts[1]


def test_replay_plays_back_in_order_and_then_stops(tmp_path):
    f, *_ = forge(tmp_path, [block(code(None)), block(code(1.5))], [FAIL], rounds=2)
    f.run()
    replay = ReplayChat(tmp_path / "run", "coder")
    assert replay.complete([]).text == block(code(None)) and replay.complete([]).text == block(code(1.5))
    with pytest.raises(ModelError, match="no more coder responses"):
        replay.complete([])
    assert ReplayChat(tmp_path / "run", "judge").complete([]).text == FAIL


def test_a_used_run_directory_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    with pytest.raises(RunDirError, match="pass a new --out"):
        RunDir(tmp_path / "run", ADD_ONE, {})
