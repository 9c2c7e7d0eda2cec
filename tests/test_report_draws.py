"""A kernel evaluated in several draws (`--draws`): the report keeps the record's speed-up (the median
draw's) and shows each draw's beside it, in the JSON, the CSV and the page, through the real loop,
store, CLI and report with a stand-in engine."""

from __future__ import annotations

import csv
import io
import json

from replay_runs import FakeEngine, optimize_suite
from typer.testing import CliRunner

from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult


class DrawnEngine(FakeEngine):
    """FakeEngine whose passed records say they are the median of three draws around their figure."""

    def __call__(self, problem, code, on_stage, report_dir) -> EvalResult:
        result = super().__call__(problem, code, on_stage, report_dir)
        if result.correct and result.speedup:
            s = result.speedup
            each = [{"status": "passed", "speedup": x} for x in (s * 1.04, s, s * 0.97)]
            result.metadata["draws"] = {"asked": 3, "ran": 3, "chosen": 2, "spread": 0.0722, "each": each}
        return result


def test_the_report_shows_each_draws_speedup_beside_the_medians(tmp_path, monkeypatch):
    path = optimize_suite(monkeypatch, tmp_path, "drawn", [("level1", "1_relu", ["2.0"], DrawnEngine())])

    def report(*args: str) -> str:
        out = CliRunner().invoke(app, ["report", "drawn", *args, "--store", str(path)])
        assert out.exit_code == 0, out.output
        return out.stdout

    row = json.loads(report("--json", "-"))["problems"][0]
    assert row["speedup"] == 2.0 and row["speedup_draws"] == [2.08, 2.0, 1.94]
    table = list(csv.DictReader(io.StringIO(report("--csv", "-"))))
    assert table[0]["speedup_draws"] == "2.08 2 1.94"
    report("--html", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    cell = page[page.index('<table id="problems"') :].split("</tr>")[1]
    assert "(median of 3)" in cell and "(--draws): 2.080x 2.000x 1.940x" in cell
