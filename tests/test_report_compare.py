"""The report a person publishes: an environment header (device, driver, torch, CUDA, kernelwright
version and commit), candidate and reference times, the failure reason in the table, fast_p per
level, and `kernelwright report A B` putting suites side by side (a table per metric, plots),
rendered in headless Chromium (a screenshot kept at /tmp/kw-compare-screenshot.png)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from replay_runs import FakeEngine, optimize, recorded_answers

import kernelwright
from conftest import ROOT
from kernelwright.store.db import Store
from kernelwright.store.indexer import index_run
from kernelwright.suites.driver import register_suite

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# suite -> (level, problem, the Coder's answers round by round)
SUITES = {
    "model-a": [
        ("level1", "1_relu", ["1.0", "1.6"]),
        ("level1", "2_swish", ["WRONG", "WRONG"]),
        ("level2", "7_gemm", ["1.2", "1.1"]),
    ],
    "model-b": [
        ("level1", "1_relu", ["2.5", "2.52"]),
        ("level1", "2_swish", ["1.3", "1.2"]),
        ("level2", "7_gemm", ["WRONG", "WRONG"]),
    ],
}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *args], capture_output=True, text=True, env=env, timeout=180
    )


@pytest.fixture
def suites(tmp_path, monkeypatch) -> Path:
    """Two suites of three problems on two levels in one store, from runs of the real loop and CLI."""
    store = tmp_path / "kw.db"
    with Store.open(store) as db:
        for suite, problems in SUITES.items():
            register_suite(db, suite, "optimize", ["fixtures"], tmp_path / suite)
            for level, name, speeds in problems:
                answers = recorded_answers(tmp_path / "answers" / suite / name, speeds)
                run = tmp_path / suite / level / name
                out = optimize(
                    monkeypatch,
                    FakeEngine(),
                    answers,
                    "--rounds",
                    str(len(speeds)),
                    "--out",
                    str(run),
                    "--store",
                    str(store),
                )
                assert out.exit_code == 0, out.output
                index_run(db, run, suite_id=suite, problem=name, level=level)
    return store


def test_one_report_names_its_environment_times_reasons_and_levels(suites, tmp_path):
    out = cli("report", "model-a", "--store", str(suites), "--json", "-")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    env = data["environment"]
    assert env["kernelwright"] == kernelwright.__version__ and env["torch"] == "2.13.0+cpu"
    assert env["device"] == "cpu (fake engine)" and env["python"]
    assert env["commit"] is None or len(env["commit"].split("+")[0]) == 12  # a git checkout: its commit
    rows = {p["problem"]: p for p in data["problems"]}
    assert rows["1_relu"]["candidate_ms"] == pytest.approx(1 / 1.6) and rows["1_relu"]["reference_ms"] == 1.0
    assert rows["2_swish"]["reason"] == "Outputs are not close (atol=0.001, rtol=0.001)"
    assert rows["1_relu"]["reason"] is None
    assert set(data["levels"]) == {"level1", "level2"}
    assert data["levels"]["level1"]["fast_p"]["1"] == pytest.approx(0.5)  # relu 1.6x; swish failed
    assert data["levels"]["level2"]["fast_p"]["1"] == pytest.approx(1.0)  # gemm 1.2x
    table = list(csv.DictReader(io.StringIO(cli("report", "model-a", "--store", str(suites), "--csv", "-").stdout)))
    assert {r["problem"]: r["reason"] for r in table}["2_swish"].startswith("Outputs are not close")


def test_two_suites_side_by_side(suites, tmp_path):
    out = cli(
        "report",
        "model-a",
        "model-b",
        "--store",
        str(suites),
        "--json",
        str(tmp_path / "cmp.json"),
        "--csv",
        str(tmp_path / "cmp.csv"),
        "--html",
        str(tmp_path / "cmp.html"),
    )
    assert out.returncode == 0, out.stderr
    assert "side by side" in out.stdout and "model-a" in out.stdout and "model-b" in out.stdout
    comp = json.loads((tmp_path / "cmp.json").read_text())
    assert comp["kind"] == "comparison" and comp["labels"] == ["model-a", "model-b"]
    metric = {m["metric"]: m for m in comp["metrics"]}
    assert metric["correct"]["values"] == [2, 2]
    assert metric["fast_1"]["values"] == pytest.approx([2 / 3, 2 / 3])
    assert metric["fast_2"]["values"] == pytest.approx([0, 1 / 3]) and metric["fast_2"]["best"] == 1
    speed = next(t for t in comp["tables"] if t["field"] == "speedup")
    assert {r["problem"]: r["values"] for r in speed["rows"]} == {
        "level1/1_relu": [1.6, 2.5],
        "level1/2_swish": [None, 1.3],
        "level2/7_gemm": [1.2, None],
    }
    verdicts = next(t for t in comp["tables"] if t["field"] == "verdict")
    assert verdicts["rows"][1]["values"] == ["incorrect", "passed"]
    assert all(t["environment"]["torch"] == "2.13.0+cpu" for t in comp["targets"])
    rows = list(csv.DictReader(io.StringIO((tmp_path / "cmp.csv").read_text())))
    assert rows[0]["speedup[model-a]"] == "1.6" and rows[0]["speedup[model-b]"] == "2.5"
    html = (tmp_path / "cmp.html").read_text()
    assert html.count("<svg") == 2 and "https://" not in html.split("<svg")[0]
    bad = cli("report", "model-a", "nope", "--store", str(suites))
    assert bad.returncode == 2 and "no suite or run named 'nope'" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium) to render the report"
)
def test_the_comparison_and_the_report_render_in_headless_chromium(suites, tmp_path):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1700"]
    assert (
        cli("report", "model-a", "model-b", "--store", str(suites), "--html", str(tmp_path / "cmp.html")).returncode
        == 0
    )
    assert cli("report", "model-a", "--store", str(suites), "--html", str(tmp_path / "one.html")).returncode == 0
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", (tmp_path / "cmp.html").as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    summary = dom[dom.index('<table id="summary"') :]
    summary = summary[: summary.index("</table>")]
    # problems, correct, rate, correct at all sizes, 4 fast_p, 3 speed-ups, tokens, cost, wall
    assert summary.count("<tr>") == 1 + 14 and "fast_1.5" in summary
    fast_2 = summary[summary.index("<td>fast_2</td>") :]
    assert fast_2[: fast_2.index("</tr>")].endswith('<td class="num best">33.3%</td>')  # the better value marked
    assert '<td class="num best">' not in summary[summary.index("<td>correct</td>") : summary.index("<td>fast_0</td>")]
    for table in ("table-speedup", "table-verdict", "table-candidate_ms", "table-reference_ms", "table-rounds"):
        part = dom[dom.index(f'id="{table}"') :]
        assert part[: part.index("</table>")].count("<tr>") == 1 + 3, table
    for plot in ("plot-fast-p", "plot-speedups"):
        figure = dom[dom.index(f'id="{plot}"') :]
        assert figure.index("<svg") < figure.index("</figure>"), plot
    one = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", (tmp_path / "one.html").as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    env = one[one.index('id="environment"') :]
    env = env[: env.index("</div>")]
    assert "2.13.0+cpu" in env and kernelwright.__version__ in env and "cpu (fake engine)" in env
    problems = one[one.index('<table id="problems"') :]
    problems = problems[: problems.index("</table>")]
    assert "candidate ms" in problems and "failure reason" in problems and "Outputs are not close" in problems
    assert '<table id="levels"' in one
    for page, keep in (
        ("cmp.html", "/tmp/kw-compare-screenshot.png"),
        ("one.html", "/tmp/kw-report-env-screenshot.png"),
    ):
        shot = tmp_path / f"{page}.png"
        subprocess.run(
            [CHROMIUM, *flags, f"--screenshot={shot}", (tmp_path / page).as_uri()], capture_output=True, timeout=120
        )
        assert shot.stat().st_size > 10_000
        shutil.copy(shot, keep)  # for a person to look at


@pytest.mark.gpu
def test_the_environment_names_the_nvidia_driver_on_a_gpu_machine():
    """On a GPU machine run.json records the driver (nvidia-smi), which the report's header shows."""
    import re

    from kernelwright.store.host import host_environment

    env = host_environment()
    assert env["driver"] and re.fullmatch(r"\d+(\.\d+)+", env["driver"]), env
