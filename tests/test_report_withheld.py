"""Speed-ups a record withholds (`timing_unstable`: the timing conditions did not hold;
`faster_than_hardware`: a time under what the hardware can do) through the real loop, store,
CLI and report with a stand-in engine: the figure is shown and marked, and counted as untimed in
fast_p and the means, wherever a suite's numbers are printed."""

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


class FlaggedEngine(FakeEngine):
    """FakeEngine whose passed records carry `flag` (None: no flag)."""

    def __init__(self, flag: str | None):
        super().__init__()
        self.flag = flag

    def __call__(self, problem, code, on_stage, report_dir) -> EvalResult:
        result = super().__call__(problem, code, on_stage, report_dir)
        if result.correct and self.flag is not None:
            result.metadata["guards"] = {"flags": {self.flag: "the evidence", "launch_bound": "a fact of timing"}}
        return result


# (problem, the Coder's answers, the flag every passed record carries)
PROBLEMS = [
    ("1_relu", ["1.6"], None),
    ("2_forged", ["22"], "timing_unstable"),  # a loaded machine: the figure means nothing
    ("3_physics", ["9"], "faster_than_hardware"),
]


@pytest.fixture
def store(tmp_path, monkeypatch) -> tuple[Path, dict[str, str]]:
    engines = {name: FlaggedEngine(flag) for name, _, flag in PROBLEMS}
    problems = [("level1", name, speeds, engines[name]) for name, speeds, _ in PROBLEMS]
    path = optimize_suite(monkeypatch, tmp_path, "trust", problems)
    return path, {name: engine.output for name, engine in engines.items()}


def report(path: Path, *args: str) -> str:
    out = CliRunner().invoke(app, ["report", *args, "--store", str(path)])
    assert out.exit_code == 0, out.output
    return out.stdout


def test_withheld_figures_are_shown_marked_and_counted_as_untimed(store, tmp_path):
    path, outputs = store
    assert "(not trusted: timing_unstable)" in " ".join(outputs["2_forged"].split())
    assert "not trusted" not in outputs["1_relu"]
    data = json.loads(report(path, "trust", "--json", "-"))
    rows = {p["problem"]: p for p in data["problems"]}
    assert rows["2_forged"]["speedup"] == pytest.approx(22.0)  # the record's figure, kept and shown
    assert rows["2_forged"]["speedup_withheld_by"] == ["timing_unstable"]
    assert rows["3_physics"]["speedup_withheld_by"] == ["faster_than_hardware"]
    assert rows["1_relu"]["speedup_withheld_by"] == []
    m = data["metrics"]
    assert m["correct"] == 3 and m["speedups_withheld"] == ["2_forged", "3_physics"]
    assert m["fast_p"]["0"] == pytest.approx(1.0) and m["fast_p"]["1.5"] == pytest.approx(1 / 3)
    assert m["fast_p"]["2"] == 0.0 and m["geomean_speedup"] == pytest.approx(1.6)
    table = {r["problem"]: r for r in csv.DictReader(io.StringIO(report(path, "trust", "--csv", "-")))}
    assert table["2_forged"]["speedup_withheld_by"] == "timing_unstable"
    assert table["1_relu"]["speedup_withheld_by"] == ""
    text = " ".join(report(path, "trust").split())
    said = "2 speed-ups withheld (timing_unstable, faster_than_hardware), counted as untimed: 2_forged, 3_physics"
    assert said in text
    report(path, "trust", "--html", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    table_html = page[page.index('<table id="problems"') :]
    forged_row = table_html[table_html.index(">2_forged</a>") :].split("</tr>")[0]
    assert "(not trusted)" in forged_row and 'title="not trusted (timing_unstable)' in forged_row
    relu_row = table_html[table_html.index(">1_relu</a>") :].split("</tr>")[0]
    assert "not trusted" not in relu_row
    assert 'id="withheld"' in page and "2_forged, 3_physics" in page
    details = page[page.index("level1/2_forged:") :].split("</summary>")[0]
    assert "22.000x" in details and "(not trusted: timing_unstable)" in details
    assert max(data["fast_p_curve"]["p"]) == pytest.approx(2.2)  # the grid spans the figures fast_p counts
