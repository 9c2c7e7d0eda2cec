"""Suite metrics against values computed by hand (KernelBench's fast_p: correct AND speedup > p,
over ALL problems), degenerate references counted apart in either of their two spellings, and
kernels that hold at every size of the problem (size_robust) counted, with fast_p over them."""

from __future__ import annotations

import json
import math

import pytest

from kernelwright.core.record import EvalResult, Status
from kernelwright.store.indexer import degenerate
from kernelwright.store.queries import kept_facts
from kernelwright.suites.metrics import ProblemOutcome, fast_p, geomean, summarize


def outcomes() -> list[ProblemOutcome]:
    return [
        ProblemOutcome(
            "a",
            verdict="passed",
            correct=True,
            speedup=2.5,
            speedup_vs_compile=1.25,
            verdicts=["incorrect", "passed"],
            tokens=1000,
            cost_usd=0.10,
            wall_s=30.0,
        ),
        ProblemOutcome(
            "b",
            verdict="passed",
            correct=True,
            speedup=1.2,
            verdicts=["passed"],
            tokens=500,
            cost_usd=0.05,
            wall_s=10.0,
        ),
        ProblemOutcome(
            "c",
            verdict="passed",
            correct=True,
            speedup=0.5,
            speedup_vs_compile=0.2,
            verdicts=["passed", "passed"],
            tokens=700,
            cost_usd=0.02,
            wall_s=20.0,
        ),
        ProblemOutcome(
            "d", verdict="incorrect", verdicts=["incorrect", "compile_error"], tokens=300, cost_usd=0.03, wall_s=40.0
        ),
        ProblemOutcome(
            "e", verdict="passed", correct=True, speedup=1.5, verdicts=["passed"], tokens=0, cost_usd=0.0, wall_s=None
        ),
        # degenerate: fast and correct, but its reference is degenerate: in no rate, mean or denominator
        ProblemOutcome(
            "z",
            verdict="passed",
            correct=True,
            speedup=100.0,
            verdicts=["passed"],
            tokens=9999,
            cost_usd=9.0,
            wall_s=999.0,
            degenerate=True,
        ),
    ]


def test_fast_p_is_kernelbench_s_definition():
    counted = [o for o in outcomes() if not o.degenerate]
    # correct: a 2.5, b 1.2, c 0.5, e 1.5 (4 of 5); d incorrect
    assert fast_p(counted, 0) == pytest.approx(4 / 5)
    assert fast_p(counted, 1) == pytest.approx(3 / 5)  # 2.5, 1.2, 1.5
    assert fast_p(counted, 1.5) == pytest.approx(1 / 5)  # strictly faster: 1.5 itself does not count
    assert fast_p(counted, 2) == pytest.approx(1 / 5)
    assert fast_p(counted, 3) == 0.0
    assert fast_p([], 1) == 0.0
    # an incorrect kernel never counts, however fast it was measured
    assert fast_p([ProblemOutcome("w", verdict="incorrect", correct=False, speedup=9.0)], 0) == 0.0


def test_summary_against_hand_computed_values():
    m = summarize(outcomes())
    assert m.problems == 5 and m.degenerate == ["z"]
    assert m.correct == 4 and m.correctness_rate == pytest.approx(0.8)
    assert m.fast_p == pytest.approx({"0": 0.8, "1": 0.6, "1.5": 0.2, "2": 0.2})
    assert m.mean_speedup == pytest.approx((2.5 + 1.2 + 0.5 + 1.5) / 4)  # 1.425
    assert m.geomean_speedup == pytest.approx((2.5 * 1.2 * 0.5 * 1.5) ** 0.25)  # 2.25^(1/4) = 1.2247
    assert m.mean_speedup_vs_compile == pytest.approx(0.725)
    assert m.geomean_speedup_vs_compile == pytest.approx(0.5)  # sqrt(1.25 * 0.2)
    assert m.verdict_mix == {"passed": 4, "incorrect": 1}
    assert m.evaluation_mix == {"passed": 5, "incorrect": 2, "compile_error": 1}
    assert m.tokens_per_problem == pytest.approx(2500 / 5)
    assert m.cost_per_problem == pytest.approx(0.20 / 5)
    assert m.wall_s_per_problem == pytest.approx(25.0)  # the four with a wall time


def test_unknown_cost_and_empty_suites():
    o = outcomes()[:2]
    o[1].cost_usd = None  # a call with no known price: the cost is unknown, not zero
    assert summarize(o).cost_per_problem is None
    empty = summarize([])
    assert empty.problems == 0 and empty.correctness_rate == 0.0 and empty.mean_speedup is None
    assert geomean([]) is None and math.isclose(geomean([4.0, 1.0]), 2.0)


def test_untimed_correct_kernel_counts_for_fast_0_only():
    o = [ProblemOutcome("u", verdict="passed", correct=True, speedup=None)]
    assert fast_p(o, 0) == 1.0 and fast_p(o, 1) == 0.0
    assert summarize(o).mean_speedup is None


def test_a_withheld_speed_up_counts_as_untimed_and_is_named():
    """A correct kernel whose record withholds its speed-up (timing_unstable, faster_than_hardware)
    counts for fast_0 only and in no mean, as an untimed pass does; the summary names it."""
    forged = ProblemOutcome("f", verdict="passed", correct=True, speedup=22.0, speedup_withheld_by=["timing_unstable"])
    honest = ProblemOutcome("h", verdict="passed", correct=True, speedup=1.5, speedup_vs_compile=1.2)
    fast = ProblemOutcome("x", verdict="passed", correct=True, speedup=9.0, speedup_vs_compile=9.0)
    fast.speedup_withheld_by = ["faster_than_hardware"]
    m = summarize([forged, honest, fast])
    assert m.correct == 3 and m.fast_p == pytest.approx({"0": 1.0, "1": 1 / 3, "1.5": 0.0, "2": 0.0})
    assert m.mean_speedup == pytest.approx(1.5) and m.geomean_speedup == pytest.approx(1.5)
    assert m.mean_speedup_vs_compile == pytest.approx(1.2)
    assert m.speedups_withheld == ["f", "x"]
    assert summarize([honest]).speedups_withheld == []


@pytest.mark.parametrize(
    "record, flagged",
    [
        ({"metadata": {"guards": {"flags": {"degenerate_reference": True}}}}, True),
        ({"metadata": {"degenerate_reference": {"reason": "output is constant"}}}, True),
        ({"metadata": {"guards": {"flags": {"degenerate_reference": False, "no_custom_kernel": True}}}}, False),
        ({"metadata": {"guards": {"flags": {}}}}, False),
        ({"metadata": {}}, False),
        ({}, False),
    ],
)
def test_degenerate_flag_in_either_spelling(record, flagged):
    assert degenerate(EvalResult.from_dict({"status": "passed", **record})) is flagged


# ---- kernels that hold at every size of the problem (the shapes check) -----------------------------


def sized() -> list[ProblemOutcome]:
    return [
        ProblemOutcome("robust", verdict="passed", correct=True, speedup=1.8, size_robust=True),
        ProblemOutcome(
            "specific", verdict="passed", correct=True, speedup=3.0, size_robust=False, sizes_failed=["dim=1023"]
        ),
        ProblemOutcome("unchecked", verdict="passed", correct=True, speedup=1.2, size_robust=None),
        ProblemOutcome("wrong", verdict="incorrect", correct=False, speedup=None),
        ProblemOutcome("robust_slow", verdict="passed", correct=True, speedup=0.7, size_robust=True),
    ]


def test_size_robust_kernels_are_counted_and_fast_p_over_them_keeps_every_problem_in_the_denominator():
    m = summarize(sized())
    assert (m.correct, m.size_robust, m.size_specific, m.size_unchecked) == (4, 2, 1, 1)
    # KernelBench's fast_p is unchanged: every correct kernel counts
    assert m.fast_p == pytest.approx({"0": 4 / 5, "1": 3 / 5, "1.5": 2 / 5, "2": 1 / 5})
    # over size-robust kernels only (robust 1.8x, robust_slow 0.7x), still out of all five problems
    assert m.fast_p_size_robust == pytest.approx({"0": 2 / 5, "1": 1 / 5, "1.5": 1 / 5, "2": 0.0})
    assert fast_p(sized(), 2, size_robust=True) == 0.0 and fast_p(sized(), 2) == pytest.approx(1 / 5)
    assert m.to_dict()["fast_p_size_robust"]["1"] == pytest.approx(1 / 5)


def test_an_incorrect_kernel_never_counts_as_size_robust():
    """A record that says robust on a problem with no correct kernel counts for nothing."""
    o = [ProblemOutcome("w", verdict="incorrect", correct=False, speedup=5.0, size_robust=True)]
    m = summarize(o)
    assert (m.size_robust, m.size_specific, m.size_unchecked) == (0, 0, 0)
    assert m.fast_p_size_robust["0"] == 0.0


def _passed(shapes: dict | None, flags: dict | None = None, status: Status = Status.PASSED) -> EvalResult:
    meta: dict = {"guards": {"flags": flags or {}}}
    if shapes is not None:
        meta["shapes"] = shapes
    return EvalResult(status=status, correct=status is Status.PASSED, speedup=1.5, metadata=meta)


def _tried(*outcomes: bool | None) -> list[dict]:
    return [{"name": f"dim={1000 + i}", "sizes": {"dim": 1000 + i}, "passed": p} for i, p in enumerate(outcomes)]


@pytest.mark.parametrize(
    "result, robust, failed",
    [
        (_passed({"mode": "check", "tried": _tried(True, True), "failed": []}), True, []),
        (
            _passed(
                {"mode": "check", "tried": _tried(True, False), "failed": ["dim=1001"]},
                {"shape_specific": "ModelNew is correct at the problem's own sizes (dim=1024) but not at dim=1001"},
            ),
            False,
            ["dim=1001"],
        ),
        (_passed({"mode": "off"}), None, []),  # --shapes off
        (_passed(None), None, []),  # a record from before the check, or a candidate stopped by a guard
        (_passed({"mode": "check", "tried": [], "note": "no integer read: sizes written as literals"}), None, []),
        (_passed({"mode": "check", "note": "the other sizes could not be derived: ValueError"}), None, []),
        (_passed({"mode": "check", "tried": _tried(True, None), "failed": []}), None, []),  # a size not run
        # --shapes strict: the failure is the verdict, and an incorrect kernel is not judged at other sizes
        (
            _passed({"mode": "strict", "tried": _tried(False), "failed": ["dim=1000"]}, status=Status.INCORRECT),
            None,
            ["dim=1000"],
        ),
    ],
)
def test_a_record_says_whether_its_kernel_holds_at_every_size(result, robust, failed):
    assert result.size_robust is robust and result.sizes_failed == failed
    # the same answer from the stored (JSON) record, as the store reads it
    assert kept_facts(json.loads(result.to_json())) == (robust, failed, [])


def test_a_stored_record_that_does_not_load_is_not_known():
    assert kept_facts(None) == (None, [], [])
    assert kept_facts({"status": "passed", "correct": True, "no_such_field": 1}) == (None, [], [])
