"""`kernelwright suite eval` on a folder of KernelBench-layout problems and candidates (correct,
partly wrong, crashing, a C++ compile error, one problem with no candidate): the same verdicts as
one `kernelwright eval` each, a rerun that skips what is finished, and the report (HTML opened in
headless Chromium, JSON and CSV exports)."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import EXAMPLES, FIXTURES
from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult
from kernelwright.store import open_store
from kernelwright.suites.driver import died_before_the_candidate

SUITE = FIXTURES / "suite"
EXPECTED = {
    "1_add_one": "passed",
    "2_swish": "passed",
    "3_scale_shift": "incorrect",
    "4_row_softmax": "crashed",
    "5_small_matmul": "compile_error",
    "6_mean_pool": "no_candidate",
}


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("suite")
    mp = pytest.MonkeyPatch()
    mp.setenv("KERNELWRIGHT_CACHE", cache_dir)
    try:
        output = cli(
            "suite",
            "eval",
            str(SUITE / "level1"),
            str(SUITE / "candidates"),
            "--device",
            "cpu",
            "--trials",
            "3",
            "--name",
            "fixtures",
            "--out",
            str(root / "out"),
            "--store",
            str(root / "kw.db"),
        )
    finally:
        mp.undo()
    return root, output


@pytest.mark.slow
def test_suite_eval_gives_each_problem_its_verdict(suite_run):
    root, output = suite_run
    with open_store(root / "kw.db") as db:
        got = {p["problem"]: p["verdict"] for p in db.problems("fixtures")}
        assert got == EXPECTED
        assert db.store.integrity_check() == "ok"
        runs = db.runs(suite="fixtures")
        assert all(r["state"] == "finished" and r["kind"] == "eval" for r in runs) and len(runs) == 5
        ev = {e["problem"]: e for e in db.evaluations(suite="fixtures")}
        assert "Outputs are not close" in ev["3_scale_shift"]["record"]["error_log"]
        assert ev["5_small_matmul"]["record"]["compile_issues"]
    # the run directories are what `kernelwright optimize` writes: round folder, eval.json, best.py
    run = root / "out" / "level1" / "1_add_one"
    assert (run / "best.py").read_text() == (SUITE / "candidates" / "1_add_one.py").read_text()
    assert json.loads(next(run.glob("000_*/eval.json")).read_text())["status"] == "passed"
    assert "ran 5, skipped 0" in output and "1 with no candidate" in output
    assert re.search(r"fast_p\s+│ fast_0 33\.3%\s+fast_1 ", output)


@pytest.mark.slow
def test_suite_eval_matches_one_kernelwright_eval_each(suite_run, cache_dir, monkeypatch):
    root, _ = suite_run
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    with open_store(root / "kw.db") as db:
        suite = {e["problem"]: e["record"] for e in db.evaluations(suite="fixtures")}
    for name, record in suite.items():
        out = cli(
            "eval",
            str(SUITE / "level1" / f"{name}.py"),
            str(SUITE / "candidates" / f"{name}.py"),
            "--device",
            "cpu",
            "--trials",
            "3",
            "--json",
        )
        alone = json.loads(out)
        if died_before_the_candidate(EvalResult.from_dict(alone)):  # the machine's fault (as the suite does: once more)
            alone = json.loads(
                cli(
                    "eval",
                    str(SUITE / "level1" / f"{name}.py"),
                    str(SUITE / "candidates" / f"{name}.py"),
                    "--device",
                    "cpu",
                    "--trials",
                    "3",
                    "--json",
                )
            )
        assert (alone["status"], alone["correct"], alone["compiled"]) == (
            record["status"],
            record["correct"],
            record["compiled"],
        ), name
        assert (alone["max_abs_err"] is None) == (record["max_abs_err"] is None), name


@pytest.mark.slow
def test_a_rerun_skips_what_is_finished_and_redoes_a_changed_candidate(suite_run, tmp_path, cache_dir, monkeypatch):
    root, _ = suite_run
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    out = cli(
        "suite",
        "eval",
        str(SUITE / "level1"),
        str(SUITE / "candidates"),
        "--device",
        "cpu",
        "--trials",
        "3",
        "--name",
        "fixtures",
        "--out",
        str(root / "out"),
        "--store",
        str(root / "kw.db"),
    )
    assert "ran 0, skipped 5 finished before" in out
    monkeypatch.setenv("COLUMNS", "200")
    listing = cli("runs", "--store", str(root / "kw.db"), "--suite", "fixtures")
    assert "5 runs in" in listing and "level1/2_swish" in listing and re.search(r"│ \d+\.\d{3}x ", listing)
    # a changed candidate for one problem: only that one runs again (the others come from the first run)
    cands = tmp_path / "cands"
    shutil.copytree(SUITE / "candidates", cands)
    shutil.copy(SUITE / "candidates" / "1_add_one.py", cands / "4_row_softmax.py")  # wrong maths, no crash now
    out = cli(
        "suite",
        "eval",
        str(SUITE / "level1"),
        str(cands),
        "--device",
        "cpu",
        "--trials",
        "3",
        "--only",
        "4",
        "--only",
        "1",
        "--name",
        "fixtures-2",
        "--out",
        str(root / "out"),
        "--store",
        str(root / "kw2.db"),
    )
    assert "ran 1, skipped 1 finished before" in out and "level1/4_row_softmax: incorrect" in out


@pytest.mark.slow
def test_a_rerun_with_the_same_arguments_from_another_directory_resumes(tmp_path, cache_dir, monkeypatch):
    """The store is per user: the suite's default name finds its run directories from any directory."""
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    monkeypatch.setenv("KERNELWRIGHT_STORE", str(tmp_path / "user" / "kernelwright.db"))
    args = ("suite", "eval", str(SUITE / "level1"), str(SUITE / "candidates"), "--device", "cpu", "--trials", "2")
    for here in ("first", "elsewhere"):
        (tmp_path / here).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    assert "ran 1, skipped 0" in cli(*args, "--only", "1")
    monkeypatch.chdir(tmp_path / "elsewhere")
    out = cli(*args, "--only", "1")
    assert "ran 0, skipped 1 finished before" in out, out
    assert not (tmp_path / "elsewhere" / "runs").exists()  # nothing written here: the first folder resumed
    (name,) = [p.name for p in (tmp_path / "first" / "runs" / "suites").iterdir()]
    # another folder for the same suite: one line that names the suite's folder and the fix
    other = cli(*args, "--only", "1", "--out", str(tmp_path / "other"), code=2)
    assert f"suite {name!r} has its run directories in {tmp_path / 'first' / 'runs' / 'suites' / name}" in other
    assert "leave --out out (or pass that folder) to resume it, or pass another --name" in other
    # the same name for another kind of suite
    replay = f"replay:{EXAMPLES / 'cpu_swish' / 'replay'}"
    clash = cli(
        "suite", "optimize", str(SUITE / "level1"), "--coder", replay, "--device", "cpu", "--name", name, code=2
    )
    assert f"suite {name!r} is an eval suite" in clash and "a eval" not in clash, clash


def test_suite_eval_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, message in [
        (["suite", "eval", str(SUITE / "level1")], "needs PROBLEMS and CANDIDATES"),
        (["suite", "eval", str(tmp_path / "none"), str(SUITE / "candidates")], "no problem files at"),
        (["suite", "eval", str(SUITE / "level1"), str(tmp_path)], "no candidate in"),
        (["suite", "eval", str(SUITE / "level1"), str(SUITE / "candidates"), "--only", "level7"], "no problems left"),
        (["suite", "eval", str(SUITE / "level1"), str(SUITE / "candidates"), "--shapes", "some"], "--shapes must be"),
    ]:
        out = cli(*args, "--device", "cpu", "--store", str(tmp_path / "kw.db"), code=2)
        assert message in out and "Traceback" not in out


# ---- the report ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(suite_run):
    root, _ = suite_run
    out = cli(
        "report",
        "fixtures",
        "--store",
        str(root / "kw.db"),
        "--html",
        str(root / "report.html"),
        "--json",
        str(root / "report.json"),
        "--csv",
        str(root / "report.csv"),
    )
    return root, out


@pytest.mark.slow
def test_report_exports_carry_the_metrics_and_every_problem(reports):
    root, out = reports
    data = json.loads((root / "report.json").read_text())
    m = data["metrics"]
    assert (m["problems"], m["correct"]) == (6, 2) and m["fast_p"]["0"] == pytest.approx(2 / 6)
    assert m["verdict_mix"] == {"passed": 2, "incorrect": 1, "crashed": 1, "compile_error": 1, "no_candidate": 1}
    rows = list(csv.DictReader(io.StringIO((root / "report.csv").read_text())))
    assert {r["problem"]: r["verdict"] for r in rows} == EXPECTED
    assert "correct" in out and "fast_0 33.3%" in out
    html = (root / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?https?:|@import""", html)  # offline


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium) to render the report"
)
def test_report_renders_in_headless_chromium_with_table_and_plots(reports):
    root, _ = reports
    page = (root / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    start = dom.index('<table id="problems"')
    table = dom[start : dom.index("</table>", start)]
    assert table.count("<tr>") == 1 + 6  # header and one row per problem
    for plot in ("plot-distribution", "plot-fast-p", "plot-verdicts"):
        figure = dom[dom.index(f'id="{plot}"') :]
        assert figure.index("<svg") < figure.index("</figure>"), plot  # an inline SVG drawn in the figure
    assert "fast_1.5" in dom and "no_candidate" in dom
    # the sortable table: a click on "speed-up" (column 3, here through the page's #sort= link) sorts the rows
    for order in ("desc", "asc"):
        sorted_dom = subprocess.run(
            [CHROMIUM, *flags, "--dump-dom", f"{page}#sort=3-{order}"], capture_output=True, text=True, timeout=120
        ).stdout
        at = sorted_dom.index('<table id="problems"')
        body = sorted_dom[sorted_dom.index("<tbody>", at) : sorted_dom.index("</tbody>", at)]
        rows = body.split("<tr>")[1:]
        speeds = [float(re.search(r'<td class="num" data-value="(-?[\d.]+)"', r).group(1)) for r in rows]
        assert len(speeds) == 6 and speeds == sorted(speeds, reverse=order == "desc"), (order, speeds)
        assert (speeds[0] > 0) == (order == "desc")  # the correct kernels first when descending
    shot = root / "report.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", page], capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000
    keep = Path("/tmp/kw-report-screenshot.png")
    shutil.copy(shot, keep)  # for a person to look at


@pytest.mark.slow
def test_suite_eval_of_jsonl_records(tmp_path, cache_dir, monkeypatch):
    """Generations as JSONL `{problem, code}` records (one problem's worth here), through the CLI."""
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    records = tmp_path / "gen.jsonl"
    records.write_text(
        json.dumps({"problem": "1_add_one", "code": (SUITE / "candidates" / "1_add_one.py").read_text()})
        + "\n"
        + json.dumps({"problem": "no_such_problem", "code": "x"})
        + "\n"
    )
    out = cli(
        "suite",
        "eval",
        str(SUITE / "level1"),
        str(records),
        "--only",
        "1",
        "--only",
        "2",
        "--device",
        "cpu",
        "--trials",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--store",
        str(tmp_path / "kw.db"),
    )
    assert "1 candidates for 2 problems (1 with no candidate)" in out and "level1/1_add_one: passed" in out
    with open_store(tmp_path / "kw.db") as db:
        (suite,) = db.suites()
        assert suite["id"].startswith("eval-level1-") and suite["candidates"] == str(records)
        assert {p["problem"]: p["verdict"] for p in db.problems(suite["id"])} == {
            "1_add_one": "passed",
            "2_swish": "no_candidate",
        }


@pytest.mark.slow
def test_ctrl_c_stops_a_suite_at_once_and_keeps_what_is_recorded(tmp_path, cache_dir):
    """Ctrl-C (SIGINT to the foreground group) while a suite runs: the CLI stops within seconds,
    says how many problems the store holds and how to go on, exits 130, and leaves no process
    behind (it had waited for every queued evaluation, ~30 s, and its workers printed tracebacks)."""
    import os
    import signal
    import sys
    import time

    env = dict(os.environ, KERNELWRIGHT_CACHE=cache_dir, COLUMNS="200")
    args = [sys.executable, "-m", "kernelwright.cli.main", "suite", "eval", str(SUITE / "level1")]
    args += [str(SUITE / "candidates"), "--device", "cpu", "--trials", "2", "--name", "ctrl-c"]
    args += ["--out", str(tmp_path / "out"), "--store", str(tmp_path / "kw.db")]
    proc = subprocess.Popen(
        args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the first problem's verdict: the suite is under way
        lines.append(line)
        if re.match(r"level1/\S+: ", line):
            break
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out = "".join(lines) + proc.stdout.read()
    code = proc.wait(timeout=60)
    stopped_s = time.monotonic() - t0
    assert code == 130, out
    assert stopped_s < 10, (stopped_s, out)
    assert re.search(r"interrupted after \d+ s: [1-6] problem\(s\) of suite ctrl-c are in the store", out), out
    assert "Traceback" not in out, out
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert left == [], left
