"""Directories of an evaluator killed outright are removed by the next process that evaluates,
and nothing of a live evaluator, another user, or a link is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES
from kernelwright.engine.isolation import leftovers

# its output directory in the test's own folder, not on /dev/shm, where another process's first
# evaluation sweeps what dead evaluators left (these, once aged) before this test can
_KILLED_MIDWAY = """
import sys
from pathlib import Path
from kernelwright.core.config import EvalConfig
from kernelwright.engine import evaluation, prestart, runner_fork
evaluation.SHM, evaluation.SHM_MIN_FREE = Path(sys.argv[2]), 0  # an exec'd runner's
runner_fork.SHM, runner_fork.SHM_MIN_FREE = Path(sys.argv[2]), 0  # a forked runner's base
from kernelwright.engine.config_resolution import resolve_config
spare = prestart(resolve_config(EvalConfig(device="cpu", cache_dir=sys.argv[1])))
print(spare.workdir, spare.judge_dir, spare.out_dir, flush=True)
import time; time.sleep(600)
"""


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    for p in [path, *path.iterdir()]:
        os.utime(p, (past, past), follow_symlinks=False)


@pytest.mark.slow
def test_a_killed_evaluators_directories_are_swept_and_a_live_ones_are_not(tmp_path, cache_dir):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    shm = tmp_path / "shm"
    shm.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MIDWAY, cache_dir, str(shm)], stdout=subprocess.PIPE, text=True, env=env
    )
    dirs = [Path(p) for p in proc.stdout.readline().split()]
    assert all(d.is_dir() for d in dirs) and all(f"-{proc.pid}-" in d.name for d in dirs)
    live = leftovers.make_dir("kw-eval-", tmp_path)  # this process's own, as old as the others
    roots = (tmp_path, shm)
    # what the sweep sees: each directory, or the base folder it lies in (a forked runner's, runner_fork.py)
    tops = {next(p for p in [d, *d.parents] if p.parent in roots) for d in dirs}
    for d in [*dirs, *tops, live]:
        _age(d, 3 * 3600)
    assert leftovers.sweep(roots) == []  # its evaluator is alive: nothing goes
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(0.5)  # its spare's children die with it (parent-death signal)
    for d in tops:
        _age(d, 3 * 3600)
    removed = leftovers.sweep(roots)
    assert sorted(removed) == sorted(d.name for d in tops)
    assert not any(d.exists() for d in dirs) and live.is_dir()


def test_a_recent_or_linked_leftover_is_kept(tmp_path):
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    recent = tmp_path / f"kw-eval-{dead}-abcd1234"
    recent.mkdir()
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    link = tmp_path / f"kw-out-{dead}-efgh5678"
    link.symlink_to(target)
    old = tmp_path / f"kw-judge-{dead}-ijkl9012"
    old.mkdir()
    (old / "inner").symlink_to(target)  # a link inside is removed, never followed
    _age(old, 3 * 3600)
    os.utime(link, (time.time() - 3 * 3600,) * 2, follow_symlinks=False)
    assert leftovers.sweep((tmp_path,)) == [old.name]
    assert recent.is_dir() and link.is_symlink() and (target / "keep.txt").is_file()


def test_an_evaluation_names_its_directories_for_its_process(cpu_config, tmp_path, monkeypatch):
    from kernelwright.core.record import Status
    from kernelwright.engine import evaluate

    made = []
    real = leftovers.make_dir
    monkeypatch.setattr(leftovers, "make_dir", lambda prefix, dir=None: made.append(real(prefix, dir)) or made[-1])
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert {d.name.split("-")[1] for d in made} >= {"eval", "judge"}
    assert all(d.name.startswith(f"kw-{d.name.split('-')[1]}-{os.getpid()}-") for d in made)
    # and an evaluation that ends removes them itself (the forked runners' base folders, kept for
    # the process's later evaluations, are removed when it ends: engine/runner_fork.py)
    from kernelwright.engine import runner_fork

    assert not any(d.exists() for d in made if d not in runner_fork.bases())
