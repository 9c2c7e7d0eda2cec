"""A pool of warm evaluations for one GPU: `WarmPool(config, size=2).evaluate(...)`.

`engine.WarmEvaluator` keeps one spare (a runner and a judge with python, torch and the CUDA
context up) and starts it when an evaluation ends. That suits the forge loop, which spends
seconds in its models between evaluations, but not a suite, where the next candidate is
waiting: its spare is still starting (4-6 s on an H100 machine) when it is handed over, and the
start-up sits on the GPU's path every time.

Here `size` spares are kept, oldest first: when an evaluation takes one, a replacement is started
at once in a background thread, so the spare the next evaluation takes has had a whole
evaluation's time to start up. Every evaluation still gets fresh processes (a spare serves one).

Timing stays honest: a replacement is never started while the current evaluation is in its
timing stage (it waits for the stage to end), and where the machine has cores to spare
(`startup_cpus`, given by the local executor), spares start up there and are moved onto the
GPU worker's own cores (`home_cpus`) when they are handed over, so their start-up never runs on
the cores that feed the GPU being timed. On a machine without spare cores a start-up begun
before the timing stage may still overlap it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult


class WarmPool:
    def __init__(self, config: EvalConfig | None = None, size: int = 2, startup_cpus: set[int] | None = None,
                 home_cpus: set[int] | None = None):
        self.config = config or EvalConfig()
        self.size = max(0, size)
        self.startup_cpus = startup_cpus or None
        self.home_cpus = home_cpus or None
        self._spares: deque = deque()
        self._lock = threading.Lock()
        self._not_timing = threading.Event()
        self._not_timing.set()
        self._refill: threading.Thread | None = None
        self._closed = False
        self.started = 0  # spares started (for tests and benchmarks)

    # -- spares --
    def prestart(self) -> None:
        """Start filling the pool (in the background: the children start up while the caller goes on)."""
        self._refill_async()

    def _fill(self) -> None:
        try:
            self._fill_loop()
        finally:  # however it ended: a later take starts a new refill
            with self._lock:
                if self._refill is threading.current_thread():
                    self._refill = None

    def _fill_loop(self) -> None:
        from kernelwright.engine import EngineError
        from kernelwright.engine.evaluation import prestart

        if self.startup_cpus and hasattr(os, "sched_setaffinity"):
            try:  # this thread only (Linux): the children it spawns inherit its cores
                os.sched_setaffinity(0, self.startup_cpus)
            except OSError:
                pass
        while True:
            with self._lock:
                if self._closed or len(self._spares) >= self.size:
                    self._refill = None  # under the lock: a take after this starts a new refill
                    return
            self._not_timing.wait()  # never start one up while this GPU's evaluation is timed
            try:
                spare = prestart(self.config)
            except EngineError:
                with self._lock:
                    self._refill = None
                return  # the next evaluation starts its own child and reports the problem
            with self._lock:
                if self._closed:
                    self._refill = None
                    spare.discard()
                    return
                self._spares.append(spare)
                self.started += 1

    def _refill_async(self) -> None:
        with self._lock:
            if self._closed or self._refill is not None:
                return
            self._refill = threading.Thread(target=self._fill, name="kw-warm-pool", daemon=True)
            self._refill.start()

    def _take(self):
        with self._lock:
            while self._spares:
                spare = self._spares.popleft()
                if spare.alive():
                    break
                spare.discard()
            else:
                return None
        if self.home_cpus and self.startup_cpus:
            for child in (spare.runner, spare.judge):
                move_tree(child.proc.pid, self.home_cpus)
        return spare

    def spares(self) -> int:
        with self._lock:
            return len(self._spares)

    # -- evaluations --
    def evaluate(self, problem: str | Path, candidate: str | Path | None = None, config: EvalConfig | None = None,
                 *, on_stage: Callable[[str], None] | None = None, **kwargs: Any) -> EvalResult:
        """`engine.evaluate` on the oldest spare (a fresh child where none is left)."""
        from kernelwright.engine.evaluation import evaluate

        spare = self._take()
        self._refill_async()

        def stage(s: str) -> None:
            if s == "timing":
                self._not_timing.clear()
            else:
                self._not_timing.set()
            if on_stage is not None:
                on_stage(s)

        try:
            return evaluate(problem, candidate, config or self.config, spare=spare, on_stage=stage, **kwargs)
        finally:
            self._not_timing.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._not_timing.set()
        with self._lock:
            refill = self._refill
        if refill is not None:
            refill.join()
        with self._lock:
            spares, self._spares = list(self._spares), deque()
        for spare in spares:
            spare.discard()

    def __enter__(self) -> "WarmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def move_tree(pid: int, cpus: set[int]) -> None:
    """Move a process, every thread of it and everything it started onto `cpus` (best effort)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        tasks = Path(f"/proc/{p}/task")
        try:
            tids = [int(t.name) for t in tasks.iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
            try:
                todo += [int(c) for c in (tasks / str(tid) / "children").read_text().split()]
            except (OSError, ValueError):
                pass
