"""The report draws every kernel and keeps what locates a failure: the speed-up histogram's bins hold
the slowest and the fastest kernel (0.104x sat left of the first bin), a folder suite (no levels) has
no empty level column, and a failure's cell keeps its "where:" lines. Runs of the real loop and CLI
with a stand-in engine; the page is rendered in headless Chromium where it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from replay_runs import FakeEngine, optimize, recorded_answers
from typer.testing import CliRunner

from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult, Status
from kernelwright.report.plots import speedup_bins
from kernelwright.store.db import Store
from kernelwright.store.indexer import index_run
from kernelwright.suites.driver import register_suite

LOG = (
    "Outputs are not close (atol=0.001, rtol=0.001). max_abs_err=2.492e+00, mean_abs_err=6.251e-03\n"
    "  (calibrated check of out against a float64 oracle: candidate max_abs=2.492e+00, normwise=5.786e-02)\n"
    "  where: 64/8192 elements (0.781%) of out out of tolerance; first (in row-major order) at index (0, 3)\n"
    "  where: errors only at positions 3..3 along dim 1 (size 128)\n"
    "  (5/5 trials failed; first failing trial 0, seed 64048677404727)"
)
# a folder of problems (no level), the slowest kernel left of where the bins used to start
PROBLEMS = [("1_relu", "0.104"), ("2_swish", "0.9"), ("3_gelu", "1.6"), ("4_gemm", "WRONG"), ("5_conv", "31.7")]


class LocatingEngine(FakeEngine):
    """FakeEngine, with the error log a wrong column gets from the real engine."""

    def __call__(self, problem, code, on_stage, report_dir) -> EvalResult:
        result = super().__call__(problem, code, on_stage, report_dir)
        if result.status is Status.INCORRECT:
            result.error_log = LOG
        return result


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "kw.db"
    with Store.open(path) as db:
        register_suite(db, "folder", "optimize", ["my_problems"], tmp_path / "folder")
        for name, speed in PROBLEMS:
            run = tmp_path / "folder" / name
            answers = recorded_answers(tmp_path / "answers" / name, [speed])
            out = optimize(monkeypatch, LocatingEngine(), answers, "--rounds", "1", "--out", str(run))
            assert out.exit_code == 0, out.output
            index_run(db, run, suite_id="folder", problem=name, level=None)
    return path


@pytest.mark.parametrize("speeds", [[0.104], [0.1, 0.3, 2.0], [0.5, 2.0], [0.043, 0.048, 100.0], [1.0]])
def test_the_histograms_bins_hold_the_slowest_and_the_fastest_kernel(speeds):
    counts, _ = np.histogram(speeds, speedup_bins(speeds))
    assert counts.sum() == len(speeds)


@pytest.mark.slow
def test_a_folder_suites_report_has_no_empty_level_column_and_keeps_where_the_error_is(store, tmp_path):
    page = tmp_path / "report.html"
    out = CliRunner().invoke(app, ["report", "folder", "--store", str(store), "--html", str(page)])
    assert out.exit_code == 0, out.output
    html = page.read_text()
    table = html[html.index('<table id="problems"') :]
    table = table[: table.index("</table>")]
    head, body = table.split("</thead>")
    assert ">level</th>" not in head
    assert head.count("</th>") == body.split("</tr>")[0].count("</td>") == 13  # header and rows agree
    cell = table[table.index('<td class="reason">Outputs are not close') :]
    cell = cell[: cell.index("</td>")]
    assert "where: 64/8192 elements (0.781%) of out out of tolerance; first (in row-major order) at index (0, 3)" in (
        cell
    )
    assert "where: errors only at positions 3..3 along dim 1 (size 128)" in cell
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return
    shot = tmp_path / "report.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1400"]
    subprocess.run([chromium, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, "/tmp/kw-folder-report.png")  # for a person to look at


def test_a_compile_errors_cell_keeps_the_line_it_failed_at():
    from kernelwright.report.data import reason

    log = (
        "Compilation of extension 'kw_suite_small_matmul' failed with:\n"
        "  main.cpp:10 (candidate line 13): expected ‘;’ before ‘return’\n"
        "      out[i][j] += a[i][k] * b[k][j]   // missing semicolon: a compile error\n"
        "\n"
        "Compiler output (end):\n"
        "Error building extension 'kw_suite_small_matmul': [1/2] c++ -MMD -MF main.o.d -c main.cpp -o main.o\n"
        "FAILED: main.o\n"
        "/root/.cache/kernelwright/builds/kw/main.cpp:10:35: error: expected ‘;’ before ‘return’\n"
    )
    cell = reason(EvalResult(status=Status.COMPILE_ERROR, error_log=log)).splitlines()
    assert cell[0] == "Compilation of extension 'kw_suite_small_matmul' failed with:"
    assert cell[1] == "main.cpp:10 (candidate line 13): expected ‘;’ before ‘return’"
    assert cell[2].endswith("main.cpp:10:35: error: expected ‘;’ before ‘return’") and len(cell) == 3
    # a traceback's first words are no reason; the line that says something is
    crash = 'Traceback (most recent call last):\n  File "x.py", line 3\nRuntimeError: boom'
    assert reason(EvalResult(status=Status.RUNTIME_ERROR, error_log=crash)) == "RuntimeError: boom"
