"""Spare children: started ahead of their job, each serves one evaluation, verdicts as from a fresh one."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest

from conftest import ADD_ONE
from conftest import CANDIDATES as CAND
from kernelwright.core.record import Stage, Status
from kernelwright.engine import WarmEvaluator, evaluate, prestart


def test_a_prestarted_child_evaluates_like_a_fresh_one(cpu_config):
    spare = prestart(cpu_config)
    assert spare.wait_ready(120), "the spare never started up"
    r = evaluate(ADD_ONE, CAND / "py_correct.py", cpu_config, spare=spare)
    assert r.status is Status.PASSED, r.error_log
    assert len(r.trials) == cpu_config.trials and r.speedup is not None
    pre = r.metadata["prestarted"]
    assert pre["startup_s"] > 0 and pre["idle_s"] >= 0  # its start-up happened before the job came
    assert not spare.alive() and not spare.workdir.exists()  # one evaluation, then gone
    fresh = evaluate(ADD_ONE, CAND / "py_correct.py", cpu_config)
    assert "prestarted" not in fresh.metadata
    assert [t.max_abs_err for t in fresh.trials] == [t.max_abs_err for t in r.trials]  # same seeds, same verdict


def test_a_spare_that_waited_longer_than_its_startup_budget_still_evaluates(cpu_config):
    """The forge loop keeps a spare waiting while the models answer (minutes): the stage budgets
    run from its job, not from its spawn, so the wait is never counted as the candidate's time."""
    import time

    cfg = replace(cpu_config, timeouts=replace(cpu_config.timeouts, startup=3))
    spare = prestart(cfg)
    assert spare.wait_ready(120), "the spare never started up"
    time.sleep(max(0.0, spare.runner.started + 4 - time.monotonic()))  # past its start-up budget
    r = evaluate(ADD_ONE, CAND / "py_correct.py", cfg, spare=spare)
    assert r.status is Status.PASSED, (r.status, r.error_log)
    assert r.metadata["prestarted"]["idle_s"] > 0


@pytest.mark.slow
def test_a_spare_applies_the_stage_limits_and_reports_crashes(cpu_config):
    cpu_config.timeouts.correctness = 6  # the judge's own work on this tiny problem takes well under a second
    spare = prestart(cpu_config)
    r = evaluate(ADD_ONE, CAND / "py_infinite_loop.py", cpu_config, spare=spare)
    assert r.status is Status.TIMEOUT and r.error_stage is Stage.CORRECTNESS, r.error_log
    spare = prestart(cpu_config)
    r = evaluate(ADD_ONE, CAND / "py_segfault.py", cpu_config, spare=spare)
    assert r.status is Status.CRASHED and "SIGSEGV" in r.error_log


@pytest.mark.slow
def test_a_spare_is_not_used_for_another_configuration(cpu_config, tmp_path):
    spare = prestart(cpu_config)
    other = replace(cpu_config, cache_dir=str(tmp_path / "other-cache"))
    r = evaluate(ADD_ONE, CAND / "py_correct.py", other, spare=spare)
    assert r.status is Status.PASSED and "prestarted" not in r.metadata
    assert not spare.alive() and not spare.workdir.exists()  # stopped, not left waiting


def test_a_spare_that_died_while_waiting_is_replaced_by_a_fresh_child(cpu_config):
    spare = prestart(cpu_config)
    os.killpg(spare.runner.proc.pid, signal.SIGKILL)
    spare.runner.proc.wait()
    r = evaluate(ADD_ONE, CAND / "py_correct.py", cpu_config, spare=spare)
    assert r.status is Status.PASSED, r.error_log
    assert "prestarted" not in r.metadata


def test_warm_evaluator_keeps_one_spare_and_stops_it_on_close(cpu_config):
    with WarmEvaluator(cpu_config) as warm:
        warm.prestart()
        first = warm._spare
        assert first is not None and first.alive()
        r = warm.evaluate(ADD_ONE, CAND / "py_correct.py")
        assert r.status is Status.PASSED and "prestarted" in r.metadata
        second = warm._spare
        assert second is not None and second is not first and second.alive()  # the next one, started after
        r = warm.evaluate(ADD_ONE, CAND / "py_wrong.py")
        assert r.status is Status.INCORRECT and "prestarted" in r.metadata
        last = warm._spare
    assert last is not None and not last.alive() and not last.workdir.exists()


def test_a_spare_whose_judge_is_ready_after_its_runner_is_seen_ready(tmp_path):
    """The warm pool waits for a spare one slice at a time (`Spare.wait_ready(1.0)`, again and
    again). On a GPU the judge starts up after the runner (its CUDA context and clock): the runner's
    `ready`, read in one slice, must still count in the next. A `ready` taken as read once made the
    pool wait out its whole start-up budget, and every evaluation of a GPU worker waited 30 s for a
    spare that had started long before."""
    import json
    import threading
    import time
    from pathlib import Path

    from kernelwright.engine.evaluation import Spare
    from kernelwright.engine.process import Child

    class Running:
        pid = 0

        def poll(self):
            return None

    def child(fd: int) -> Child:
        return Child(proc=Running(), read_fd=fd, log_fd=-1, workdir=tmp_path, started=time.monotonic())

    (rr, rw), (jr, jw) = os.pipe(), os.pipe()
    ready = (json.dumps({"type": "ready", "t": 0}) + "\n").encode()
    os.write(rw, ready)  # the runner is up at once
    late = threading.Timer(1.5, lambda: os.write(jw, ready))  # the judge 1.5 s later
    late.start()
    spare = Spare(child(rr), child(jr), "key", tmp_path, tmp_path / "j", {}, Path(tmp_path))
    try:
        end = time.monotonic() + 10
        while not spare.wait_ready(1.0) and time.monotonic() < end:
            pass
        assert spare.wait_ready(0), "a spare whose two children both said ready is not seen ready"
        assert time.monotonic() < end - 6, "the slices waited on past both children's ready"
    finally:
        late.cancel()
        late.join()  # never a write into a descriptor closed below (and maybe reused)
        for fd in (rr, rw, jr, jw):
            os.close(fd)
