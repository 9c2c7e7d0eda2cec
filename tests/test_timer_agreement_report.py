"""benchmarks/timer_agreement.py's report: kernelwright's speed-up over each independent timer's, per
candidate once, and on the pairs whose two independent timers agree with each other (where they do
not, neither is the pair's speed-up, and a disagreement with one of them says little)."""

from __future__ import annotations

import json

from benchmarks import timer_agreement


def _side(do_bench_ms: float, b2b_ms: float) -> dict:
    return {"do_bench_ms": do_bench_ms, "b2b_ms": b2b_ms, "events_ms": do_bench_ms}


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
    (tmp_path / "independent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in independent))
    runs = {
        "r1": [_kw("a", 2.0), _kw("b", 1.0, ("launch_bound",)), _kw("c", 0.5)],
        "r2": [_kw("a", 2.2, ("autotuned",)), _kw("b", 1.0)],
    }
    for name, rows in runs.items():
        (tmp_path / f"kw-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

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
    # a turned on cuDNN's autotuner in one run: the run-to-run figure without it is b's alone
    assert result["run_to_run"]["no autotuned flag"] == {"n": 1, "median": 0.0, "p90": 0.0}
    assert "Passed in any run, by level" in (tmp_path / "agreement.md").read_text()
    text = (tmp_path / "agreement.md").read_text()
    assert f"| do_bench | {timer_agreement.AGREE} | 2 |" in text


def _window(copy_in: float, measured_copy_in: float, stage_copy_in: float) -> dict:
    """A device-clock window of 17 calls (level1/46's figures, H200, 2026-11-29): the runner's part,
    the snapshot and the commit as recorded, and the copy in, the judge's own measure of it just
    before, and what came off for it (the stage's smallest measure)."""
    return {
        "calls": 17,
        "device_ms": {
            "copy_in": copy_in,
            "runner": 6.6484,
            "snapshot": 0.5401,
            "measured": {"copy_in": measured_copy_in, "snapshot": 0.6067, "commit": 0.7139},
            "off": {"copy_in": stage_copy_in, "snapshot": 0.5401, "commit_and_switch": 0.9337},
        },
    }


def test_the_diagnostic_takes_off_each_windows_own_copy_in_measure_within_its_cap():
    def kw(*windows: dict) -> dict:
        return dict(_kw("p", 1.467), timing={"windows": list(windows)})

    # what the record did: 4.3148 ms off a copy in of 4.8177 (0.3657 ms a call); the window's own
    # measure, 4.8151, leaves 0.3363 ms a call, do_bench's 0.3356
    got = timer_agreement.own_copy_in_speedup(kw(_window(4.8177, 4.8151, 4.3148)))
    assert abs(got - 1.467 * 0.36574 / 0.33631) < 2e-3
    # an own measure far above the stage's smallest comes off at most 1.25x that smallest
    capped = timer_agreement.own_copy_in_speedup(kw(_window(9.0, 9.0, 4.0)))
    span = 9.0 + 6.6484 + 0.5401
    assert abs(capped - 1.467 * (span - 4.0 - 0.5401 - 0.9337) / (span - 5.0 - 0.5401 - 0.9337)) < 1e-9
    # never more than the phase took; nothing to say without device-clock windows
    same = timer_agreement.own_copy_in_speedup(kw(_window(4.0, 4.9, 4.0)))
    assert abs(same - 1.467) < 1e-9
    assert timer_agreement.own_copy_in_speedup(_kw("p", 2.0)) is None
