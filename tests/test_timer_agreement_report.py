"""benchmarks/timer_agreement.py's report: kernelwright's speed-up over each independent timer's, per
candidate once, and on the pairs whose two independent timers agree with each other (where they do
not, neither is the pair's speed-up, and a disagreement with one of them says little)."""

from __future__ import annotations

import json

import pytest

from benchmarks import timer_agreement
from kernelwright.suites.accounting import union_s


def _side(do_bench_ms: float, b2b_ms: float) -> dict:
    return {"do_bench_ms": do_bench_ms, "b2b_ms": b2b_ms, "events_ms": do_bench_ms}


def _timed(do_bench_ms: float, cupti_ms: float) -> dict:
    """A side whose do_bench and back-to-back figures agree, with the profiler's busy time beside them."""
    return dict(_side(do_bench_ms, do_bench_ms), cupti_ms=cupti_ms)


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _kw(pair: str, speedup: float, flags: tuple[str, ...] = ()) -> dict:
    return {
        "pair": pair,
        "status": "passed",
        "speedup": speedup,
        "speedup_as_launched": speedup,
        "reference_ms": 1.0,
        "candidate_ms": 1.0 / speedup,
        "flags": list(flags),
    }


def test_the_report_splits_out_the_pairs_whose_independent_timers_agree(tmp_path):
    independent = [
        # do_bench 2.0x, back-to-back 2.1x: they agree; kernelwright 2.0x
        {"pair": "a", "reference": _side(1.0, 1.05), "candidate": _side(0.5, 0.5)},
        # do_bench 4.0x, back-to-back 1.0x (a host-bound 20 us reference): they disagree; kernelwright 1.0x
        {"pair": "b", "reference": _side(0.02, 0.01), "candidate": _side(0.005, 0.01)},
        # they agree at 1.0x, and kernelwright reads 0.5x: the one miss where the speed-up is not in doubt
        {"pair": "c", "reference": _side(0.5, 0.5), "candidate": _side(0.5, 0.5)},
        # a side that failed: no row anywhere
        {"pair": "d", "reference": {"error": "x"}, "candidate": _side(1.0, 1.0)},
    ]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    runs = {
        "r1": [_kw("a", 2.0), _kw("b", 1.0, ("launch_bound",)), _kw("c", 0.5)],
        "r2": [_kw("a", 2.2, ("autotuned",)), _kw("b", 1.0)],
    }
    for name, rows in runs.items():
        _write_jsonl(tmp_path / f"kw-{name}.jsonl", rows)

    result = timer_agreement.report(tmp_path, list(runs))

    pooled = result["pooled"]
    everything = pooled["do_bench:all"]
    assert everything["n"] == 3 and everything["beyond_25pct"] == 2  # b (4x against 1x) and c
    agree = pooled[f"do_bench:{timer_agreement.AGREE}"]
    assert agree["n"] == 2  # a and c; b's timers disagree
    assert agree["within_10pct"] == 1 and agree["beyond_25pct"] == 1  # a (the median of 2.0x, 2.2x: 2.1x) and c
    # a (2.0x, 2.2x: 10%) and b (1.0x twice: 0%) passed in both runs
    assert result["run_to_run"]["all"]["n"] == 2 and abs(result["run_to_run"]["all"]["p90"] - 0.1) < 1e-9
    # b is flagged launch_bound in one of its runs: out of the unflagged group, which keeps a and c
    assert pooled[f"do_bench:{timer_agreement.UNFLAGGED}"]["n"] == 2
    # beyond 25%: b says why (launch_bound in r1), c says nothing
    assert result["beyond_25pct_unexplained"] == ["c"]
    assert (
        "with no flag that says why (autotuned, launch_bound, self_timed, timing_unstable in any run): 1 (c)"
        in (tmp_path / "agreement.md").read_text()
    )
    # a turned on cuDNN's autotuner in one run: the run-to-run figure without it is b's alone
    assert result["run_to_run"]["no autotuned flag"] == {"n": 1, "median": 0.0, "p90": 0.0}
    # trusted in both runs: a and b; without autotuned or launch_bound in any run: neither
    assert result["run_to_run"]["trusted in every run"]["n"] == 2
    assert "trusted, no autotuned or launch_bound flag" not in result["run_to_run"]
    assert "Passed in any run, by level" in (tmp_path / "agreement.md").read_text()
    text = (tmp_path / "agreement.md").read_text()
    assert f"| do_bench | {timer_agreement.AGREE} | 2 |" in text


def test_the_diagnostic_takes_the_quicker_half_of_each_sides_windows():
    # level2/6_task of CUDA-L1, run b2 (2 x H200, 2026-11-29): a third process on the GPU slowed four
    # of the reference's five windows and two of the candidate's; the record's medians read 1.242x,
    # the other two runs 1.132x and 1.135x, do_bench 1.132x
    ref = [0.853212, 0.891668, 1.376458, 0.950224, 0.957568]
    cand = [0.76181, 0.743678, 0.84459, 0.78128, 0.764942]
    disturbed = dict(
        _kw("p", 1.242),
        timing={
            "windows": [{"calls": 16, "reference_ms": r, "candidate_ms": c} for r, c in zip(ref, cand, strict=True)]
        },
    )
    got = timer_agreement.quicker_half_speedup(disturbed)
    assert abs(got - (0.853212 + 0.891668) / (0.743678 + 0.76181)) < 1e-9
    assert abs(got / 1.132 - 1) < 0.03
    # an odd count keeps the quicker half (two of five); nothing to say without windows
    assert timer_agreement.quicker_half_speedup(_kw("p", 2.0)) is None
    one = dict(_kw("p", 2.0), timing={"windows": [{"calls": 1, "reference_ms": 2.0, "candidate_ms": 1.0}]})
    assert timer_agreement.quicker_half_speedup(one) == 2.0


def test_the_profilers_busy_time_counts_overlapping_activities_once_and_gaps_not_at_all():
    assert union_s([]) == 0.0
    # two streams overlap over 5-10: 0-15 is busy once; 20-22 after a gap; 21-21.5 inside it counts nothing
    assert union_s([[5.0, 15.0], [0.0, 10.0], [20.0, 22.0], [21.0, 21.5]]) == 17.0
    # one activity inside another, then one that starts where the first ends
    assert union_s([[0.0, 10.0], [2.0, 3.0], [10.0, 12.0]]) == 12.0


def test_each_sides_time_is_compared_with_the_profilers_as_milliseconds(tmp_path):
    # p: a 10 us reference kernelwright reads right (10.2 us) and a candidate it reads 1.5x the device's
    # busy time (idle gaps between its kernels); q: a 1 ms pair both read alike; r: no cupti figure
    ref_p = dict(_side(0.016, 0.03), cupti_ms=0.010)
    cand_p = dict(_side(0.012, 0.03), cupti_ms=0.004)
    independent = [
        {"pair": "p", "reference": ref_p, "candidate": cand_p},
        {"pair": "q", "reference": _timed(1.0, 1.0), "candidate": _timed(1.0, 1.0)},
        {"pair": "r", "reference": _side(1.0, 1.0), "candidate": _side(1.0, 1.0)},
    ]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    rows = [
        dict(_kw("p", 0.0102 / 0.006), reference_ms=0.0102, candidate_ms=0.006),
        dict(_kw("q", 1.0), reference_ms=1.01, candidate_ms=0.99),
        _kw("r", 1.0),
    ]
    _write_jsonl(tmp_path / "kw-r1.jsonl", rows)

    result = timer_agreement.report(tmp_path, ["r1"])

    sides = result["side_ms_over_cupti"]
    assert sides["reference:all"]["n"] == 2 and sides["reference:all"]["within_5pct"] == 2
    assert sides["candidate:all"]["n"] == 2 and sides["candidate:all"]["beyond_25pct"] == 1  # p's 1.5x
    assert sides[f"candidate:under {timer_agreement.SMALL_MS} ms"]["range"] == [1.5, 1.5]
    # the speed-up against cupti: p 1.7x against 2.5x, q 1.02x against 1.0x; r has none
    assert result["pooled"]["cupti:all"]["n"] == 2
    text = (tmp_path / "agreement.md").read_text()
    assert "| p | 0.0102/0.016/0.03/0.01 |" in text and "| 2.500 |" in text


@pytest.mark.gpu
def test_a_side_on_a_gpu_gets_the_profilers_busy_time_beside_the_other_timers():
    from tests.conftest import ADD_ONE

    row = timer_agreement.time_side(ADD_ONE, ADD_ONE, "Model", "cuda")
    assert "cupti_error" not in row, row
    # relu, then the addition: at least one device activity a call, each call's busy time positive
    assert row["cupti_activities"] >= 1 and row["cupti_ms"] > 0, row
    assert {"do_bench_ms", "b2b_ms", "events_ms"} <= set(row)


def test_do_bench_less_its_own_floor_is_reported_where_the_floor_was_measured(tmp_path):
    # a 3 us kernel against a 6 us one, read by do_bench at 6 us and 9 us (its floor adds 3 us to each);
    # kernelwright reads 0.5x, do_bench 0.667x, do_bench less the 3 us tare 0.5x
    independent = [{"pair": "s", "reference": _side(0.006, 0.02), "candidate": _side(0.009, 0.02)}]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    (tmp_path / "kw-r1.jsonl").write_text(json.dumps(dict(_kw("s", 0.5), reference_ms=0.003, candidate_ms=0.006)))
    floor = {
        "device": "GPU",
        "do_bench_floor_ms": 0.0045,
        "floor_range_ms": [0.0044, 0.0047],
        "tiny_kernel_ms": 0.0015,
        "tare_ms": 0.003,
    }
    (tmp_path / "floor.json").write_text(json.dumps(floor))

    result = timer_agreement.report(tmp_path, ["r1"])

    assert result["pooled"]["do_bench:all"]["range"] == [0.75, 0.75]
    tared = result["pooled"][f"{timer_agreement.TARED}:all"]
    assert tared["n"] == 1 and abs(tared["range"][0] - 1.0) < 1e-9
    assert "takes 3.00 us off each side's do_bench figure" in (tmp_path / "agreement.md").read_text()
    # never below a hundredth of the reading: a tare larger than a side's figure leaves it positive
    rows = {"t": {"reference": {"do_bench_ms": 0.002}, "candidate": {"error": "x"}}}
    timer_agreement.with_tared(rows, floor)
    assert rows["t"]["reference"][f"{timer_agreement.TARED}_ms"] == 0.002 / 100


def test_a_side_read_slower_than_both_independent_timers_is_listed_slowest_first(tmp_path):
    # a: its candidate 8% over both (the runner's start-up, before 2026-11-30); b: its reference 5% over
    # both; c: 8% over cupti but within do_bench (timers disagree: not listed); d: a 50 us problem 40% over
    # (small problems: the timers measure other quantities, not listed)
    independent = [
        {"pair": "a", "reference": _timed(1.82, 1.82), "candidate": _timed(1.317, 1.317)},
        {"pair": "b", "reference": _timed(1.182, 1.175), "candidate": _timed(0.314, 0.303)},
        {"pair": "c", "reference": _timed(1.0, 1.0), "candidate": _timed(0.54, 0.50)},
        {"pair": "d", "reference": _timed(0.05, 0.04), "candidate": _timed(0.02, 0.02)},
    ]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    rows = [
        dict(_kw("a", 1.28), reference_ms=1.822, candidate_ms=1.42),
        dict(_kw("b", 3.9), reference_ms=1.236, candidate_ms=0.316),
        dict(_kw("c", 1.85), reference_ms=1.0, candidate_ms=0.54),
        dict(_kw("d", 2.5), reference_ms=0.07, candidate_ms=0.028),
    ]
    _write_jsonl(tmp_path / "kw-r1.jsonl", rows)

    result = timer_agreement.report(tmp_path, ["r1"])

    assert [(r["pair"], r["side"]) for r in result["slow_sides"]] == [("a", "candidate"), ("b", "reference")]
    assert result["slow_sides"][0]["over"] == pytest.approx(1.42 / 1.317 - 1, abs=1e-4)
    text = (tmp_path / "agreement.md").read_text()
    assert "- a candidate: 1.42 ms against 1.317 and 1.317 (+7.8%)" in text


def test_the_trusted_group_leaves_out_speed_ups_the_record_does_not_trust(tmp_path):
    # CUDA-L1's level2/83 (Conv3d ... Dropout, a constant output): 22107x, do_bench 271x; its reference is
    # degenerate, so no trusted figure, and its 81x disagreement is no timer's. b is withheld in one run
    # (timing_unstable); c is trusted in both runs
    independent = [
        {"pair": p, "reference": _side(1.0, 1.0), "candidate": _side(c, c)}
        for p, c in (("a", 1 / 271), ("b", 0.5), ("c", 0.5))
    ]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    runs = {
        "r1": [
            _kw("a", 22107.0, ("degenerate_reference", "faster_than_hardware")),
            _kw("b", 2.0),
            _kw("c", 2.0),
        ],
        "r2": [_kw("b", 3.2, ("timing_unstable",)), _kw("c", 2.04)],
    }
    for name, rows in runs.items():
        _write_jsonl(tmp_path / f"kw-{name}.jsonl", rows)

    pooled = timer_agreement.report(tmp_path, list(runs))["pooled"]

    # beyond 25%: a, and b (the median of 2x and 3.2x: 1.3x do_bench's)
    assert pooled["do_bench:all"]["n"] == 3 and pooled["do_bench:all"]["beyond_25pct"] == 2
    trusted = pooled[f"do_bench:{timer_agreement.TRUSTED}"]
    assert trusted["n"] == 1 and trusted["within_5pct"] == 1  # c alone


def test_the_device_timers_agree_group_holds_trusted_pairs_whose_do_bench_and_cupti_agree(tmp_path):
    # CUDA-L1's level2/28 (a fused BMM epilogue, 25 us): do_bench 4.30x, cupti 1.16x; no one figure is within
    # 10% of both, so it is left out. b: both timers near 2x; c: the same, but withheld in its run
    independent = [
        {"pair": "a", "reference": _timed(0.1135, 0.0179), "candidate": _timed(0.0264, 0.0155)},
        {"pair": "b", "reference": _timed(1.0, 0.98), "candidate": _timed(0.5, 0.5)},
        {"pair": "c", "reference": _timed(1.0, 1.0), "candidate": _timed(0.5, 0.5)},
    ]
    _write_jsonl(tmp_path / "independent.jsonl", independent)
    rows = [_kw("a", 1.12, ("launch_bound",)), _kw("b", 2.0), _kw("c", 2.0, ("timing_unstable",))]
    _write_jsonl(tmp_path / "kw-r1.jsonl", rows)

    pooled = timer_agreement.report(tmp_path, ["r1"])["pooled"]

    assert pooled[f"cupti:{timer_agreement.TRUSTED}"]["n"] == 2  # a and b
    agree = pooled[f"cupti:{timer_agreement.DEVICE_AGREE}"]
    assert agree["n"] == 1 and agree["within_5pct"] == 1  # b alone
    assert pooled[f"do_bench:{timer_agreement.DEVICE_AGREE}"]["n"] == 1


def test_run_to_run_of_trusted_speedups_leaves_out_a_constant_outputs_reference(tmp_path):
    # CUDA-L1's level2/83 on 2 x H200 (2026-11-30): its reference's output is constant, the candidate
    # returns it without work, and its speed-up read 22107x, 80075x and 9996x in three suite runs
    _write_jsonl(
        tmp_path / "independent.jsonl",
        [
            {"pair": "const", "reference": _side(0.8, 0.8), "candidate": _side(0.003, 0.003)},
            {"pair": "gemm", "reference": _side(1.0, 1.0), "candidate": _side(0.5, 0.5)},
        ],
    )
    for name, (const, gemm) in {"r1": (22107.0, 2.0), "r2": (80075.0, 2.04), "r3": (9996.0, 1.98)}.items():
        _write_jsonl(
            tmp_path / f"kw-{name}.jsonl",
            [_kw("const", const, ("degenerate_reference", "launch_bound")), _kw("gemm", gemm)],
        )

    result = timer_agreement.report(tmp_path, ["r1", "r2", "r3"])

    assert result["run_to_run"]["all"]["n"] == 2 and result["run_to_run"]["all"]["p90"] > 7
    trusted = result["run_to_run"]["trusted in every run"]
    assert trusted["n"] == 1 and abs(trusted["p90"] - (2.04 / 1.98 - 1)) < 1e-4
    assert result["run_to_run"]["trusted, no autotuned or launch_bound flag"]["n"] == 1
