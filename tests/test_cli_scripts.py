"""The CLI for scripts and CI, and for a newcomer who keeps using it: one store per user (every run
listed by `kernelwright runs`, wherever its folder is), run names from the problem's folder,
`--json` on `runs` and `report`, plain output sized to its content off a terminal, `eval
--fail-on`, help text without markup loss or type tags, labels that say what each number is
measured against, and run files readable by others (0644)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from replay_runs import FakeEngine, optimize, recorded_answers
from rich.console import Console
from typer.testing import CliRunner

from conftest import ADD_ONE, CANDIDATES, ROOT
from kernelwright.cli.exit_codes import ExitCode
from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult, Status
from kernelwright.store.queries import default_store


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`kernelwright ARGS` as a script runs it: stdout a pipe, not a terminal; no COLUMNS."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def example_problem(root: Path, name: str) -> Path:
    """examples/NAME/problem.py, as the examples are laid out."""
    (root / name).mkdir(parents=True)
    return Path(shutil.copyfile(ADD_ONE, root / name / "problem.py"))


def test_the_store_is_one_per_user_and_lists_every_run(tmp_path, monkeypatch):
    assert os.environ["KERNELWRIGHT_STORE"] == str(default_store())  # conftest: never the real home's store
    monkeypatch.delenv("KERNELWRIGHT_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    if sys.platform.startswith("linux"):
        assert default_store() == tmp_path / "data" / "kernelwright" / "kernelwright.db"
    monkeypatch.setenv("KERNELWRIGHT_STORE", str(tmp_path / "mine.db"))
    assert default_store() == tmp_path / "mine.db"

    answers = recorded_answers(tmp_path / "answers")
    problem = example_problem(tmp_path / "examples", "softmax")
    monkeypatch.chdir(tmp_path)
    # one run in ./runs (its default folder), one with --out far away, one named
    assert optimize(monkeypatch, FakeEngine(), answers, "--rounds", "2", problem=problem).exit_code == 0
    far = tmp_path / "elsewhere" / "deep" / "run"
    assert (
        optimize(monkeypatch, FakeEngine(), answers, "--rounds", "2", "--out", str(far), problem=problem).exit_code == 0
    )
    named = optimize(monkeypatch, FakeEngine(), answers, "--rounds", "2", "--name", "my-try", problem=problem)
    assert named.exit_code == 0, named.output
    (default_dir,) = (tmp_path / "runs").glob("softmax-*")
    assert list((tmp_path / "runs").glob("my-try-*"))

    listed = cli("runs", "--json", cwd=tmp_path / "elsewhere")  # from any folder: the same store
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["store"] == str(tmp_path / "mine.db")
    assert sorted(r["problem"] for r in data["runs"]) == ["my-try", "softmax", "softmax"]
    assert {r["run_dir"] for r in data["runs"]} >= {str(default_dir.resolve()), str(far.resolve())}
    assert all(r["state"] == "finished" and r["best_speedup"] == 1.0 for r in data["runs"])

    # --store overrides the environment; a store that is not there is one line, exit 2
    other = cli("runs", "--json", "--store", str(tmp_path / "absent.db"))
    assert other.returncode == 2 and "no run store at" in other.stderr and "Traceback" not in other.stderr
    bad = optimize(monkeypatch, FakeEngine(), answers, "--name", "../x", problem=problem)
    assert bad.exit_code == 2 and "--name" in bad.output


def test_plain_output_off_a_terminal_is_sized_to_its_content(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    long_dir = tmp_path / ("a-rather-long-folder-name-" * 4) / "run"
    assert optimize(monkeypatch, FakeEngine(), answers, "--rounds", "2", "--out", str(long_dir)).exit_code == 0
    out = cli("runs")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(str(long_dir.resolve()) in line for line in lines)  # the whole path, on one line
    assert "…" not in out.stdout
    assert max(len(line) for line in lines) > 80  # wider than rich's default when it guesses
    header = next(line for line in lines if "problem" in line and "tokens" in line)
    assert "run directory" in header  # no column cut or wrapped


def test_report_json_on_stdout_is_the_data_and_nothing_else(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    assert optimize(monkeypatch, FakeEngine(), answers, "--rounds", "3", "--out", str(tmp_path / "run")).exit_code == 0
    out = cli("report", str(tmp_path / "run"), "--json", "-")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kind"] == "run" and data["problems"][0]["verdicts"] == ["incorrect", "passed", "passed"]
    csv_out = cli("report", str(tmp_path / "run"), "--csv", "-")
    assert csv_out.stdout.splitlines()[0].startswith("level,problem,verdict")


def test_run_files_are_readable_by_others(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    assert optimize(monkeypatch, FakeEngine(), answers, "--rounds", "3", "--out", str(tmp_path / "run")).exit_code == 0
    run = tmp_path / "run"
    files = [run / "best.py", run / "summary.json", run / "run.json", *run.glob("0*_*/*.*")]
    assert len(files) > 6
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
    assert set(modes.values()) == {0o644}, modes
    report = tmp_path / "r.html"
    assert cli("report", str(run), "--html", str(report)).returncode == 0
    assert stat.S_IMODE(report.stat().st_mode) == 0o644


@pytest.mark.slow
def test_eval_fail_on_makes_ci_fail_on_the_listed_verdicts():
    wrong = str(CANDIDATES / "py_wrong.py")
    plain = cli("eval", str(ADD_ONE), wrong, "--device", "cpu", "--quiet")
    assert plain.returncode == 0 and plain.stdout.startswith("incorrect")
    failing = cli("eval", str(ADD_ONE), wrong, "--device", "cpu", "--json", "--fail-on", "compile_error,incorrect")
    assert failing.returncode == ExitCode.VERDICT == 3
    assert json.loads(failing.stdout)["status"] == "incorrect"  # the record is still printed
    listed_other = cli("eval", str(ADD_ONE), wrong, "--device", "cpu", "--quiet", "--fail-on", "compile_error")
    assert listed_other.returncode == 0
    correct = cli(
        "eval", str(ADD_ONE), str(CANDIDATES / "py_correct.py"), "--device", "cpu", "--quiet", "--fail-on", "failed"
    )
    assert correct.returncode == 0, correct.stdout + correct.stderr
    unknown = cli("eval", str(ADD_ONE), wrong, "--fail-on", "incorect")
    assert unknown.returncode == 2 and "unknown verdict incorect" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert "| 3 |" in (ROOT / "README.md").read_text()  # the exit code is in the README's table


# ---- help and labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["eval"], ["optimize"], ["runs"], ["report"], ["suite", "eval"], ["suite", "optimize"]]
)
def test_help_has_no_markup_loss_and_no_type_tags(command):
    out = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert out.exit_code == 0
    text = out.output
    for tag in ("<list[str]>", "<bool>", "<str>", "<path>", "<int>", "<float>", "{PROBLEMS"):
        assert tag not in text, (tag, command)
    if "--config" in text:
        assert "[tool.kernelwright]" in text


def _command_paths(cmd, path=()):
    """Every command of the CLI, as the words that name it (the root first)."""
    from typer.main import get_command

    cmd = cmd or get_command(app)
    yield path
    ctx = cmd.make_context("kernelwright", ["--help"], resilient_parsing=True) if hasattr(cmd, "commands") else None
    for name in cmd.list_commands(ctx) if ctx is not None else ():
        yield from _command_paths(cmd.get_command(ctx, name), (*path, name))


def test_every_help_at_80_columns_cuts_no_text():
    """At 80 columns no option, value or description is cut ('…', or click's '...' after a command's
    help); every line fits; a command's whole short help is in its group's list."""
    from typer.main import get_command

    paths = list(_command_paths(get_command(app)))
    assert ("suite", "eval") in paths and ("serve",) in paths and len(paths) >= 9
    for path in paths:
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert out.exit_code == 0, (path, out.output)
        lines = out.output.splitlines()
        assert "…" not in out.output, (path, [ln for ln in lines if "…" in ln])
        assert max(map(len, lines)) <= 80, (path, max(lines, key=len))
        commands = out.output.split("Commands:")[-1] if "Commands:" in out.output else ""
        assert not any(ln.rstrip().endswith("...") for ln in commands.splitlines()), (path, commands)
    assert len(CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "80"}).output.splitlines()) < 80


@pytest.mark.parametrize(
    "args, line",
    [
        (["eval", "p.py", "c.py", "--trials", "zero"], "error: --trials: input should be a valid integer"),
        (["suite", "eval", "p", "c", "--trials", "zero"], "error: --trials: input should be a valid integer"),
        (["optimize", "p.py", "--rounds", "1.5"], "error: --rounds: input should be a valid integer"),
        (["eval", "p.py"], "error: missing argument 'CANDIDATE' (see `"),
        (["eval", "p.py", "c.py", "--bogus"], "error: no such option: --bogus"),
        (["evall"], "error: no such command 'evall'"),
    ],
)
def test_a_usage_error_is_one_line_that_names_the_fix(args, line):
    res = cli(*args)
    assert res.returncode == ExitCode.BAD_INPUT == 2, res.stderr
    assert res.stderr.startswith(line) and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--help`)" in res.stderr and "╭" not in res.stderr and res.stdout == ""
    if "--trials" in args:
        assert "; pass --trials N (see `" in res.stderr


def _flagged(status: Status, **flags: str) -> EvalResult:
    return EvalResult(
        status=status,
        error_log="Output rules broken: no code block" if status is Status.FORMAT_ERROR else "",
        metadata={"guards": {"flags": flags}},
    )


def test_advice_is_printed_whole_and_a_format_error_shows_no_empty_stages_row():
    from kernelwright.cli.console import render_result

    advice = (
        "the timing varied by 35% between repeats; rerun on a quiet machine, or raise "
        "(timing.cpu_threads_pinned) in the settings file to pin the threads"
    )
    buf = io.StringIO()
    render_result(_flagged(Status.PASSED, timing_unstable=advice), Console(file=buf, width=60))
    assert advice in buf.getvalue()  # soft-wrapped by the terminal, never cut by us

    buf = io.StringIO()
    render_result(_flagged(Status.FORMAT_ERROR), Console(file=buf, width=100))
    assert "stages" not in buf.getvalue()


def test_the_run_table_says_what_each_number_is_measured_against(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    out = optimize(monkeypatch, FakeEngine(), answers, "--rounds", "4", "--out", str(tmp_path / "run"))
    assert out.exit_code == 0
    text = " ".join(out.output.split())
    assert "speed-up vs reference" in text
    assert "Judge: expected / got vs reviewed round" in text
    assert "1.500x / 0.750x: regressed" in text  # round 3: 1.2x after the 1.6x best, against 1.5x expected
