"""The forge loop's rules, fast (no engine, no build, no network): scripted models and a fake
evaluator. Which candidate is kept as the best, when the run stops, what a failing model or an
unreadable answer does, replay of a recorded run, and the Judge's expected speedup checked by the
next passing round. (tests/test_forge_loop.py runs the loop end to end with the real engine.)"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from rich.console import Console

from conftest import ADD_ONE, block
from kernelwright.cli.console import LoopProgress
from kernelwright.core.config import EvalConfig, LoopConfig, ProfileConfig
from kernelwright.core.record import EvalResult, Status, TimingStats
from kernelwright.loop.forge import Forge, engine_evaluator, improvement
from kernelwright.models import ModelError
from kernelwright.models.chat import Completion, Usage
from kernelwright.models.replay import ReplayChat
from kernelwright.store.rundir import RunDir, read_summary


class Scripted:
    """A model that answers from a list and counts 100 tokens per call."""

    def __init__(self, answers, name="scripted"):
        self.answers, self.name, self.prompts = list(answers), name, []

    def complete(self, messages):
        self.prompts.append(messages[-1]["content"])
        if not self.answers:
            raise ModelError(f"{self.name}: 503 InternalServerError (gave up after 5 attempts)")
        return Completion(text=self.answers.pop(0), usage=Usage(60, 40), model=self.name, cost_usd=0.01)


def code(speedup: float | None, spread: float | None = None, tag: str = "") -> str:
    """A candidate whose fake evaluation passes at `speedup` (None: incorrect); `spread`: its timing's
    p10 and p90 lie that fraction below and above the median (None: no timing statistics)."""
    return (
        f"import torch.nn as nn\nSPEEDUP = {speedup!r}\nSPREAD = {spread!r}\nTAG = {tag!r}\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )


def timed(speedup: float, spread: float | None) -> EvalResult:
    median = 1.0 / speedup
    stats = (
        None
        if spread is None
        else TimingStats(
            median_ms=median,
            mean_ms=median,
            std_ms=0.0,
            min_ms=median * (1 - spread),
            max_ms=median * (1 + spread),
            p10_ms=median * (1 - spread),
            p90_ms=median * (1 + spread),
            iterations=100,
            warmup=10,
            clock="perf_counter",
            l2_flush=False,
        )
    )
    return EvalResult(
        status=Status.PASSED,
        correct=True,
        speedup=speedup,
        candidate_ms=median,
        reference_ms=1.0,
        device="fake",
        candidate_timing=stats,
    )


def fake_engine(calls):
    def evaluate(problem, text, on_stage, report_dir):
        calls.append(text)
        on_stage("correctness")
        value = eval(text.split("SPEEDUP = ")[1].splitlines()[0])
        spread = eval(text.split("SPREAD = ")[1].splitlines()[0])
        if value is None:
            return EvalResult(status=Status.INCORRECT, error_log="Outputs are not close")
        result = timed(value, spread)
        tag = eval(text.split("TAG = ")[1].splitlines()[0])
        if tag in ("timing_unstable", "faster_than_hardware"):  # the record withholds the figure
            result.metadata = {"guards": {"flags": {tag: "evidence"}}}
        return result

    return evaluate


PERF = json.dumps({"bottleneck": "b", "optimisation": "o", "expected_speedup": "2x"})
FAIL = json.dumps({"critical_issue": "i", "why_it_matters": "w", "minimal_fix_hint": "h"})


def forge(tmp_path, coder_answers, judge_answers, **cfg):
    coder, judge, calls = Scripted(coder_answers, "coder"), Scripted(judge_answers, "judge"), []
    rec = RunDir(tmp_path / "run", ADD_ONE, {})
    f = Forge(ADD_ONE, coder, judge, fake_engine(calls), LoopConfig(**cfg), device="cpu", recorder=rec)
    return f, coder, judge, calls


def test_a_regression_never_replaces_the_best(tmp_path):
    f, coder, _, _ = forge(
        tmp_path,
        [block(code(2.0)), block(code(1.2)), block(code(None)), block(code(2.5))],
        [PERF, PERF, FAIL],
        rounds=4,
    )
    state = f.run()
    assert [r.verdict for r in state.rounds] == ["passed", "passed", "incorrect", "passed"]
    assert [r.became_best for r in state.rounds] == [True, False, False, True]
    assert state.best.index == 3
    # after the regression the Coder is shown the best code, and told the attempt was not kept
    assert "SPEEDUP = 2.0" in coder.prompts[2]
    assert "passed but was not kept: 1.200x is not faster than the best (2.000x)" in coder.prompts[2]
    assert "SPEEDUP = None" in coder.prompts[3] and "ERROR LOG" in coder.prompts[3]  # repair of the failure
    assert (tmp_path / "run" / "best.py").read_text() == code(2.5)


def test_target_speedup_stops_early_and_skips_the_judge(tmp_path):
    f, _, judge, _ = forge(
        tmp_path, [block(code(1.1)), block(code(3.0)), block(code(4.0))], [PERF], rounds=10, target_speedup=2.5
    )
    state = f.run()
    assert len(state.rounds) == 2 and state.stop_reason == "target speedup 2.5x reached"
    assert len(judge.prompts) == 1


def test_a_withheld_figure_neither_becomes_the_best_nor_reaches_the_target(tmp_path):
    """Through the loop: 22x `timing_unstable` after a trusted 1.1x is not kept and stops nothing;
    the Coder is told why; a trusted 3.0x then is kept and reaches the target."""
    f, coder, _, _ = forge(
        tmp_path,
        [block(code(1.1)), block(code(22.0, tag="timing_unstable")), block(code(3.0)), block(code(4.0))],
        [PERF, PERF, PERF],
        rounds=10,
        target_speedup=2.5,
    )
    state = f.run()
    assert [r.became_best for r in state.rounds] == [True, False, True]
    assert state.stop_reason == "target speedup 2.5x reached" and state.best.index == 2
    assert "a figure not trusted (timing_unstable" in coder.prompts[2]
    assert read_summary(tmp_path / "run")["best"]["speedup_withheld_by"] == []


def test_a_run_whose_only_correct_figure_is_withheld_says_so(tmp_path):
    f, *_ = forge(tmp_path, [block(code(9.0, tag="faster_than_hardware"))], [PERF], rounds=1, target_speedup=2.0)
    state = f.run()
    assert state.best.index == 0 and state.stop_reason == "round limit (1) reached"  # no target reached
    best = read_summary(tmp_path / "run")["best"]
    assert best["speedup"] == 9.0 and best["speedup_withheld_by"] == ["faster_than_hardware"]


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
    # the best is kept, but the run stopped on an error: the summary says so (and the CLI exits 1)
    assert summary["state"] == "stopped" and summary["error"] == state.stop_reason and summary["best"]["round"] == 0
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


# ---- best-candidate selection: a new best must clear the noise --------------------------------


def test_a_new_best_must_beat_the_min_improvement_and_the_measured_spread():
    cfg = LoopConfig()  # min_improvement 2%, spread_factor 1
    best = timed(0.845, 0.10)
    # seen on the CPU: the same candidate measured 0.845x, then 0.951x; its runs spread +-10%
    won, why = improvement(timed(0.951, 0.10), best, cfg)
    assert not won and "within the measured timing spread" in why
    # 0.951 x (1/1.1) = 0.865 (new's slow end) < 0.845 x (1/0.9) = 0.939 (best's fast end): needs 0.845/0.9*1.1
    assert f"needs {0.845 / 0.9 * 1.1:.3f}x" in why
    assert improvement(timed(1.04, 0.10), best, cfg)[0]  # clears both bands
    # no timing statistics: only the minimum improvement applies
    assert not improvement(timed(2.03, None), timed(2.0, None), cfg)[0]
    assert "less than the 2% minimum" in improvement(timed(2.03, None), timed(2.0, None), cfg)[1]
    assert improvement(timed(2.05, None), timed(2.0, None), cfg)[0]
    # tight timings: the 2% floor decides
    assert improvement(timed(1.03, 0.001), timed(1.0, 0.001), cfg)[0]
    assert not improvement(timed(1.015, 0.001), timed(1.0, 0.001), cfg)[0]
    # configurable: no floor, no spread test -> any strictly faster candidate wins
    loose = LoopConfig(min_improvement=0.0, spread_factor=0.0)
    assert improvement(timed(0.951, 0.10), best, loose)[0]
    assert not improvement(timed(0.845, 0.10), best, loose)[0]  # an equal one never does
    # the first correct candidate is the best; an untimed pass never replaces a timed one
    assert improvement(timed(0.5, 0.5), None, cfg) == (True, "the first correct candidate")
    untimed = EvalResult(status=Status.PASSED, correct=True)
    assert not improvement(untimed, best, cfg)[0] and improvement(best, untimed, cfg)[0]


def test_a_withheld_speed_up_ranks_below_one_that_stands():
    """`faster_than_hardware` decides nothing: it counts as untimed. `timing_unstable` (on a machine
    loaded from outside a hostile candidate and an honest one alike swing 0.15x-22x, every one
    flagged) never replaces a figure that stands, and one that stands replaces it; two unstable
    figures meet the ordinary rule (on a shared CPU most figures are unstable)."""
    cfg = LoopConfig()

    def flagged(speedup: float, *names: str) -> EvalResult:
        r = timed(speedup, 0.01)
        r.metadata = {"guards": {"flags": {n: "evidence" for n in names}}}
        return r

    trusted = timed(1.5, 0.01)
    won, why = improvement(flagged(22.0, "timing_unstable"), trusted, cfg)
    assert not won and "not trusted (timing_unstable" in why and "best that stands (1.500x)" in why, why
    won, why = improvement(flagged(22.0, "faster_than_hardware"), trusted, cfg)
    assert not won and "faster than the hardware can go" in why, why
    won, why = improvement(trusted, flagged(22.0, "timing_unstable"), cfg)
    assert won and "(22.000x) was not trusted (timing_unstable)" in why, why
    won, why = improvement(trusted, flagged(22.0, "faster_than_hardware"), cfg)
    assert won and "faster than the hardware can go" in why, why
    # unstable against unstable: the ordinary rule on the figures
    assert improvement(flagged(3.0, "timing_unstable"), flagged(1.0, "timing_unstable"), cfg)[0]
    assert not improvement(flagged(1.0, "timing_unstable"), flagged(3.0, "timing_unstable"), cfg)[0]
    # an unstable figure beats one that decides nothing; two of those: the incumbent stays
    assert improvement(flagged(0.9, "timing_unstable"), flagged(9.0, "faster_than_hardware"), cfg)[0]
    assert not improvement(flagged(99.0, "faster_than_hardware"), flagged(9.0, "faster_than_hardware"), cfg)[0]
    assert improvement(flagged(0.3, "faster_than_hardware"), None, cfg)[0]  # still the first correct candidate
    # flags that say nothing against the figure leave the rule as it was
    assert improvement(flagged(2.0, "launch_bound", "autotuned", "borderline"), trusted, cfg)[0]
    assert flagged(2.0, "faster_than_hardware", "timing_unstable").speedup_withheld_by == [
        "timing_unstable",
        "faster_than_hardware",
    ]


def test_a_resubmitted_candidate_does_not_win_by_noise(tmp_path):
    f, coder, _, _ = forge(
        tmp_path,
        [block(code(0.845, 0.10)), block(code(0.951, 0.10, tag="same again")), block(code(1.2, 0.05))],
        [PERF, PERF],
        rounds=3,
    )
    state = f.run()
    assert [r.became_best for r in state.rounds] == [True, False, True]
    assert "passed but was not kept: 0.951x is within the measured timing spread" in coder.prompts[2]
    assert "SPEEDUP = 0.845" in coder.prompts[2]  # the Coder is shown the kept best
    rounds = read_summary(tmp_path / "run")["rounds"]
    assert "within the measured timing spread" in rounds[1]["best_decision"]
    assert rounds[2]["best_decision"].startswith("1.200x beats the best (0.845x) beyond the measured spread")


# ---- the Judge's expected speedup, checked by the next passing round --------------------------


def perf(expected, why="fewer passes"):
    return json.dumps({"bottleneck": "b", "optimisation": "fuse the passes", "expected_speedup": expected, "why": why})


def test_the_judges_expected_speedup_is_checked_and_fed_back(tmp_path):
    f, coder, judge, _ = forge(
        tmp_path,
        [block(code(1.0)), block(code(1.1)), block(code(None)), block(code(2.5)), block(code(2.4)), block(code(9.0))],
        [perf(2), perf("1.5x"), FAIL, perf(1.1), perf("several x")],
        rounds=6,
    )
    state = f.run()
    exp = [r.expectation for r in state.rounds]
    assert exp[0] is None  # nothing was expected of the first candidate
    # round 0's Judge expected 2x over round 0 (1.0x); round 1 measured 1.1x: missed
    assert (exp[1].judged_round, exp[1].baseline_round, exp[1].expected_speedup) == (0, 0, 2.0)
    assert exp[1].measured_over_baseline == pytest.approx(1.1) and exp[1].outcome == "missed" and exp[1].held is False
    # round 1's Judge expected 1.5x over round 1 (the new best, 1.1x); round 2 failed, so its repair measures it
    assert exp[2].outcome == "not_measured" and exp[2].held is None and exp[2].judged_round == 1
    assert exp[3].judged_round == 1 and exp[3].measured_round == 3
    assert exp[3].measured_over_baseline == pytest.approx(2.5 / 1.1) and exp[3].outcome == "exceeded" and exp[3].held
    # round 3's Judge expected 1.1x over round 3 (2.5x); round 4 measured 2.4x: regressed
    assert exp[4].outcome == "regressed" and exp[4].held is False and exp[4].baseline_round == 3
    # round 4's Judge reviewed the best (round 3) and gave no number: measured, but unrated
    assert exp[5].expected_speedup is None and exp[5].outcome == "unrated" and exp[5].held is None
    assert exp[5].measured_over_baseline == pytest.approx(9.0 / 2.5)
    # each Judge prompt after a measurement tells the Judge what it expected and what was measured
    assert "YOUR LAST EXPECTATION" not in judge.prompts[0]
    assert (
        "in round 0 you expected 2.00x over the round-0 candidate (1.000x); round 1 measured 1.10x over it "
        "(1.100x overall): missed."
    ) in judge.prompts[1]
    assert "YOUR LAST EXPECTATION" not in judge.prompts[2]  # the failure Judge of round 2
    assert (
        "in round 1 you expected 1.50x over the round-1 candidate (1.100x); round 3 measured 2.27x" in judge.prompts[3]
    )
    assert "round 4 measured 0.96x over it (2.400x overall): regressed" in judge.prompts[4]
    assert "- round 1: passed (1.100x, new best); in round 0 you expected 2.00x" in judge.prompts[4]
    assert "expected_speedup: 1.50x over this code (1.5x; fewer passes)" in coder.prompts[2]
    # the records: round.json and the summary's rounds list
    summary = read_summary(tmp_path / "run")
    rows = summary["rounds"]
    assert [r["expected_speedup"] for r in rows] == [None, 2.0, 1.5, 1.5, 1.1, None]
    assert [r["expectation_held"] for r in rows] == [None, False, None, True, False, None]
    assert [r["expectation_outcome"] for r in rows] == [
        None,
        "missed",
        "not_measured",
        "exceeded",
        "regressed",
        "unrated",
    ]
    assert rows[1]["speedup"] == 1.1 and rows[1]["measured_over_baseline"] == pytest.approx(1.1)
    record = json.loads((tmp_path / "run" / rows[3]["dir"] / "round.json").read_text())
    assert record["expectation"]["optimisation"] == "fuse the passes"
    assert record["expectation"]["expected_text"] == "1.5x; fewer passes"
    assert record["measured_over_baseline"] == pytest.approx(2.5 / 1.1) and record["expectation_held"] is True
    assert (
        json.loads((tmp_path / "run" / rows[0]["dir"] / "round.json").read_text())["critique"]["expected_speedup"]
        == 2.0
    )


def test_expectation_tolerance_decides_met():
    from kernelwright.loop.forge import Expectation, Round

    e = Expectation(
        judged_round=0, baseline_round=0, baseline_speedup=1.0, expected_speedup=1.5, expected_text="", optimisation="o"
    )
    passed = lambda i, s: Round(index=i, kind="optimise", result=timed(s, None))  # noqa: E731
    assert e.resolve(passed(1, 1.36), 0.1).outcome == "met"  # 1.36 >= 1.5 x 0.9
    assert e.resolve(passed(1, 1.34), 0.1).outcome == "missed"
    assert e.resolve(passed(1, 1.64), 0.1).outcome == "met"  # within 1.5 x 1.1
    assert e.resolve(passed(1, 1.66), 0.1).outcome == "exceeded"
    assert e.resolve(passed(1, 1.34), 0.2).outcome == "met"


# ---- the engine evaluator: each round's raw profile goes to its run folder --------------------


def test_engine_evaluator_sends_the_profile_report_to_the_round_folder(monkeypatch, tmp_path):
    import kernelwright.engine as engine

    seen = []
    monkeypatch.setattr(
        engine, "evaluate", lambda problem, cand, config, **kw: seen.append(config) or EvalResult(status=Status.PASSED)
    )
    on = EvalConfig(device="cpu", profile=ProfileConfig(enabled=True))
    engine_evaluator(on, warm=False)(ADD_ONE, "code", lambda s: None, tmp_path / "000_x" / "profile")
    engine_evaluator(on, warm=False)(ADD_ONE, "code", lambda s: None, None)
    engine_evaluator(EvalConfig(device="cpu"), warm=False)(ADD_ONE, "code", lambda s: None, tmp_path / "p")
    assert [c.profile.report_dir for c in seen] == [str(tmp_path / "000_x" / "profile"), "", ""]
    assert on.profile.report_dir == ""  # the run's config is not changed
    # through the loop: the evaluator gets <run>/<round folder>/profile
    dirs = []
    rec = RunDir(tmp_path / "run", ADD_ONE, {})
    f = Forge(
        ADD_ONE,
        Scripted([block(code(1.5))]),
        Scripted([]),
        lambda p, text, on_stage, report_dir: dirs.append(report_dir) or timed(1.5, None),
        LoopConfig(rounds=1),
        device="cpu",
        recorder=rec,
    )
    state = f.run()
    assert dirs == [tmp_path / "run" / RunDir.round_name(state.rounds[0]) / "profile"]


# ---- the keep rule and the round's line ---------------------------------------------------------


def run_with_console(f, rounds):
    """Run the loop with the live console on a buffer: (state, the printed round lines)."""
    buf = StringIO()
    with LoopProgress(Console(file=buf, width=300), rounds=rounds) as progress:
        f.on_progress = progress.update
        state = f.run()
    return state, [ln for ln in buf.getvalue().splitlines() if ln.startswith("round ")]


def test_the_same_code_every_round_leaves_round_0_the_best(tmp_path):
    """A Coder that answers the same code every round, timed faster each time (noise on a loaded
    machine): identical code never replaces the best, and the console line says why."""
    speedups = iter([1.0, 2.0, 4.0])

    def noisy(problem, text, on_stage, report_dir):
        return timed(next(speedups), None)

    same = block(code(1.0))
    coder, judge = Scripted([same] * 3, "coder"), Scripted([PERF, PERF], "judge")
    f = Forge(
        ADD_ONE, coder, judge, noisy, LoopConfig(rounds=3), device="cpu", recorder=RunDir(tmp_path / "run", ADD_ONE, {})
    )
    state, lines = run_with_console(f, rounds=3)
    assert [r.speedup for r in state.rounds] == [1.0, 2.0, 4.0]
    assert [r.became_best for r in state.rounds] == [True, False, False] and state.best.index == 0
    assert "the same code as round 0" in state.rounds[2].best_decision
    assert "new best: the first correct candidate" in lines[0]
    assert "kept round 0: the same code as round 0 (sha256 " in lines[1] and "best 1.000x" in lines[1]
    assert "kept round 0: the same code as round 0" in lines[2]
    assert (tmp_path / "run" / "best.py").read_text() == code(1.0)


def test_a_timing_rule_decision_is_on_the_round_line(tmp_path):
    f, *_ = forge(
        tmp_path,
        [block(code(2.0, 0.10)), block(code(2.1, 0.10, tag="b")), block(code(3.0, 0.01))],
        [PERF] * 2,
        rounds=3,
    )
    _, lines = run_with_console(f, rounds=3)
    assert "kept round 0: 2.100x is within the measured timing spread of the best (2.000x)" in lines[1]
    assert "new best: 3.000x beats the best (2.000x) beyond the measured spread" in lines[2]


def test_a_judge_failure_is_on_the_round_line(tmp_path):
    f, *_ = forge(tmp_path, [block(code(2.0)), block(code(None))], ["Sure! Here is my review: looks fast."], rounds=2)
    state, lines = run_with_console(f, rounds=2)
    assert state.rounds[0].judge_error
    assert "Judge failed: " in lines[0] and state.rounds[0].judge_error[:40] in lines[0]
