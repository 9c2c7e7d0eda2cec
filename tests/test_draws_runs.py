"""benchmarks/draws_runs.py: suite runs made with `--draws N` set against runs with one draw, pair by
pair, counting only speed-ups the record trusts in every run that recorded them."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import draws_runs
from tests.conftest import ROOT


def _row(pair: str, speedup: float | None, draws: list[float] | None = None, flags=(), status="passed") -> dict:
    row = {"pair": pair, "status": status, "speedup": speedup, "flags": list(flags)}
    if draws:
        row["draws"] = {"each": [{"status": "passed", "speedup": s, "total_s": 2.5} for s in draws]}
    return row


def _runs(*rows_of_each_run: list[dict]) -> dict[str, dict[str, dict]]:
    return {f"r{i}": {r["pair"]: r for r in rows} for i, rows in enumerate(rows_of_each_run)}


def test_run_to_run_counts_pairs_trusted_in_every_run_and_sets_them_beside_the_one_draw_runs():
    draws = _runs(
        [
            _row("a", 1.00, [0.97, 1.00, 1.04]),
            _row("b", 2.00, [2.0, 2.0, 2.0]),
            _row("c", 5.0, flags=["degenerate_reference"]),  # a constant output's speed-up: no clock's spread
            _row("d", 1.2),  # in one run only
        ],
        [
            _row("a", 1.02, [1.02, 1.01, 1.05]),
            _row("b", 2.02, [2.02, 2.01, 2.03]),
            _row("c", 9.0, flags=["degenerate_reference"]),
        ],
        [_row("a", None, status="incorrect"), _row("b", 2.01)],  # a failed draw in a later run: not trusted
    )
    single = _runs([_row("b", 1.8), _row("a", 1.0)], [_row("b", 2.2), _row("a", 1.1)])
    text, result = draws_runs.page(draws, single, {})
    assert draws_runs.run_to_run(draws, "a") is None  # not trusted in the third run
    assert abs(draws_runs.run_to_run(draws, "b") - 0.01) < 1e-9
    assert draws_runs.run_to_run(draws, "c") is None and draws_runs.run_to_run(draws, "d") is None
    assert result["with_draws"]["n"] == 1 and result["same_pairs_one_draw"]["n"] == 1
    assert abs(result["same_pairs_one_draw"]["max"] - round(2.2 / 1.8 - 1, 4)) < 1e-9
    assert "| a | r0 | passed | 1.000 | 0.970 1.000 1.040 | 7.2% | 2.5 2.5 2.5 |  |" in text
    assert "| a | r2 | incorrect |  |" in text  # the failed run is shown, with no figure


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "draws_runs.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_a_missing_run_file_is_one_line_and_exit_2(tmp_path):
    p = _cli("--draws", tmp_path / "kw-x.jsonl", "--out", tmp_path / "o.md")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no file" in p.stderr, p.stderr
    assert not (tmp_path / "o.md").exists()


def test_the_page_is_written_from_the_files_a_run_leaves(tmp_path):
    rows = [_row("a", 1.5, [1.4, 1.5, 1.6])]
    (tmp_path / "kw-b1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "suite-b1.json").write_text(
        json.dumps({"accounting": {"problems": 1, "wall_per_problem_s": 9.5}, "gpu_busy_share": 0.4})
    )
    out = tmp_path / "draws.md"
    p = _cli(
        "--draws", tmp_path / "kw-b1.jsonl", "--suite", tmp_path / "suite-b1.json", "--out", out, "--header", "how"
    )
    assert p.returncode == 0, p.stderr
    assert out.read_text().startswith("<!-- how -->") and "| b1 | 1 | 9.5 | 0.4 |" in out.read_text()


def test_the_waits_between_draws_come_from_their_stage_spans():
    def drawn(*edges):
        return {
            "status": "passed",
            "speedup": 1.0,
            "spans": {"startup": [edges[0], edges[0] + 0.1], "timing": [edges[1] - 1, edges[1]]},
        }

    row = _row("a", 1.0)
    row["draws"] = {"each": [drawn(100.0, 103.7), drawn(112.2, 117.1), drawn(117.3, 120.0)]}
    first, later = draws_runs.waits({"a": row})
    assert [round(w, 2) for w in first] == [8.5] and [round(w, 2) for w in later] == [0.2]
    text, result = draws_runs.page({"r0": {"a": row}}, {}, {})
    assert result["waits_s"]["r0"]["after_first"] == {"n": 1, "median": 8.5, "max": 8.5}
    assert "| r0 | 1, 8.50, 8.50 | 1, 0.20, 0.20 |" in text


def test_each_stage_is_set_out_by_the_draws_place_and_a_failed_draw_leaves_its_pair_out():
    def drawn(start, correctness, speedup=1.0, status="passed"):
        return {
            "status": status,
            "speedup": speedup if status == "passed" else None,
            "spans": {
                "build": [start, start + 0.3],
                "correctness": [start + 0.3, start + 0.3 + correctness],
                "timing": [start + 0.3 + correctness, start + 1.3 + correctness],
            },
        }

    a, b, c = _row("a", 1.0), _row("b", 2.0), _row("c", None, status="incorrect")
    a["draws"] = {"each": [drawn(0, 2.5, 1.0), drawn(10, 2.7, 1.1), drawn(20, 0.5, 0.99)]}
    b["draws"] = {"each": [drawn(0, 2.1, 2.0), drawn(10, 2.9, 2.0), drawn(20, 0.7, 2.0)]}
    c["draws"] = {"each": [drawn(0, 9.0, 1.0), drawn(10, 9.0, status="incorrect")]}  # not counted
    apart, seconds = draws_runs.by_place({"a": a, "b": b, "c": c})
    assert [round(x, 4) for x in apart] == [round(1.1 / 0.99 - 1, 4), 0.0]
    assert [[round(x, 2) for x in place] for place in seconds["correctness"]] == [[2.5, 2.1], [2.7, 2.9], [0.5, 0.7]]
    text, result = draws_runs.page({"r0": {"a": a, "b": b, "c": c}}, {}, {})
    assert result["within"]["r0"]["seconds_by_place"]["correctness"] == [2.3, 2.8, 0.6]
    assert "| r0 | 2 | 5.6%, 11.1% | 0.30 0.30 0.30 | 2.30 2.80 0.60 | 1.00 1.00 1.00 |" in text
