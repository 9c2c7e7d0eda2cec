"""Where a suite's wall goes, from its records: each stage's sum, each GPU's busy share from the
stages' wall-clock spans (two evaluations at once on one GPU count once), the builds' waits, the
records' latency; and a real evaluation's record carries the spans the accounting reads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import ADD_ONE, CANDIDATES
from kernelwright.cli.main import app
from kernelwright.suites.accounting import account, gpu_busy, stage_sums, union_s

T0 = 1_700_000_000.0  # seconds since the epoch: any fixed origin


def record(gpu: str | None, spans: dict[str, tuple[float, float]], written: float | None = None, **more) -> dict:
    """An eval.json as the engine writes it: stage seconds, and each stage's span from T0."""
    st = {f"{k}_s": b - a for k, (a, b) in spans.items() if k != "trusted_build"}
    st["total_s"] = max(b for _, b in spans.values()) - min(a for a, _ in spans.values())
    st["spans"] = {k: [T0 + a, T0 + b] for k, (a, b) in spans.items()}
    rec = {"status": "passed", "stage_times": st, "metadata": {"executor": {"gpu": gpu, **more}}}
    if written is not None:
        rec["_written"] = T0 + written
    return rec


def test_union_counts_overlaps_once_and_clips_to_the_window():
    assert union_s([[0, 4], [2, 6], [10, 11]]) == 7
    assert union_s([[0, 4], [2, 6]], lo=1, hi=3) == 2
    assert union_s([[5, 5], [3, 2]]) == 0  # empty and reversed spans add nothing


def test_busy_share_is_the_union_of_gpu_stages_per_gpu_over_the_wall():
    records = [
        # GPU 0: two evaluations whose correctness overlaps (4..6 and 5..8): busy 4..8 and 12..14
        record("0", {"startup": (0, 2), "build": (2, 4), "correctness": (4, 6), "timing": (6, 8)}),
        record("0", {"startup": (1, 3), "build": (3, 5), "correctness": (5, 8), "timing": (12, 14)}),
        # GPU 1: start-up and build only (a compile error): never busy
        record("1", {"startup": (0, 3), "build": (3, 9)}),
    ]
    busy = gpu_busy(records, T0, T0 + 20)
    assert busy["per_gpu"]["0"] == {"busy_s": 6.0, "share": 0.3}
    assert busy["per_gpu"]["1"] == {"busy_s": 0.0, "share": 0.0}
    assert busy["share"] == pytest.approx(0.15)


def test_every_draw_of_an_evaluation_counts_in_its_gpus_busy_share_and_the_suites_window():
    # --draws 3: the record is the median draw's (the third); the first two ran before it on the same GPU
    rec = record("0", {"startup": (20, 21), "correctness": (21, 23), "timing": (23, 25)})
    rec["metadata"]["draws"] = {
        "chosen": 3,
        "each": [
            {"spans": {"startup": [T0 + 0, T0 + 2], "correctness": [T0 + 2, T0 + 5], "timing": [T0 + 5, T0 + 8]}},
            {"spans": {"correctness": [T0 + 10, T0 + 12], "timing": [T0 + 12, T0 + 15]}},
            {"spans": rec["stage_times"]["spans"]},  # its own: counted once
            {"spans": {"timing": [T0 + 30, "x"]}},  # a sloppy entry: nothing
        ],
    }
    busy = gpu_busy([rec], T0, T0 + 25)
    assert busy["per_gpu"]["0"]["busy_s"] == 6.0 + 5.0 + 4.0
    from kernelwright.suites.accounting import suite_window

    assert suite_window([rec]) == (T0, T0 + 25)


def test_a_stage_outside_the_suites_window_does_not_count():
    # a record resumed from an earlier run: its spans lie before the suite began
    records = [record("0", {"correctness": (-100, -90)}), record("0", {"correctness": (0, 5)})]
    assert gpu_busy(records, T0, T0 + 10)["per_gpu"]["0"]["busy_s"] == 5.0


def test_a_sloppy_record_counts_for_what_it_holds():
    bad = {"status": "crashed", "stage_times": {"startup_s": 3.0, "spans": {"correctness": [5, "x"], "timing": [9]}}}
    none = {"status": "engine_error"}  # no stage times at all (an old record)
    good = record(None, {"correctness": (0, 2)})  # no GPU placed: GPU "0"
    acc = account([bad, none, good], wall_s=10.0, started_at=T0)
    assert acc["stage_sum_s"]["startup_s"] == 3.0 and acc["stage_sum_s"]["correctness_s"] == 2.0
    assert acc["gpu_busy"]["per_gpu"] == {"0": {"busy_s": 2.0, "share": 0.2}}
    assert acc["wall_per_problem_s"] == pytest.approx(10 / 3, abs=1e-3)


def test_account_sums_stages_waits_and_record_latency():
    records = [
        record(
            "0",
            {"trusted_build": (0, 3), "startup": (3, 4), "correctness": (4, 6), "timing": (6, 9)},
            written=9.5,
            prebuild={"ok": True, "waited_s": 2.0},
            gpu_waited_for_build_s=1.5,
        ),
        record("0", {"startup": (9, 10), "correctness": (10, 11)}, written=13.0, prebuild={"ok": True, "waited_s": 4}),
    ]
    records[1]["metadata"]["spare_wait_s"] = 0.5  # and it waited for its spare before its job went over
    acc = account(records, wall_s=20.0, started_at=T0)
    assert acc["problems"] == 2 and acc["wall_per_problem_s"] == 10.0
    assert stage_sums(records)["correctness_s"] == 3.0 and acc["stage_sum_s"]["timing_s"] == 3.0
    assert acc["gpu_busy"]["per_gpu"]["0"] == {"busy_s": 6.0, "share": 0.3}
    assert acc["builds_waited_for_a_builder_s"] == 6.0 and acc["builds_prebuilt"] == 2
    assert acc["gpu_waited_for_builds_s"] == 1.5
    assert acc["record_latency"] == {"sum_s": 2.5, "median_s": 1.25}
    # the start-up waited for: the spans (1 s each) and the wait for a spare, not the runner's import time
    assert acc["startup_on_path"] == {"sum_s": 2.5, "max_s": 1.5, "over_1s": 1}
    # without the suite's own wall: the window the records span (0..11)
    assert account(records)["wall_s"] == 11.0


def test_an_evaluations_record_carries_each_stages_wall_clock_span(cache_dir, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    args = ["eval", str(ADD_ONE), str(CANDIDATES / "py_correct.py"), "--device", "cpu", "--trials", "2", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    st = json.loads(out.stdout)["stage_times"]
    trusted = st["spans"].pop("trusted_build")  # the trusted builder's look at it, before the runner's job
    spans = st["spans"]
    assert list(spans) == ["startup", "build", "init", "correctness", "timing"]
    assert trusted[0] <= trusted[1] <= spans["startup"][0] + 0.01
    ordered = [t for s in spans.values() for t in s]
    assert ordered == sorted(ordered)  # each stage ends where the next begins
    assert spans["startup"][0] > T0 and spans["timing"][1] - spans["startup"][0] <= st["total_s"] + 0.01
    # the judge's seconds and the parent's spans tell of the same stages: correctness and timing together.
    # Where one ends and the other begins is each side's own (the judge opens its timing when its checks end,
    # the parent when the runner says so): a cold first evaluation read 1.44 + 0.78 s of span against the
    # judge's 0.19 + 2.03 s, the same 2.22 s
    both = sum(spans[k][1] - spans[k][0] for k in ("correctness", "timing"))
    assert both == pytest.approx(st["correctness_s"] + st["timing_s"], abs=1.0), (spans, st)
