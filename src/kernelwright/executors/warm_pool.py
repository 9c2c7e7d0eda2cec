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
timing stage (it waits for the stage to end). Where the machine has cores to spare
(`startup_cpus`, given by the local executor), spares start up there and are moved onto the
GPU worker's own cores (`home_cpus`) when they are handed over, so their start-up never runs on
the cores that feed the GPU being timed. Where it has not (`pause_while_timing`, the default
then), the spares still starting up are paused (SIGSTOP, every process of each) while the
current evaluation is timed and resumed (SIGCONT) when its timing ends: on a 2-core machine a
start-up running beside the timing stage made that stage up to 5x longer (its measurements
repeat while they are unstable), and the times less trustworthy.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.engine.process import process_tree


class WarmPool:
    """Spares for one GPU's evaluations, which run one at a time (a GPU worker's loop)."""

    def __init__(
        self,
        config: EvalConfig | None = None,
        size: int = 2,
        startup_cpus: set[int] | None = None,
        home_cpus: set[int] | None = None,
        pause_while_timing: bool | None = None,
        first_alone: bool = False,
    ):
        self.config = resolve_config(config or EvalConfig())  # "auto" made concrete once (engine/config_resolution.py)
        self.size = max(0, size)
        self.startup_cpus = startup_cpus or None
        self.home_cpus = home_cpus or None
        self.pause_while_timing = (self.startup_cpus is None) if pause_while_timing is None else pause_while_timing
        self._paused = False
        self.pauses = 0  # times the spares were paused (for tests and benchmarks)
        self._spares: deque = deque()
        self._cv = threading.Condition()
        self._not_timing = threading.Event()
        self._not_timing.set()
        # One long-lived thread starts every spare: a child's parent-death signal (PR_SET_PDEATHSIG)
        # fires when the *thread* that started it ends, so a short-lived thread would take its
        # spares with it.
        self._starter: threading.Thread | None = None
        self._closed = False
        self._start_failed = False  # the last start raised EngineError: takes do not wait for the starter
        self.started = 0  # spares started (for tests and benchmarks)
        self._current: Any = None  # the spare the running evaluation took (`cancel`)
        # the first spare starts up alone (`_first_ready`): a server's, whose first job may come at once
        self.first_alone = first_alone
        self.first_ready_s: float | None = None  # how long it took (for tests and benchmarks)
        self._starting: Any = None  # the first spare, while it starts up before it joins the pool

    # -- spares --
    def prestart(self) -> None:
        """Start filling the pool (in the background: the children start up while the caller goes on)."""
        with self._cv:
            if self._starter is None and not self._closed and self.size > 0:
                self._starter = threading.Thread(target=self._start_spares, name="kw-warm-pool", daemon=True)
                self._starter.start()
            self._cv.notify_all()

    def _start_spares(self) -> None:
        from kernelwright.engine.evaluation import prestart

        if self.startup_cpus and hasattr(os, "sched_setaffinity"):
            try:  # this thread only (Linux): the children it spawns inherit its cores
                os.sched_setaffinity(0, self.startup_cpus)
            except OSError:
                pass
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or len(self._spares) < self.size)
                if self._closed:
                    return
            self._not_timing.wait()  # never start one up while this GPU's evaluation is timed
            try:
                spare = prestart(self.config)
                if self.first_alone and self.started == 0 and not self._first_ready(spare):
                    return  # the pool closed while it started
            except Exception:  # EngineError, or a bug: never lose the starter (nor spin); the evaluation
                with self._cv:  # starts its own child and reports the problem; try again at the next take
                    self._start_failed = True
                    self._cv.notify_all()
                    self._cv.wait()
                continue
            with self._cv:
                if self._closed:
                    spare.discard()
                    return
                self._spares.append(spare)
                self._start_failed = False
                self.started += 1
                if self._paused:  # spawned just as the timing began
                    _signal_spare(spare, signal.SIGSTOP)
                self._cv.notify_all()

    def _first_ready(self, spare: Any) -> bool:
        """The first spare starts up alone, and joins the pool once it is ready: the first job waits
        for it, and a second spare starting beside it (python, torch, the CUDA context, twice over)
        would slow it down. Paused with the pool while it starts; raises (the spare discarded) where
        it dies or does not start up within the start-up budget; False (the spare discarded) where
        the pool closed meanwhile."""
        from kernelwright.engine import EngineError

        t0 = time.monotonic()
        with self._cv:
            self._starting = spare
            if self._paused:
                _signal_spare(spare, signal.SIGSTOP)
        try:
            end = t0 + float(self.config.timeouts.startup)
            while not spare.wait_ready(min(1.0, max(0.0, end - time.monotonic()))):
                if self._closed:
                    spare.discard()
                    return False
                if not spare.alive() or time.monotonic() >= end:
                    spare.discard()
                    raise EngineError("the pool's first spare did not start up")
        finally:
            with self._cv:
                self._starting = None
        self.first_ready_s = time.monotonic() - t0
        return True

    def _take(self, wait_s: float = 30.0):
        """The oldest live spare; where none is left but the starter is starting one (the first
        evaluations of a pool), wait for it up to `wait_s` rather than start a child beside it."""
        spare = None
        with self._cv:
            if not self._spares and self._starter is not None and not self._closed and not self._start_failed:
                self._cv.wait_for(lambda: self._spares or self._closed, timeout=wait_s)
            while self._spares:
                candidate = self._spares.popleft()
                if candidate.alive():
                    spare = candidate
                    break
                candidate.discard()
            if spare is not None and self._paused:  # taken while an evaluation's timing paused the pool (a
                _signal_spare(spare, signal.SIGCONT)  # later draw's, engine/draws.py): no resume reaches it after
            self._cv.notify_all()  # the starter replaces it
        if spare is not None and self.home_cpus and self.startup_cpus:
            for child in (spare.runner, spare.judge):
                move_tree(child.proc.pid, self.home_cpus)
        return spare

    def spares(self) -> int:
        with self._cv:
            return len(self._spares)

    # -- evaluations --
    def evaluate(
        self,
        problem: str | Path,
        candidate: str | Path | None = None,
        config: EvalConfig | None = None,
        *,
        on_stage: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> EvalResult:
        """`engine.evaluate` on the oldest spare (fresh children where none is left, started here as
        a spare of the job's own configuration, so that `cancel` can stop them too)."""
        from kernelwright.engine.errors import EngineError
        from kernelwright.engine.evaluation import evaluate, prestart

        self.prestart()
        t_take = time.monotonic()
        spare = self._take()
        waited = time.monotonic() - t_take
        if spare is None:
            try:
                spare = prestart(config or self.config)
            except EngineError:
                spare = None  # (evaluate says why, on its own children)
        self._current = spare

        def stage(s: str) -> None:
            if s == "timing":
                self._not_timing.clear()
                self._pause(True)
            else:
                self._pause(False)
                self._not_timing.set()
            if on_stage is not None:
                on_stage(s)

        def children(took: Any) -> None:  # the spare, or the children started where it did not fit
            self._current = took

        try:
            # later draws (timing.draws > 1) take the pool's spares too, without waiting: the starter waits for
            # the timing that just ended to be followed by another stage, so a wait here could only time out
            kwargs.setdefault("more_spares", lambda: self._take(0.0))
            result = evaluate(
                problem, candidate, config or self.config, spare=spare, on_stage=stage, on_children=children, **kwargs
            )
            # the wait for a spare still starting up: on the evaluation's path, before its own clock
            result.metadata["spare_wait_s"] = round(waited, 3)
            return result
        finally:
            self._current = None
            self._pause(False)
            self._not_timing.set()

    def cancel(self) -> bool:
        """Stop the evaluation running now (its caller is gone): its runner's and judge's process
        groups are killed, so `evaluate` returns at once with a record nobody reads. False where
        none runs."""
        spare = self._current
        if spare is None:
            return False
        from kernelwright.engine.process import kill_group

        for child in (spare.runner, spare.judge):
            kill_group(child.proc)
        return True

    def _pause(self, on: bool) -> None:
        """Pause (SIGSTOP) or resume (SIGCONT) the spares in the pool, where asked to."""
        if not self.pause_while_timing:
            return
        with self._cv:
            if self._paused == on:
                return
            self._paused = on
            if on:
                self.pauses += 1
            for spare in [*self._spares, *([self._starting] if self._starting is not None else [])]:
                _signal_spare(spare, signal.SIGSTOP if on else signal.SIGCONT)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            starter = self._starter
        self._not_timing.set()
        if starter is not None:
            starter.join()
        self._pause(False)
        with self._cv:
            spares, self._spares = list(self._spares), deque()
        for spare in spares:
            spare.discard()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def move_tree(pid: int, cpus: set[int]) -> None:
    """Move a process, every thread of it and everything it started onto `cpus` (best effort)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    for _, tids in process_tree(pid):
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass


def _signal_spare(spare, sig: int) -> None:
    """SIGSTOP or SIGCONT every process of a spare (its runner's and its judge's trees)."""
    for child in (spare.runner, spare.judge):
        for p, _ in process_tree(child.proc.pid):
            try:
                os.kill(p, sig)
            except OSError:
                pass
