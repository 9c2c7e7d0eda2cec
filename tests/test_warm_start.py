"""A suite's evaluations start from warm processes: the local executor starts its workers (their
python, torch and first spares) when it is made, not with its first task, and a record tells how
long its evaluation waited for a spare still starting up (`spare_wait_s`)."""

from __future__ import annotations

import time

import pytest

from conftest import ADD_ONE, CANDIDATES, make_cpu_config
from kernelwright.core.record import Status
from kernelwright.executors.interface import EvalTask
from kernelwright.executors.local import LocalExecutor
from kernelwright.suites.accounting import startup_on_path


@pytest.mark.slow
def test_the_executor_starts_its_worker_before_its_first_task_and_the_task_runs_there(cache_dir):
    cfg = make_cpu_config(cache_dir)
    cfg.trials, cfg.shapes = 2, "off"
    with LocalExecutor(cfg, build_workers=0, spares=1) as ex:
        slot = ex._slots[0]
        end = time.monotonic() + 30
        while slot.worker is None and time.monotonic() < end:
            time.sleep(0.05)
        assert slot.worker is not None and slot.worker.alive()  # no task was submitted yet
        warm = slot.worker.name
        task = EvalTask(key="warm/1", problem=ADD_ONE, candidate_text=(CANDIDATES / "py_correct.py").read_text())
        result = ex.submit(task).result()
    assert result.status is Status.PASSED, result.error_log
    assert result.metadata["executor"]["worker"] == warm  # the worker started ahead, not one started for it
    assert isinstance(result.metadata["spare_wait_s"], float) and result.metadata["spare_wait_s"] >= 0
    waited = startup_on_path([result.to_dict()])
    # (the sum is given to 0.01 s: compared at that precision, a start-up span under 5 ms rounds away)
    assert waited["sum_s"] is not None and waited["sum_s"] >= round(result.metadata["spare_wait_s"], 2)


def test_a_servers_pool_starts_its_first_spare_alone_then_the_next(cache_dir, monkeypatch):
    from kernelwright.engine import evaluation
    from kernelwright.executors.warm_pool import WarmPool

    spawned: list[float] = []
    real = evaluation.prestart

    def prestart(config):
        spawned.append(time.monotonic())
        return real(config)

    monkeypatch.setattr(evaluation, "prestart", prestart)
    pool = WarmPool(make_cpu_config(cache_dir), size=2, first_alone=True)
    try:
        pool.prestart()
        end = time.monotonic() + 90
        while len(spawned) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert len(spawned) == 2 and pool.first_ready_s is not None
        # the second was started only once the first had started up (python and torch imported)
        assert spawned[1] - spawned[0] >= pool.first_ready_s > 0
        assert pool.spares() >= 1
    finally:
        pool.close()


def test_a_pool_closed_while_its_first_spare_starts_closes_at_once(cache_dir):
    from kernelwright.executors.warm_pool import WarmPool

    pool = WarmPool(make_cpu_config(cache_dir), size=2, first_alone=True)
    pool.prestart()
    end = time.monotonic() + 30
    while pool._starting is None and time.monotonic() < end:
        time.sleep(0.01)
    t0 = time.monotonic()
    pool.close()  # the first spare is still starting up: discarded, the starter gone
    assert time.monotonic() - t0 < 10 and pool.spares() == 0
