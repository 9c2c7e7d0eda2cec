"""The public API: `import kernelwright as kw` hands on evaluate, optimize, EvalConfig, EvalResult
and open_store, lazily (importing the package imports no torch); the README's notebook example
runs as written (a torch-only candidate on the CPU); `kw.optimize` runs the loop and indexes the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from replay_runs import FakeEngine, recorded_answers

import kernelwright as kw
from conftest import ROOT
from kernelwright.store.queries import default_store


def readme_block(heading: str, index: int = 0) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    return re.findall(r"```python\n(.*?)```", section, re.S)[index]


def test_the_names_are_exported_lazily_and_typed():
    assert {"evaluate", "optimize", "EvalConfig", "EvalResult", "open_store"} <= set(dir(kw)) <= set(kw.__all__)
    code = "import sys, kernelwright; print('torch' in sys.modules, 'kernelwright.engine' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=True,
    )
    assert out.stdout.split() == ["False", "False"]
    assert (ROOT / "src" / "kernelwright" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()
    from kernelwright.core.record import EvalResult

    assert kw.EvalResult is EvalResult


def test_the_readme_notebook_example_runs_as_written(tmp_path, cache_dir):
    code = readme_block("## From Python") + "\nprint('ROWS', len(rows))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KERNELWRIGHT_CACHE": cache_dir}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("passed ") and float(first.split()[1]) > 0
    assert "ROWS 0" in out.stdout  # a new user's store: made empty, not an error


def test_optimize_from_python_returns_the_summary_and_indexes_the_run(tmp_path, monkeypatch):
    from conftest import ADD_ONE

    answers = recorded_answers(tmp_path / "answers")
    monkeypatch.setattr("kernelwright.loop.forge.engine_evaluator", lambda cfg, warm=True: FakeEngine())
    summary = kw.optimize(ADD_ONE, coder=f"replay:{answers}", rounds=3, device="cpu", out=tmp_path / "run")
    assert summary["state"] == "finished" and summary["best"]["speedup"] == 1.6
    assert summary["run_dir"] == str(tmp_path / "run") and (tmp_path / "run" / "best.py").is_file()
    with kw.open_store() as db:
        (row,) = db.runs()
    assert row["run_dir"] == str((tmp_path / "run").resolve()) and row["best_round"] == 2
    assert default_store().is_file()


def test_optimize_takes_a_settings_object_without_changing_it(tmp_path, monkeypatch):
    from conftest import ADD_ONE
    from kernelwright.core.config import Settings

    answers = recorded_answers(tmp_path / "answers")
    monkeypatch.setattr("kernelwright.loop.forge.engine_evaluator", lambda cfg, warm=True: FakeEngine())
    settings = Settings()
    settings.loop.rounds = 2
    summary = kw.optimize(ADD_ONE, coder=f"replay:{answers}", device="cpu", settings=settings, out=tmp_path / "run")
    assert summary["rounds_run"] == 2 and summary["backend"] == "cpp"  # the CPU's kernel language
    assert settings.eval.device == "auto" and settings.loop.model.coder is None and not settings.explicit
