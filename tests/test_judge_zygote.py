"""CPU judges forked from the zygote (`engine/zygote.py`): the same verdicts as exec'd judges, one
zygote for many evaluations, and a forked judge that dies is seen to die."""

from __future__ import annotations

import os
import signal
import time

from conftest import ADD_ONE, CANDIDATES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate, zygote


def test_forked_and_started_judges_give_the_same_verdicts(cpu_config):
    for candidate, status in (("py_correct.py", Status.PASSED), ("py_wrong.py", Status.INCORRECT)):
        seen = {}
        for fork in (True, False):
            cpu_config.fork_judge = fork
            r = evaluate(ADD_ONE, CANDIDATES / candidate, cpu_config)
            assert r.status is status, r.error_log
            seen[fork] = r.metadata["judge_process"]
        assert seen == {True: "forked", False: "started"}, seen


def test_one_zygote_serves_many_evaluations(cpu_config):
    evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    pids = {z.proc.pid for z in zygote._ZYGOTES.values()}
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED and r.metadata["judge_process"] == "forked"
    assert {z.proc.pid for z in zygote._ZYGOTES.values()} == pids and len(pids) == 1


def test_a_forked_judge_that_is_killed_is_seen_to_die(cpu_config, tmp_path):
    """kill, poll and wait as on a Popen: the exit code comes from the zygote's status pipe."""
    from kernelwright.engine import process

    cpu_config.fork_judge = True
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TMPDIR": str(tmp_path)}
    env["PYTHONPATH"] = str(CANDIDATES.parents[2] / "src") + os.pathsep + env["PYTHONPATH"]
    child = process.spawn(
        process.child_argv("judge") + ["cpu", "--spare"], None, tmp_path, env, name="judge", fork=True
    )
    assert type(child.proc).__name__ == "ForkedJudge"
    assert child.wait_ready(60), child.log_tail()
    assert child.proc.poll() is None
    os.killpg(child.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert child.proc.wait(timeout=10) == -signal.SIGKILL
    assert time.monotonic() - t0 < 5 and child.proc.poll() == -signal.SIGKILL
    child.stop()
