"""benchmarks/placement_spread.py: each side's `do_bench` over several address layouts, and whether
kernelwright's speed-up lies within the independent timer's own spread. The fixtures are shaped as
the 2 x H200 draws read (level2/61's reference 0.283-0.340 ms by layout, level1/77's candidate
1.30-1.42 ms)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import placement_spread as ps
from benchmarks import timer_agreement

ROOT = Path(__file__).resolve().parent.parent


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _kw(pair: str, speedup: float, flags: tuple[str, ...] = ()) -> dict:
    return {"pair": pair, "status": "passed", "speedup": speedup, "flags": list(flags)}


def _ind(pair: str, ref_ms: float, cand_ms: float) -> dict:
    return {"pair": pair, "reference": {"do_bench_ms": ref_ms}, "candidate": {"do_bench_ms": cand_ms}}


def _placed(pair: str, refs: list[float], cands: list[float | None]) -> list[dict]:
    """The draws of every placement but `plain` (independent.jsonl's plain draw stands in)."""
    rows = []
    for placement, r, c in zip(ps.PLACEMENTS[1:], refs, cands, strict=True):
        cand = {"do_bench_ms": c} if c else {"error": "RuntimeError: CUDA error: out of memory"}
        rows.append({"pair": pair, "placement": placement, "reference": {"do_bench_ms": r}, "candidate": cand})
    return rows


@pytest.fixture
def corpus_dir(tmp_path):
    _write_jsonl(
        tmp_path / "independent.jsonl",
        [
            # the reference moved by layout: plain 0.287, then 0.283 / 0.340 / 0.339; the candidate steady
            _ind("level2/61", 0.287, 0.182),
            # both steady at 1.0x; kernelwright reads 1.5x: outside every draw
            _ind("level1/19", 0.5, 0.5),
            # the candidate moved by layout (1.30 plain, 1.42 with 64 MiB of address space reserved first)
            _ind("level1/77", 1.82, 1.30),
            # a candidate whose placement draws all failed: one draw of it, no range
            _ind("level1/5", 1.0, 0.5),
        ],
    )
    _write_jsonl(
        tmp_path / "placements.jsonl",
        [
            *_placed("level2/61", [0.283, 0.340, 0.339], [0.182, 0.183, 0.182]),
            *_placed("level1/19", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
            *_placed("level1/77", [1.82, 1.83, 1.82], [1.30, 1.42, 1.41]),
            *_placed("level1/5", [1.0, 1.0, 1.0], [None, None, None]),
            # this run's own plain draw of level1/19, on its machine: it, not independent.jsonl's, is the plain one
            {
                "pair": "level1/19",
                "placement": "plain",
                "reference": {"do_bench_ms": 0.6},
                "candidate": {"do_bench_ms": 0.5},
            },
        ],
    )
    _write_jsonl(
        tmp_path / "kw-r1.jsonl",
        [
            _kw("level2/61", 1.79),
            _kw("level1/19", 1.5),
            _kw("level1/77", 1.29, ("autotuned",)),
            _kw("level1/5", 2.0),
        ],
    )
    _write_jsonl(tmp_path / "kw-r2.jsonl", [_kw("level2/61", 1.77), _kw("level1/77", 1.31, ("autotuned",))])
    return tmp_path


def test_a_speedup_within_the_independent_draws_counts_as_within_range_and_one_outside_does_not(corpus_dir):
    result = ps.report(corpus_dir, ["r1", "r2"])
    rows = {r["pair"]: r for r in result["pairs"]}

    # level2/61: the reference's draws 0.283-0.340 over the candidate's 0.182-0.183; kernelwright's 1.78 lies inside
    r61 = rows["level2/61"]
    assert r61["range"] == pytest.approx([0.283 / 0.183, 0.340 / 0.182])
    assert r61["speedup"] == pytest.approx(statistics.median([0.287, 0.283, 0.340, 0.339]) / 0.182)
    assert r61["kw"] == pytest.approx(1.78) and r61["within_range"]
    # the plain draw alone reads 1.577x: kernelwright 13% over it, 3% under the draws' median
    assert r61["kw"] / r61["plain"] > 1.1 and abs(r61["kw"] / r61["speedup"] - 1) < 0.05
    # level1/19: 1.5x against 1.0-1.2x is outside, whatever the layout; its plain draw is this run's (1.2x)
    assert not rows["level1/19"]["within_range"]
    assert rows["level1/19"]["plain"] == pytest.approx(1.2) and rows["level1/19"]["range"] == pytest.approx([1.0, 1.2])
    # level1/77: the candidate's draws spread 9%; kernelwright's 1.30x lies within 1.28-1.40
    assert rows["level1/77"]["within_range"]
    assert rows["level1/77"]["spread"]["candidate"] == pytest.approx(1.42 / 1.30 - 1)
    # a pair whose candidate has one draw only has no range and is left out, not read as agreeing
    assert "level1/5" not in rows


def test_the_sides_moved_by_layout_are_named_and_the_groups_count_what_lies_in_range(corpus_dir):
    result = ps.report(corpus_dir, ["r1", "r2"])

    moved = {(m["pair"], m["side"]) for m in result["moved_sides"]}
    # level1/19's reference read 0.6 ms in this run's plain draw and 0.5 in every other: moved 20% too
    assert moved == {("level2/61", "reference"), ("level1/77", "candidate"), ("level1/19", "reference")}
    trusted = result["groups"]["trusted:speedup"]
    assert trusted["n"] == 3 and trusted["in_range"] == 2
    plain = result["groups"]["trusted:plain"]
    # against the plain draws alone, level2/61 is 13% off; against the draws' median, 3%
    assert plain["within_10pct"] == 1 and trusted["within_10pct"] == 2
    text = (corpus_dir / "placements.md").read_text()
    assert "Sides whose draws spread over 5%: 3 of 6" in text


def test_a_placement_is_refused_by_name_and_off_a_gpu():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="unknown placement 'shift_3mb'"):
        timer_agreement.hold("shift_3mb", torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        timer_agreement.hold("va_64mb", torch.device("cpu"))


def test_a_run_off_a_gpu_is_refused_in_one_line_before_anything_is_timed(tmp_path):
    (tmp_path / "independent.jsonl").write_text("")
    cmd = [sys.executable, "benchmarks/placement_spread.py", "run", str(tmp_path), "--device", "cpu"]
    p = subprocess.run(
        [*cmd, "--pairs-from", str(tmp_path / "independent.jsonl"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2 and not (tmp_path / "o").exists()
    assert p.stderr.strip() == "placement_spread: --device cpu: the placements are a GPU's; run it on one"


def test_the_report_names_what_its_folder_lacks_in_one_line(tmp_path):
    p = subprocess.run(
        [sys.executable, "benchmarks/placement_spread.py", "report", str(tmp_path), "--name", "b1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == f"placement_spread: {tmp_path} lacks independent.jsonl, placements.jsonl, kw-b1.jsonl"


@pytest.mark.gpu
def test_a_side_timed_under_each_placement_on_a_gpu_reads_a_positive_figure_and_where_its_hold_lies_if_it_took_one():
    from benchmarks import timer_agreement
    from tests.conftest import ADD_ONE

    for placement in ps.PLACEMENTS:
        row = timer_agreement.time_side(ADD_ONE, ADD_ONE, "Model", "cuda", placement=placement)
        assert row["placement"] == placement and row["do_bench_ms"] > 0, row
        if placement == "plain":  # nothing taken first: no place to report
            assert "held_at" not in row, row
        else:
            assert row["held_at"].startswith("0x"), row


def test_every_draw_of_a_pair_runs_on_one_gpu_and_the_pairs_are_dealt_in_turn(tmp_path, monkeypatch):
    from benchmarks import timer_agreement

    class FakeServer:  # no process: the GPU it was given is all the rows need
        def __init__(self, gpu):
            self.gpu = gpu

        def close(self):
            pass

    monkeypatch.setattr(timer_agreement, "SideServer", FakeServer)
    items = [((pair, None, None), placement) for pair in ("a", "b", "c") for placement in ps.PLACEMENTS]
    dest = tmp_path / "rows.jsonl"

    def row_of(server, gpu, item):
        assert server.gpu == gpu
        return {"pair": item[0][0], "placement": item[1], "gpu": gpu}

    timer_agreement.over_gpus(["0", "1"], items, row_of, dest, float("inf"), group=lambda item: item[0][0])

    rows = [json.loads(x) for x in dest.read_text().splitlines()]
    assert len(rows) == 3 * len(ps.PLACEMENTS)
    gpus = {pair: {r["gpu"] for r in rows if r["pair"] == pair} for pair in "abc"}
    assert gpus == {"a": {"0"}, "b": {"1"}, "c": {"0"}}
    # on a GPU, a pair's draws in PLACEMENTS' order, one pair after the other
    on0 = [(r["pair"], r["placement"]) for r in rows if r["gpu"] == "0"]
    assert on0 == [(p, pl) for p in "ac" for pl in ps.PLACEMENTS]
