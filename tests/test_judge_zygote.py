"""CPU judges forked from the zygote (`engine/zygote_client.py`): the same verdicts as exec'd judges, one
zygote for many evaluations, and a forked judge that dies is seen to die."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import ADD_ONE, CANDIDATES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate, runner_fork, zygote_client


@pytest.mark.slow
def test_forked_and_started_judges_give_the_same_verdicts(cpu_config):
    for candidate, status in (("py_correct.py", Status.PASSED), ("py_wrong.py", Status.INCORRECT)):
        seen = {}
        for fork in (True, False):
            cpu_config.fork_judge = fork
            if fork:
                _forked(cpu_config)  # the zygote is ready
            r = evaluate(ADD_ONE, CANDIDATES / candidate, cpu_config)
            assert r.status is status, r.error_log
            seen[fork] = r.metadata["judge_process"]
        assert seen == {True: "forked", False: "started"}, seen


def _forked(cpu_config) -> dict:
    """An evaluation whose judge was forked (a zygote whose import outlasts `READY_WAIT_S` on a loaded
    machine is not waited for: that evaluation's judge is exec'd)."""
    for _ in range(20):
        r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
        assert r.status is Status.PASSED, r.error_log
        if r.metadata["judge_process"] == "forked":
            return r.metadata
        time.sleep(0.5)
    raise AssertionError("no judge was forked in 20 evaluations")


@pytest.mark.slow
def test_one_zygote_serves_many_evaluations_and_their_caches(cpu_config, tmp_path):
    _forked(cpu_config)
    pids = {z.proc.pid for z in zygote_client._ZYGOTES.values()}
    cpu_config.cache_dir = str(tmp_path / "another-cache")  # per-judge variables: the same zygote
    _forked(cpu_config)
    assert {z.proc.pid for z in zygote_client._ZYGOTES.values()} == pids
    assert len(zygote_client._ZYGOTES) <= zygote_client.MAX_ZYGOTES


@pytest.mark.slow
def test_a_judge_counts_a_new_problems_work_with_the_flop_counters_modules_imported_off_the_path(cpu_config, tmp_path):
    """The flop counter's first use imports torch._dynamo (2-3 s of CPU on a 2-core machine). A judge
    forked from the zygote has it already (the zygote paid it once: `evidence.warm_flop_counter`); an
    exec'd judge imports it in a thread as soon as its problem is loaded, where that problem's work is
    not in its cache, and its timing stage waits for it: either way the count itself is warm."""

    def counted(fork: bool, n: int) -> dict:
        cpu_config.fork_judge = fork
        problem = tmp_path / f"add_one_{n}.py"  # a text of its own: its work is not in the cache
        problem.write_text(ADD_ONE.read_text() + f"\n# problem {n}\n")
        r = evaluate(problem, CANDIDATES / "py_correct.py", cpu_config)
        assert r.status is Status.PASSED, r.error_log
        physics = r.metadata["guards"]["facts"]["physics"]
        assert isinstance(physics, dict), physics
        return {"process": r.metadata["judge_process"], **physics["reference_work"]}

    _forked(cpu_config)  # the zygote is ready
    forked = counted(True, 1)
    assert forked["process"] == "forked" and forked["counter_warm"] is True, forked
    started = counted(False, 2)
    assert started["process"] == "started" and started["counter_warm"] is True, started


@pytest.mark.slow
def test_a_judge_waits_for_a_zygote_importing_torch_instead_of_importing_it_beside_it(cpu_config, monkeypatch):
    """The first evaluation of a configuration starts the zygote and waits for its import (an exec'd
    judge would import torch as long, on the same cores), then is forked; the next is forked from
    the same zygote. Its runner likewise, from the runner's zygote."""
    # the rule, not its bound: a loaded CI machine may take longer than READY_WAIT_S to import torch
    monkeypatch.setattr(zygote_client, "READY_WAIT_S", 180.0)
    zygote_client.close_all()
    runner_fork.close_all()
    first = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert first.status is Status.PASSED, first.error_log
    assert (first.metadata["judge_process"], first.metadata["runner_process"]) == ("forked", "forked")
    assert first.metadata["engine_phases_s"]["spawn"] > 0  # (the wait is on the record)
    assert len(zygote_client._ZYGOTES) == 1
    zygote = next(iter(zygote_client._ZYGOTES.values()))
    assert zygote.warm_asked  # after the evaluation, its flop counter's one-time import (`warm`)
    second = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)  # forked once that import is done
    assert second.status is Status.PASSED and second.metadata["judge_process"] == "forked", second.error_log
    assert list(zygote_client._ZYGOTES.values()) == [zygote]


def test_a_judge_zygote_is_asked_to_warm_once_and_never_before_it_is_ready(monkeypatch):
    """`warm` asks a ready judge zygote once (the parent idle, after an evaluation) and one still
    importing torch never: its first judge would wait behind it. No torch: a stand-in whose socket
    the test reads."""
    import socket
    import threading
    import types

    z = object.__new__(zygote_client._Zygote)
    z.ready, z.warm_asked, z.lock = False, False, threading.Lock()
    z.proc = types.SimpleNamespace(poll=lambda: None)
    z.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    monkeypatch.setattr(zygote_client, "_ZYGOTES", {(("K", "V"),): z})
    theirs.setblocking(False)
    try:
        zygote_client.warm()
        with pytest.raises(BlockingIOError):  # still importing: not asked
            theirs.recv(64)
        z.ready = True
        zygote_client.warm()
        zygote_client.warm()
        assert json.loads(theirs.recv(64)) == {"warm": True}
        with pytest.raises(BlockingIOError):  # once
            theirs.recv(64)
    finally:
        z.sock.close()
        theirs.close()


def test_a_zygote_that_kept_its_caller_waiting_too_long_is_not_waited_for_again():
    """A zygote whose import outlasts the wait is not waited for by later callers (they are exec'd
    at once) until its first message comes; it is then used as any other. No torch: a stand-in
    whose socket the test writes."""
    import socket
    import threading

    z = object.__new__(zygote_client._Zygote)
    z.ready, z.slow, z.lock = False, False, threading.Lock()
    z.sock, theirs = socket.socketpair()
    try:
        t0 = time.monotonic()
        assert not z.is_ready(0.3) and z.slow
        assert time.monotonic() - t0 >= 0.3
        t0 = time.monotonic()
        assert not z.is_ready(30.0)
        assert time.monotonic() - t0 < 5.0  # not waited for again
        theirs.send(b'{"ready": true}')
        assert z.is_ready(30.0)
    finally:
        z.sock.close()
        theirs.close()


@pytest.mark.slow
def test_one_eval_from_the_cli_leaves_nothing_on_its_output(tmp_path, cache_dir):
    """A process that ends while its zygotes import torch: they say nothing on the caller's terminal
    and end."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import conftest; from pathlib import Path;"
        "from kernelwright.engine import evaluate, zygote_client; cfg = conftest.make_cpu_config(sys.argv[2]);"
        "zygote_client.READY_WAIT_S = 0.0;"  # no wait: the children are exec'd, and the process ends in the import
        "[evaluate(conftest.ADD_ONE, conftest.CANDIDATES / 'py_correct.py', cfg) for _ in range(2)]"
    )
    tests = str(CANDIDATES.parents[1])
    res = subprocess.run(
        [sys.executable, "-c", code, tests, cache_dir], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_a_forked_judge_that_is_killed_is_seen_to_die(cpu_config, tmp_path):
    """kill, poll and wait as on a Popen: the exit code comes from the zygote's status pipe."""
    from kernelwright.engine import process

    cpu_config.fork_judge = True
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TMPDIR": str(tmp_path)}
    env["PYTHONPATH"] = str(CANDIDATES.parents[2] / "src") + os.pathsep + env["PYTHONPATH"]
    for _ in range(100):  # (a zygote whose import outlasted READY_WAIT_S: exec'd)
        child = process.spawn(
            process.child_argv("judge") + ["cpu", "--spare"], None, tmp_path, env, name="judge", fork=True
        )
        if type(child.proc).__name__ == "ForkedJudge":
            break
        child.stop()
        time.sleep(0.2)
    assert type(child.proc).__name__ == "ForkedJudge"
    assert child.wait_ready(60), child.log_tail()
    assert child.proc.poll() is None
    os.killpg(child.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert child.proc.wait(timeout=10) == -signal.SIGKILL
    assert time.monotonic() - t0 < 5 and child.proc.poll() == -signal.SIGKILL
    child.stop()


@pytest.mark.slow
def test_a_spare_waits_for_the_zygote_so_its_import_never_runs_beside_the_next_evaluation(cpu_config):
    """A loop's spares (the first started ahead, the next after an evaluation, off the path) are
    forked: the first waits for the zygote's torch import instead of running a judge's import beside
    it, and the next is forked once the zygote's warm-up after the first evaluation is done, so no
    evaluation is timed beside either (the README's optimize example: its second round's timing
    had overlapped the zygote's import, `timing_unstable`)."""
    from kernelwright.engine import WarmEvaluator

    zygote_client.close_all()
    with WarmEvaluator(cpu_config) as warm:
        first = warm.evaluate(ADD_ONE, CANDIDATES / "py_correct.py")
        assert first.status is Status.PASSED, first.error_log
        zyg = next(iter(zygote_client._ZYGOTES.values()))
        assert zyg.ready and first.metadata["judge_process"] == "forked"  # it waited for the import to end
        second = warm.evaluate(ADD_ONE, CANDIDATES / "py_correct.py")
    assert second.status is Status.PASSED, second.error_log
    assert second.metadata["judge_process"] == "forked"


@pytest.mark.slow
def test_a_zygote_outlives_the_thread_that_asked_for_it(cpu_config):
    """A zygote dies with the thread that started it (its parent-death signal): started by a thread
    that then ended, as a Ray actor's task thread does, it took its forked judges with it (the Ray
    executor's test: judges killed by SIGKILL without a record). Every zygote is started by one
    long-lived thread instead."""
    import threading

    zygote_client.close_all()

    def two_evaluations() -> None:  # the first one starts the zygote
        for _ in range(2):
            evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)

    t = threading.Thread(target=two_evaluations)
    t.start()
    t.join()
    assert zygote_client._ZYGOTES
    time.sleep(1.0)  # a parent-death signal would have come by now
    assert all(z.proc.poll() is None for z in zygote_client._ZYGOTES.values())
    assert _forked(cpu_config)["judge_process"] == "forked"
