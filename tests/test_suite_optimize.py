"""`kernelwright suite optimize` end to end against the scripted OpenAI-compatible server on
loopback: bundled CPU problems, the real loop and engine. Killed with SIGKILL at several points
and resumed each time, it ends with the same results as a run never stopped; the store passes
`PRAGMA integrity_check` after every kill and never loses a finished evaluation."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from helpers import suite_models
from helpers.chat_server import ChatServer

LEVEL1 = FIXTURES / "suite" / "level1"
needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client")


def command(server: ChatServer, root: Path, *only: str) -> list[str]:
    args = [
        sys.executable,
        "-m",
        "kernelwright.cli.main",
        "suite",
        "optimize",
        str(LEVEL1),
        "--coder",
        suite_models.CODER,
        "--judge",
        suite_models.JUDGE,
        "--base-url",
        server.base_url,
        "--rounds",
        "2",
        "--device",
        "cpu",
        "--backend",
        "cpp",
        "--trials",
        "2",
        "--no-profile",
        "--retries",
        "1",
        "--name",
        "opt",
        "--out",
        str(root / "out"),
        "--store",
        str(root / "kw.db"),
    ]
    for o in only:
        args += ["--only", o]
    return args


def env(cache_dir: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "KERNELWRIGHT_CACHE": cache_dir,
        "OPENAI_API_KEY": "test-key",
        "COLUMNS": "200",
    }


def evaluations(db: Path) -> dict[tuple[str, int], str]:
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return {
            (r[0], r[1]): r[2]
            for r in conn.execute(
                "SELECT r.problem, e.round_idx, e.record FROM evaluations e JOIN runs r ON r.id = e.run_id"
            )
        }
    except sqlite3.OperationalError:  # not created yet
        return {}
    finally:
        conn.close()


def results(db: Path) -> set[tuple]:
    """What a run's outcome is made of: every round's kind, verdict and code, and each problem's best round."""
    conn = sqlite3.connect(db)
    try:
        rounds = set(
            conn.execute(
                "SELECT r.problem, d.idx, d.kind, d.verdict, d.candidate_hash, d.became_best "
                "FROM rounds d JOIN runs r ON r.id = d.run_id"
            )
        )
        runs = set(conn.execute("SELECT problem, state, rounds_run, best_round, stop_reason FROM runs"))
    finally:
        conn.close()
    return rounds | runs


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.slow
@needs_openai
def test_suite_optimize_killed_and_resumed_ends_like_a_run_never_stopped(tmp_path, cache_dir):
    only = ("1_add_one", "3_scale_shift")
    with ChatServer({}, respond=suite_models.respond) as server:
        straight = subprocess.run(
            command(server, tmp_path / "straight", *only),
            env=env(cache_dir),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert straight.returncode == 0, straight.stderr[-3000:]
        expected = results(tmp_path / "straight" / "kw.db")
        # add_one: wrong, then repaired; scale_shift: an AttributeError, then repaired
        assert {(p, i, v) for p, i, _, v, *_ in [r for r in expected if len(r) == 6]} == {
            ("1_add_one", 0, "incorrect"),
            ("1_add_one", 1, "passed"),
            ("3_scale_shift", 0, "runtime_error"),
            ("3_scale_shift", 1, "passed"),
        }

        root, db = tmp_path / "killed", tmp_path / "killed" / "kw.db"
        kills = 0
        # before any evaluation; as the 1st evaluation is recorded; 1.5 s and 0.7 s after the 2nd and 3rd (mid-round)
        for kill_at, delay in (("startup", 0.0), (1, 0.0), (2, 1.5), (3, 0.7)):
            before = evaluations(db)
            proc = subprocess.Popen(
                command(server, root, *only), env=env(cache_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                if kill_at == "startup" and db.exists() or kill_at != "startup" and len(evaluations(db)) >= kill_at:
                    break
                time.sleep(0.05)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
            assert integrity(db) == "ok"
            after = evaluations(db)
            assert {k: v for k, v in after.items() if k in before} == before  # a finished evaluation is never lost
        assert kills >= 3
        final = subprocess.run(
            command(server, root, *only), env=env(cache_dir), capture_output=True, text=True, timeout=600
        )
        assert final.returncode == 0, final.stderr[-3000:]
    assert integrity(db) == "ok"
    assert results(db) == expected
    # every problem's run directory holds exactly its finished rounds (a cut round is set aside)
    for name in only:
        assert len(list((root / "out" / "level1" / name).glob("0*_*"))) == 2
    assert "resumed after round 0" in final.stderr or "finished before: skipped" in final.stderr
    assert "suite opt" in final.stdout and "fast_p" in final.stdout

    # the report of the resumed suite: the Judge's findings round by round, the diff between rounds, the best code
    from typer.testing import CliRunner

    from kernelwright.cli.main import app

    out = CliRunner().invoke(app, ["report", "opt", "--store", str(db), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    html = (tmp_path / "r.html").read_text()
    assert html.count('class="problem"') == 2
    assert "critical_issue</b>: The output differs from the reference. · <b>why_it_matters" in html  # round 0's Judge
    assert '<span class="del">-        return x + 1.0</span>' in html  # add_one: the diff from round 0 to round 1
    assert '<span class="add">+        return torch.relu(x) + 1.0</span>' in html
    assert "best kernel (round 1)" in html and html.count("<svg") >= 3 + 2  # the suite's plots, one chart per problem
    chromium = shutil.which("chromium")
    if chromium:  # for a person to look at
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1280,2400",
                "--screenshot=/tmp/kw-report-optimize-screenshot.png",
                (tmp_path / "r.html").as_uri(),
            ],
            capture_output=True,
            timeout=120,
        )


@pytest.mark.slow
@needs_openai
def test_optimize_resume_continues_a_run_directory_and_the_store_follows(tmp_path, cache_dir, monkeypatch):
    """`kernelwright optimize --resume RUN`: the recorded rounds stay as they are, the loop goes on
    after them with the same best so far; the run is indexed in the store beside it; `report RUN`."""
    from typer.testing import CliRunner

    from kernelwright.cli.main import app
    from kernelwright.store import open_store
    from kernelwright.store.rundir import read_summary

    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    run, problem = tmp_path / "runs" / "add_one", str(LEVEL1 / "1_add_one.py")

    def optimize(server, rounds: str, *extra: str):
        return CliRunner().invoke(
            app,
            [
                "optimize",
                problem,
                "--coder",
                suite_models.CODER,
                "--judge",
                suite_models.JUDGE,
                "--base-url",
                server.base_url,
                "--rounds",
                rounds,
                "--device",
                "cpu",
                "--backend",
                "cpp",
                "--trials",
                "2",
                "--no-profile",
                *extra,
            ],
        )

    with ChatServer({}, respond=suite_models.respond) as server:
        first = optimize(server, "2", "--out", str(run))
        assert first.exit_code == 0, first.output
        before = read_summary(run)
        round0 = (next(run.glob("000_*")) / "eval.json").read_text()
        again = optimize(server, "3", "--resume", str(run))
        assert again.exit_code == 0, again.output
        wrong = CliRunner().invoke(
            app,
            [
                "optimize",
                str(LEVEL1 / "2_swish.py"),
                "--coder",
                suite_models.CODER,
                "--base-url",
                server.base_url,
                "--device",
                "cpu",
                "--resume",
                str(run),
            ],
        )
    assert "resuming after round 1" in again.output
    after = read_summary(run)
    assert [r["verdict"] for r in after["rounds"]] == ["incorrect", "passed", "passed"]
    assert after["rounds"][0] == before["rounds"][0] and (next(run.glob("000_*")) / "eval.json").read_text() == round0
    keep = ("dir", "kind", "verdict", "speedup", "became_best", "best_decision")
    assert {k: after["rounds"][1][k] for k in keep} == {k: before["rounds"][1][k] for k in keep}
    # round 1 ended the first run at its limit, unjudged; the resumed run asked the Judge about it first
    assert (before["rounds"][1]["attempts"]["judge"], after["rounds"][1]["attempts"]["judge"]) == (0, 1)
    assert "bottleneck: two passes over memory" in (next(run.glob("002_*")) / "coder_prompt.md").read_text()
    assert after["rounds"][2]["kind"] == "optimise" and after["best"]["round"] in (1, 2)
    assert after["tokens"]["total"] > before["tokens"]["total"]
    assert wrong.exit_code == 2 and "optimised another problem" in wrong.output and "Traceback" not in wrong.output
    from kernelwright.store.queries import default_store

    with open_store(default_store()) as db:  # the user's store (conftest: a file of this test's own)
        (row,) = db.runs()
        assert (row["rounds_run"], row["state"], row["best_round"]) == (3, "finished", after["best"]["round"])
    rep = CliRunner().invoke(
        app, ["report", str(run), "--store", str(default_store()), "--json", str(tmp_path / "r.json")]
    )
    assert rep.exit_code == 0, rep.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["kind"] == "run" and data["problems"][0]["verdicts"] == ["incorrect", "passed", "passed"]
