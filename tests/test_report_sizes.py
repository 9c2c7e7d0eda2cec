"""Kernels that hold at every size of the problem, in suites and their report: the store reads each
problem's kept kernel's shapes check, the report's table has an "all sizes" column, and
`--fast-p-size-robust` makes the page's fast_p count only those kernels, saying so (runs of the real
loop and CLI with a stand-in engine whose records carry the shapes check's metadata)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from replay_runs import FakeEngine, optimize_suite
from typer.testing import CliRunner

from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult

FLAG = "ModelNew is correct at the problem's own sizes (batch_size=16, dim=1024) but not at dim=1023 (wrong values)"


class SizedEngine(FakeEngine):
    """FakeEngine, plus what the shapes check recorded for a passed kernel: held at every size
    ("robust"), failed at dim=1023 ("specific"), `--shapes off` ("off"), or sizes that could not be
    varied ("literal")."""

    def __init__(self, shapes: str):
        super().__init__()
        self.shapes = shapes

    def __call__(self, problem, code, on_stage, report_dir) -> EvalResult:
        result = super().__call__(problem, code, on_stage, report_dir)
        if not result.correct:
            return result
        tried = [
            {"name": "dim=1023", "sizes": {"dim": 1023}, "passed": self.shapes != "specific"},
            {"name": "batch_size=8", "sizes": {"batch_size": 8}, "passed": True},
        ]
        if self.shapes == "specific":
            tried[0].update(failure="wrong_values", message="Output out has 112 NaN/Inf values")
        shapes = {
            "robust": {"mode": "check", "tried": tried, "passed": ["dim=1023", "batch_size=8"], "failed": []},
            "specific": {"mode": "check", "tried": tried, "passed": ["batch_size=8"], "failed": ["dim=1023"]},
            "off": {"mode": "off"},
            "literal": {"mode": "check", "tried": [], "passed": [], "failed": [], "note": "sizes are literals"},
        }[self.shapes]
        result.metadata["shapes"] = shapes
        result.metadata["guards"] = {"flags": {"shape_specific": FLAG} if self.shapes == "specific" else {}}
        return result


# (level, problem, the Coder's answers round by round, what the shapes check found)
PROBLEMS = [
    ("level1", "1_relu", ["1.6"], "robust"),
    ("level1", "2_swish", ["2.5"], "specific"),  # the fastest, but wrong at dim=1023
    ("level1", "3_gelu", ["1.3"], "off"),
    ("level2", "4_gemm", ["WRONG"], "robust"),  # no correct kernel: nothing to check
    ("level2", "5_conv", ["0.8"], "literal"),
]


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    problems = [(level, name, speeds, SizedEngine(shapes)) for level, name, speeds, shapes in PROBLEMS]
    return optimize_suite(monkeypatch, tmp_path, "sized", problems)


def report(store: Path, *args: str) -> str:
    out = CliRunner().invoke(app, ["report", *args, "--store", str(store)])
    assert out.exit_code == 0, out.output
    return out.stdout


def problems_table(html: str) -> str:
    table = html[html.index('<table id="problems"') :]
    return table[: table.index("</table>")]


def test_the_store_and_the_json_say_which_kernels_hold_at_every_size(store):
    data = json.loads(report(store, "sized", "--json", "-"))
    rows = {p["problem"]: p for p in data["problems"]}
    assert {k: r["size_robust"] for k, r in rows.items()} == {
        "1_relu": True,
        "2_swish": False,
        "3_gelu": None,
        "4_gemm": None,
        "5_conv": None,
    }
    assert rows["2_swish"]["sizes_failed"] == ["dim=1023"] and rows["1_relu"]["sizes_failed"] == []
    m = data["metrics"]
    assert (m["correct"], m["size_robust"], m["size_specific"], m["size_unchecked"]) == (4, 1, 1, 2)
    assert m["fast_p"]["1"] == pytest.approx(3 / 5) and m["fast_p"]["2"] == pytest.approx(1 / 5)  # unchanged
    assert m["fast_p_size_robust"]["1"] == pytest.approx(1 / 5) and m["fast_p_size_robust"]["2"] == 0.0
    assert data["levels"]["level1"]["fast_p_size_robust"]["1"] == pytest.approx(1 / 3)
    assert data["fast_p_counts"] == "all"
    curve = data["fast_p_curve"]
    assert len(curve["fast_p_size_robust"]) == len(curve["p"])
    assert curve["fast_p_size_robust"][0] == pytest.approx(1 / 5)  # p = 0: the one size-robust kernel of five problems
    table = {r["problem"]: r for r in csv.DictReader(io.StringIO(report(store, "sized", "--csv", "-")))}
    assert table["2_swish"]["size_robust"] == "False" and table["2_swish"]["sizes_failed"] == "dim=1023"
    assert table["1_relu"]["size_robust"] == "True" and table["3_gelu"]["size_robust"] == ""
    robust = json.loads(report(store, "sized", "--json", "-", "--fast-p-size-robust"))
    assert robust["fast_p_counts"] == "size_robust" and robust["metrics"] == m  # the same numbers


@pytest.mark.slow
def test_the_page_has_an_all_sizes_column_and_says_what_fast_p_counts(store, tmp_path):
    report(store, "sized", "--html", str(tmp_path / "all.html"))
    page = (tmp_path / "all.html").read_text()
    table = problems_table(page)
    assert "all sizes</th>" in table
    cells = {
        name: table[table.index(f">{name}</a>") :].split('<td class="sizes"')[1].split("</td>")[0]
        for _, name, _, _ in PROBLEMS
    }
    assert cells["1_relu"].endswith(">yes") and cells["2_swish"].endswith(">no (dim=1023)")
    assert "not checked" in cells["3_gelu"] and "not checked" in cells["5_conv"]
    assert cells["4_gemm"].endswith(">-")  # no correct kernel
    assert "fast_p counts only kernels that hold at every size" not in page
    assert "1 of 4" in page and "correct kernels hold at every size" in page

    report(store, "sized", "--html", str(tmp_path / "robust.html"), "--fast-p-size-robust")
    robust = (tmp_path / "robust.html").read_text()
    assert "fast_p counts only kernels that hold at every size" in robust
    cards = robust[robust.index('id="metrics"') : robust.index('id="fast-p-basis"')]
    assert "fast_1 (all sizes)" in cards and "20.0%" in cards and "60.0%" not in cards  # 1 of 5, not 3 of 5
    assert "fast_p, all sizes" in robust  # the plot's title
    assert "all sizes</th>" in problems_table(robust)


def test_the_terminal_summary_and_the_comparison_carry_the_count(store, tmp_path):
    out = report(store, "sized", "--fast-p-size-robust")
    assert "1 of 4 correct kernels hold at every size" in out
    assert "fast_p counts only kernels that hold at every size" in out
    report(store, "sized", "sized", "--json", str(tmp_path / "cmp.json"), "--html", str(tmp_path / "cmp.html"))
    metric = {m["metric"]: m for m in json.loads((tmp_path / "cmp.json").read_text())["metrics"]}
    assert metric["correct at all sizes"]["values"] == [1, 1]
    assert metric["fast_1"]["values"] == pytest.approx([3 / 5, 3 / 5])
    report(store, "sized", "sized", "--json", str(tmp_path / "cmp.json"), "--fast-p-size-robust")
    metric = {m["metric"]: m for m in json.loads((tmp_path / "cmp.json").read_text())["metrics"]}
    assert metric["fast_1 (all sizes)"]["values"] == pytest.approx([1 / 5, 1 / 5]) and "fast_1" not in metric
    report(store, "sized", "sized", "--html", str(tmp_path / "cmp.html"), "--fast-p-size-robust")
    assert "fast_p counts only kernels that hold at every size" in (tmp_path / "cmp.html").read_text()
