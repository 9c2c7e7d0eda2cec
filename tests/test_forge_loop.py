"""The forge loop end to end, with no GPU and no network: the real loop, the real engine, the
real `openai` client, talking to a real HTTP server on loopback that serves scripted answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ADD_ONE, CANDIDATES, EXAMPLES, FIXTURES
from helpers.chat_server import ChatServer, Reply, Status
from kernelwright.cli.main import app
from kernelwright.core.config import LoopConfig, ModelConfig, RetryPolicy
from kernelwright.loop.forge import Forge, engine_evaluator
from kernelwright.models import resolve_model
from kernelwright.store.rundir import RunDir, read_summary

LOOP = FIXTURES / "loop"
CUDA_PROBLEM = EXAMPLES / "cuda_swish" / "problem.py"
CUDA_REPLAY = EXAMPLES / "cuda_swish" / "replay"

# The GPU machine has no `openai` client: the tests that talk HTTP skip there; replay needs none.
needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client")


def answer(path: Path, prose: str = "Here is the program.") -> str:
    return f"{prose}\n\n```python\n{path.read_text()}```\n"


def judge_json(**fields) -> str:
    return "```json\n" + json.dumps(fields) + "\n```"


WRONG_VERDICT = judge_json(
    critical_issue="fused_swish_affine is called with bias and scale swapped.",
    why_it_matters="Every output is x*sigmoid(x)*bias+scale instead of x*sigmoid(x)*scale+bias.",
    minimal_fix_hint="Call fused.fused_swish_affine(x, self.scale, self.bias).",
)
ROWWISE_VERDICT = judge_json(
    bottleneck="forward calls the kernel once per row (16 calls) and then torch.cat copies every row again.",
    optimisation="Call fused_swish_affine once on the whole 2-D tensor; it already splits rows over threads.",
    expected_speedup=4,
    why="one call and no concatenation instead of 16 calls and a copy",
)
FUSED_VERDICT = judge_json(
    bottleneck="one pass over memory already; the exp dominates.",
    optimisation="Vectorise the inner loop.",
    expected_speedup="1.2x",
)


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def loop_config(folder):
    """These tests are about the loop, not the CPU's timing noise: the rowwise candidate is about 5x
    slower than the fused one, but on a busy 2-core CI machine five timing windows can spread wider
    than that, and the spread rule (tested on its own in test_forge_rules.py) would keep the slow one.
    So the spread test is off here; the 2% minimum still decides."""
    path = folder / "kernelwright.toml"
    path.write_text(
        "[loop]\nspread_factor = 0.0\n"
        # and the test fixture's cheaper timing (tests/conftest.py: cpu_config)
        "[eval.timing]\nwindows = 3\nmax_window_calls = 64\n"
        # a call's limit far above a loaded machine's slowest call: the verdicts are the loop's subject
        "[eval.timeouts]\ncall_floor = 60\n"
    )
    return path


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory, cache_dir, small_swish):
    """`kernelwright optimize` through the CLI: wrong -> Judge -> repaired (slow) -> Judge -> fast
    -> Judge (told what it expected and what was measured) -> an answer with no code (no evaluation).
    On the example's problem at batch 16 (conftest's `small_swish`: the same candidates and builds;
    the loop is the subject, not the problem's size)."""
    out = tmp_path_factory.mktemp("runs") / "swish"
    config = loop_config(tmp_path_factory.mktemp("config"))
    script = {
        "coder-model": [
            Reply(answer(LOOP / "cpp_swish_wrong.py")),
            Reply(answer(LOOP / "cpp_swish_rowwise.py")),
            Reply(answer(LOOP / "cpp_swish_fused.py")),
            Reply("I would vectorise it next."),
        ],
        "judge-model": [Reply(WRONG_VERDICT), Reply(ROWWISE_VERDICT), Reply(FUSED_VERDICT)],
    }
    mp = pytest.MonkeyPatch()
    mp.setenv("KERNELWRIGHT_CACHE", cache_dir)  # the session's build cache: the example's extension builds once
    try:
        with ChatServer(script) as server:
            output = cli(
                "optimize",
                str(small_swish),
                "--coder",
                "coder-model",
                "--judge",
                "judge-model",
                "--base-url",
                server.base_url,
                "--rounds",
                "4",
                "--backend",
                "cpp",
                "--device",
                "cpu",
                "--trials",
                "3",
                "--out",
                str(out),
                "--config",
                str(config),
            )
    finally:
        mp.undo()
    return out, server, output


@pytest.mark.slow
@needs_openai
def test_loop_repairs_then_speeds_up_and_keeps_the_fastest(recorded_run):
    out, server, output = recorded_run
    summary = read_summary(out)
    assert [r["verdict"] for r in summary["rounds"]] == ["incorrect", "passed", "passed", "format_error"]
    assert [r["kind"] for r in summary["rounds"]] == ["first", "repair", "optimise", "optimise"]
    assert [r["evaluated"] for r in summary["rounds"]] == [True, True, True, False]
    slow, fast = summary["rounds"][1]["speedup"], summary["rounds"][2]["speedup"]
    # the fused candidate is about 5x the rowwise one on a quiet machine; a loaded one can move either
    # figure, so the round kept is the one the rule keeps on the figures measured (spread test off):
    # a figure timed while the conditions did not hold (timing_unstable, most on a shared 2-core CPU)
    # never replaces one that stands, one that stands replaces it, and two alike meet the rule
    unstable = [
        "timing_unstable" in json.loads((out / r["dir"] / "eval.json").read_text())["metadata"]["guards"]["flags"]
        for r in summary["rounds"][1:3]
    ]
    if unstable[0] != unstable[1]:
        kept = 2 if unstable[0] else 1
    else:
        kept = 2 if fast >= slow * (1 + LoopConfig().min_improvement) else 1
    best = summary["best"]
    assert best["round"] == kept and best["speedup"] == (fast if kept == 2 else slow)
    if kept == 2 and unstable[0] == unstable[1]:
        assert summary["rounds"][2]["best_decision"].startswith(f"{fast:.3f}x beats the best ({slow:.3f}x)")
    kept_file = "cpp_swish_fused.py" if kept == 2 else "cpp_swish_rowwise.py"
    assert (out / "best.py").read_text() == (LOOP / kept_file).read_text()
    assert summary["state"] == "finished" and summary["stop_reason"] == "round limit (4) reached"
    assert summary["profile"] == "auto" and summary["sandbox"] == "auto"
    # tokens: the server counted words for each of the 7 calls, and the run adds them up
    assert summary["tokens"]["total"] == sum(r["tokens"] for r in summary["rounds"]) > 0
    assert summary["unpriced_calls"] == 7 and summary["cost_usd"] == 0
    # the run directory, round by round
    dirs = [out / r["dir"] for r in summary["rounds"]]
    assert [d.name[:4] for d in dirs] == ["000_", "001_", "002_", "003_"]
    assert (dirs[0] / "candidate.py").read_text() == (LOOP / "cpp_swish_wrong.py").read_text()
    assert json.loads((dirs[0] / "eval.json").read_text())["status"] == "incorrect"
    assert "Outputs are not close" in json.loads((dirs[0] / "eval.json").read_text())["error_log"]
    assert json.loads((dirs[0] / "round.json").read_text())["critique"]["minimal_fix_hint"].startswith("Call fused")
    assert not (dirs[3] / "judge_prompt.md").exists()  # the last round asks no Judge (nor does a format error)
    # the profile is on by default: the Judge of a correct candidate reads it (torch.profiler on the CPU)
    perf_prompt = (dirs[1] / "judge_prompt.md").read_text()
    assert "Profile (torch.profiler; ncu unavailable: " in perf_prompt and "[candidate]" in perf_prompt
    assert json.loads((dirs[1] / "eval.json").read_text())["metadata"]["profile"]["source"] == "torch.profiler"
    assert "YOUR LAST EXPECTATION" not in perf_prompt
    # the Judge expected 4x over round 1; round 2 measured fast/slow over it, and the records say whether it held
    ratio = fast / slow
    outcome = "exceeded" if ratio > 4.4 else "met" if ratio >= 3.6 else "missed" if ratio >= 1 else "regressed"
    r2 = json.loads((dirs[2] / "round.json").read_text())
    assert r2["expected_speedup"] == 4.0 and r2["expectation"]["baseline_round"] == 1
    assert r2["expectation"]["measured_over_baseline"] == pytest.approx(ratio)
    assert r2["expectation"]["outcome"] == outcome and r2["expectation_held"] == (outcome in ("met", "exceeded"))
    row = summary["rounds"][2]
    assert (row["expected_speedup"], row["expectation_outcome"]) == (4.0, outcome)
    assert row["expectation_held"] == r2["expectation_held"] and row["speedup"] == fast
    assert json.loads((dirs[1] / "round.json").read_text())["critique"]["expected_speedup"] == 4.0
    # ... and the next Judge is told
    again = (dirs[2] / "judge_prompt.md").read_text()
    assert (
        f"YOUR LAST EXPECTATION\nin round 1 you expected 4.00x over the round-1 candidate ({slow:.3f}x); "
        f"round 2 measured {ratio:.2f}x over it ({fast:.3f}x overall): {outcome}."
    ) in again
    assert (
        "expected_speedup: 4.00x over this code (one call and no concatenation"
        in (dirs[2] / "coder_prompt.md").read_text()
    )
    # the repair prompt carries the engine's error, the old code and the Judge's three fields, in order
    repair = (dirs[1] / "coder_prompt.md").read_text()
    assert repair.startswith("You are a senior C++-extension developer (CPU kernels). Your job is to FIX")
    marks = [
        "OUTPUT RULES",
        "ERROR LOG",
        "Outputs are not close",
        "OLD CODE (read-only)",
        "self.bias, self.scale",
        "Main Critical Problem",
        "critical_issue: fused_swish_affine is called with bias and scale swapped.",
        "why_it_matters:",
        "minimal_fix_hint: Call fused.fused_swish_affine(x, self.scale, self.bias).",
    ]
    positions = [repair.index(m) for m in marks]
    assert positions == sorted(positions)
    assert repair.rstrip().endswith("```python\n\n```")
    optimise = (dirs[2] / "coder_prompt.md").read_text()
    assert "bottleneck: forward calls the kernel once per row" in optimise and "torch.cat(rows)" in optimise
    # what the server received is what the run directory recorded
    assert server.prompts("coder-model") == [(d / "coder_prompt.md").read_text() for d in dirs]
    assert "round 2 (3 of 4): passed" in output and "round 3 (4 of 4): format_error" in output


@pytest.mark.slow
@needs_openai
def test_replay_of_the_recorded_run_reproduces_its_verdicts(
    recorded_run, tmp_path, monkeypatch, cache_dir, small_swish
):
    out, _, _ = recorded_run
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    again = tmp_path / "replayed"
    cli(
        "optimize",
        str(small_swish),
        "--coder",
        f"replay:{out}",
        "--rounds",
        "4",
        "--backend",
        "cpp",
        "--device",
        "cpu",
        "--trials",
        "3",
        "--out",
        str(again),
        "--no-profile",
        "--config",
        str(loop_config(tmp_path)),
    )
    first, second = read_summary(out), read_summary(again)
    assert [r["verdict"] for r in second["rounds"]] == [r["verdict"] for r in first["rounds"]]
    assert [r["dir"] for r in second["rounds"]] == [r["dir"] for r in first["rounds"]]  # same code, same hashes
    # which passing round is kept is decided by timing again: on this 2-core machine the reference's
    # own time moves up to 2x from one evaluation to the next, so a replay may keep the other one
    # (the first run's choice is `test_loop_repairs_then_speeds_up_and_keeps_the_fastest`'s)
    best = second["best"]["round"]
    assert best in (1, 2) and second["rounds"][best]["verdict"] == "passed"
    assert second["judge"].startswith("replay:") and second["profile"] == "off"
    assert [r["expected_speedup"] for r in second["rounds"]] == [r["expected_speedup"] for r in first["rounds"]]
    best_dir = again / second["rounds"][best]["dir"]
    assert (again / "best.py").read_text() == (best_dir / "candidate.py").read_text()


@pytest.mark.slow
@needs_openai
def test_the_run_survives_rate_limits_server_errors_bad_answers_and_timeouts(cpu_config, tmp_path):
    py = lambda name: answer(CANDIDATES / name)  # noqa: E731
    script = {
        "coder": [
            Status(429, "rate limited"),
            Reply("I would fuse relu and the add, but here is just the idea."),
            Reply(py("py_correct.py"), delay_s=3.0),
            Reply(py("py_correct.py")),
            Reply(py("py_wrong.py")),
        ],
        "judge": [
            Status(500, "upstream exploded"),
            Reply(judge_json(bottleneck="two elementwise passes", optimisation="fuse them", expected_speedup="1.5x")),
        ],
    }
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, request_timeout_s=1.0)
    mcfg = ModelConfig(retry=policy)
    with ChatServer(script) as server:
        mcfg.base_url = server.base_url
        coder, judge = resolve_model("coder", "coder", mcfg), resolve_model("judge", "judge", mcfg)
        cfg = LoopConfig(rounds=3, backend="cuda", model=mcfg)
        run_dir = RunDir(tmp_path / "run", ADD_ONE, {"coder": coder.name, "judge": judge.name})
        engine = engine_evaluator(cpu_config)  # warm: every evaluation takes a child started ahead
        forge = Forge(ADD_ONE, coder, judge, engine, cfg, device="cpu", recorder=run_dir)
        state = forge.run()
    assert engine.warm._spare is None  # the run's end stopped the spare it had started
    summary = read_summary(tmp_path / "run")
    assert [r["verdict"] for r in summary["rounds"]] == ["format_error", "passed", "incorrect"]
    assert [r["kind"] for r in summary["rounds"]] == ["first", "repair", "optimise"]
    # the answer with no code block cost no evaluation, and went straight back to the Coder
    assert [r["evaluated"] for r in summary["rounds"]] == [False, True, True]
    r0 = json.loads((tmp_path / "run" / summary["rounds"][0]["dir"] / "round.json").read_text())
    assert "no code block" in r0["summary"] and r0["judge"] is None
    assert [a["status_code"] for a in r0["coder"]["attempts"]] == [429, None]  # 429, then success
    assert r0["coder"]["attempts"][0]["retry_after_s"] == pytest.approx(0.01)
    r1 = json.loads((tmp_path / "run" / summary["rounds"][1]["dir"] / "round.json").read_text())
    assert r1["coder"]["attempts"][0]["error"].startswith("timeout") and r1["coder"]["attempts"][1]["ok"]
    assert [a["status_code"] for a in r1["judge"]["attempts"]] == [500, None]  # a 500, then the verdict
    assert r1["critique"]["optimisation"] == "fuse them" and r1["critique"]["expected_speedup"] == 1.5
    # the attempt at the Judge's optimisation failed: its expectation was not measured (a repair carries it)
    assert summary["rounds"][2]["expectation_outcome"] == "not_measured"
    assert summary["rounds"][2]["expected_speedup"] == 1.5
    repair_prompt = server.prompts("coder")[1]
    assert "Output rules broken: no code block" in repair_prompt and "OLD CODE (read-only)" in repair_prompt
    assert server.served("coder") == ["Status", "Reply", "Reply", "Reply", "Reply"]
    # both evaluations ran in children started ahead (at the run's start, then after round 1)
    for r in summary["rounds"][1:]:
        ev = json.loads((tmp_path / "run" / r["dir"] / "eval.json").read_text())
        assert ev["metadata"]["prestarted"]["startup_s"] > 0, ev["metadata"]
    # the regression (incorrect) never replaced the best
    assert state.best.index == 1 and summary["best"]["round"] == 1
    assert (tmp_path / "run" / "best.py").read_text() == (CANDIDATES / "py_correct.py").read_text()


def gpu_loop_config(folder):
    """The loop's spread rule off (tested in test_forge_rules.py): the two passing rounds differ by
    about 1.3x, inside the spread of short GPU windows, and this test is about keeping the faster."""
    path = folder / "kernelwright.toml"
    path.write_text("[loop]\nspread_factor = 0.0\n")
    return path


@pytest.mark.gpu
@pytest.mark.slow
def test_a_replayed_cuda_run_verifies_a_speedup_on_the_gpu(tmp_path, monkeypatch, cache_dir):
    """Our written responses for the bundled CUDA problem, replayed: bug, repair, vectorised kernel."""
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    out = tmp_path / "cuda-replay"
    cli(
        "optimize",
        str(CUDA_PROBLEM),
        "--coder",
        f"replay:{CUDA_REPLAY}",
        "--rounds",
        "3",
        "--backend",
        "cuda",
        "--device",
        "cuda",
        "--trials",
        "3",
        "--out",
        str(out),
        "--config",
        str(gpu_loop_config(tmp_path)),
    )
    summary = read_summary(out)
    assert [r["verdict"] for r in summary["rounds"]] == ["incorrect", "passed", "passed"], summary["rounds"]
    assert summary["rounds"][1]["kind"] == "repair" and summary["rounds"][2]["kind"] == "optimise"
    best = summary["best"]
    assert best is not None and best["speedup"] > 1.0  # verified: correct over every trial, then timed
    record = json.loads((out / best["dir"] / "eval.json").read_text())
    assert record["status"] == "passed" and record["device_type"] == "cuda"
    assert record["candidate_timing"]["clock"] == "judge_window"  # the judge's windows, not the runner's events
    assert best["speedup"] == max(r["speedup"] for r in summary["rounds"] if r["speedup"] is not None)
    # the profile (on by default): ncu's raw report and CSV in the round's folder, or the reason it fell back
    for r in summary["rounds"][1:]:
        prof = json.loads((out / r["dir"] / "eval.json").read_text())["metadata"]["profile"]
        if prof["source"] == "ncu":
            assert (out / r["dir"] / "profile" / "profile.ncu-rep").is_file()
            assert (out / r["dir"] / "profile" / "profile.csv").is_file()
            assert prof["report_path"].startswith(str(out / r["dir"]))
        else:
            assert prof["source"] == "torch.profiler" and prof["fallback_reason"]
    assert "Profile (" in (out / summary["rounds"][1]["dir"] / "judge_prompt.md").read_text()
    # the Judge expected "1.1x to 1.3x" over round 1: round 2's record says what was measured and whether it held
    row = summary["rounds"][2]
    assert row["expected_speedup"] == pytest.approx(1.2)
    assert row["measured_over_baseline"] == pytest.approx(row["speedup"] / summary["rounds"][1]["speedup"])
    assert row["expectation_outcome"] in ("exceeded", "met", "missed", "regressed")
