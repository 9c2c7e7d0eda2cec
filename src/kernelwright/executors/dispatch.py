"""What the local and the Ray executors share: a queued task, and the queue their slots take from.

A slot (one GPU's worker process, or one Ray actor) runs `_serve`: it takes the next task whose
prebuild is done and that has not already killed this slot's worker (unless every slot has),
runs it with the executor's own `_run`, and never loses a task to a bug in doing so.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelwright.executors.interface import EvalTask, Interrupted


@dataclass
class Job:
    task: EvalTask
    future: cf.Future
    on_stage: Callable[[str], None] | None
    submitted: float = field(default_factory=time.monotonic)
    ready: bool = False  # its prebuild is done (or there is none)
    attempts: int = 0
    avoid: set[int] = field(default_factory=set)  # slots whose worker died on it
    retried_after: list[str] = field(default_factory=list)
    prebuild: dict[str, Any] | None = None
    memo: dict[str, Any] | None = None  # its trusted builds, handed to the worker (`trusted_builds.adopt`)
    build_began: float | None = None  # time.monotonic() when a builder took its prebuild


class SlotQueue:
    """The queue and its dispatch; the executor sets `_cv`, `_queue`, `_slots` (each with a
    `thread`), `_closing` and `_inflight` in its constructor and defines `_run(slot, job)` and
    `close()` (which starts with `_drain()`)."""

    _cv: threading.Condition
    _queue: list[Job]
    _slots: list[Any]
    _closing: bool
    _inflight: int
    _cancelled: bool = False

    def _run(self, slot: Any, job: Job) -> None:  # pragma: no cover - each executor's own
        raise NotImplementedError

    def _mark_ready(self, job: Job, prebuild: dict[str, Any] | None) -> None:
        with self._cv:
            job.prebuild, job.ready = prebuild, True
            self._cv.notify_all()

    def _take(self, slot: Any) -> Job | None:
        n = len(self._slots)
        with self._cv:
            while True:
                if self._cancelled:  # a task put back after its worker was killed is not run again
                    self._fail_queued_locked()
                    return None
                for i, job in enumerate(self._queue):
                    if job.ready and (slot.index not in job.avoid or len(job.avoid) >= n):
                        self._inflight += 1
                        return self._queue.pop(i)
                if self._closing and not self._queue and self._inflight == 0:
                    return None
                self._cv.wait()

    def _cancel(self) -> None:
        """Ctrl-C: no queued task starts, each resolves with `Interrupted` (the executor then ends
        the tasks that are running: `close(cancel=True)`)."""
        with self._cv:
            self._cancelled = self._closing = True
            self._fail_queued_locked()
            self._cv.notify_all()

    def _fail_queued_locked(self) -> None:
        jobs, self._queue = self._queue, []
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(Interrupted(f"{job.task.key}: interrupted before it ran"))

    def _drain(self) -> None:
        """Let the slots finish every queued task, then wait for their threads to end."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join()

    def close(self) -> None:  # pragma: no cover - each executor's own
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _warm_up(self, slot: Any) -> None:
        """What a slot starts before its first task (its worker, where it has one to start)."""

    def _serve(self, slot: Any) -> None:
        try:
            self._warm_up(slot)
        except Exception:
            pass  # a slot that could not warm up starts its worker with its first task
        while True:
            job = self._take(slot)
            if job is None:
                return
            try:
                self._run(slot, job)
            except BaseException as exc:  # never lose a task to a bug here
                if not job.future.done():
                    job.future.set_exception(exc)
            finally:
                with self._cv:
                    self._inflight -= 1
                    self._cv.notify_all()


def safe_stage(callback: Callable[[str], None], stage: str) -> None:
    try:
        callback(stage)
    except Exception:
        pass  # a progress display must not break an evaluation
