"""Where each candidate of a suite is in the pipeline, and how busy the GPUs are.

    build queued -> building -> waiting for a GPU -> on the GPU -> done

The executors report a task's stages through its `on_stage` callback (`prebuild` when its build
is queued, `building` and `built` around the build, then the evaluation's own stages: startup,
build, init, correctness, timing, profile); `Pipeline.stage` files each task under its state.
The GPUs' busy share is the engine's own GPU work (the correctness and timing stages of every
finished record) over the wall time the suite's GPUs have been held: `busy_s / (elapsed x gpus)`.
The time the GPUs waited for builds (`starved_s`): GPU-seconds during which a GPU had no task,
no task was waiting for one, and builds were still queued or running; where that is a fifth of
the GPUs' time or more, the builds were the suite's bottleneck, and `bottleneck` says so. So too
for the evaluations' waits for a spare still starting up (`spare_wait_s` of each record), beyond
each GPU's first (which starts up alone): a fifth of the GPUs' time or more is a pool whose spares
are not ready in time, which `bottleneck` says in a second sentence.
Thread-safe: the executors call `stage` from their own threads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

STATES = ("build queued", "building", "waiting for a GPU", "on the GPU", "done")
BUILD_BOUND = 0.2  # the share of the GPUs' time spent waiting for builds that makes them the bottleneck
SPARE_BOUND = 0.2  # the same for the waits for spares, beyond each GPU's first

_OF_STAGE = {
    "prebuild": "build queued",
    "building": "building",
    "built": "waiting for a GPU",
    "queued": "waiting for a GPU",
}


def state_of(stage: str) -> str:
    """The pipeline state of a task whose executor just reported `stage`."""
    return _OF_STAGE.get(stage, "on the GPU")


def gpu_work_s(result: Any) -> float:
    """The engine's GPU work in one record: its correctness and timing stages (seconds)."""
    st = result.stage_times
    return float(st.correctness_s or 0.0) + float(st.timing_s or 0.0)


def spare_wait_s(result: Any) -> float:
    """How long one record's evaluation waited for a spare still starting up (the warm pool's)."""
    wait = (getattr(result, "metadata", None) or {}).get("spare_wait_s")
    return float(wait) if isinstance(wait, int | float) else 0.0


class Pipeline:
    def __init__(self, gpus: int = 1):
        self.gpus = max(1, gpus)
        self._state: dict[str, str] = {}
        self._lock = threading.Lock()
        self.busy_s = 0.0
        self.starved_s = 0.0  # GPU-seconds a GPU stood free while the only tasks left to run were building
        self.spare_waits: list[float] = []  # each finished record's wait for a spare still starting up
        self.t0 = time.monotonic()
        self._mark = self.t0
        # a driver that evaluates in order (one GPU, the next task waits for its own build whatever
        # else is ready) measures its waits itself (`waited_for_build`), not from the states
        self.in_order = False

    def waited_for_build(self, seconds: float) -> None:
        """The GPU stood free for `seconds` while the next task's build ran (an in-order driver)."""
        with self._lock:
            self.starved_s += max(0.0, seconds)

    def _tick(self) -> None:
        """Adds the time since the last change to `starved_s`, for each GPU that stood free (under the lock)."""
        now = time.monotonic()
        c = Counter(self._state.values())
        if not self.in_order and c["build queued"] + c["building"] and not c["waiting for a GPU"]:
            self.starved_s += max(0, self.gpus - c["on the GPU"]) * max(0.0, now - self._mark)
        self._mark = now

    def queued(self, key: str, state: str = "waiting for a GPU") -> None:
        with self._lock:
            self._tick()
            self._state[key] = state

    def stage(self, key: str, stage: str) -> str:
        state = state_of(stage)
        with self._lock:
            self._tick()
            if self._state.get(key) != "done":
                self._state[key] = state
        return state

    def done(self, key: str, result: Any = None) -> None:
        with self._lock:
            self._tick()
            self._state[key] = "done"
            if result is not None:
                self.busy_s += gpu_work_s(result)
                self.spare_waits.append(spare_wait_s(result))

    def starved_share(self) -> float:
        """The share of the GPUs' time they waited for builds."""
        with self._lock:
            self._tick()
        wall = (time.monotonic() - self.t0) * self.gpus
        return self.starved_s / wall if wall > 0 else 0.0

    def spare_wait_share(self) -> tuple[float, float]:
        """(GPU-seconds, share of the GPUs' time) the evaluations waited for a spare still starting
        up, as many of the longest waits left out as there are GPUs: each worker's first spare starts
        up alone, on the path by design, and its wait is the longest where the pool is sound."""
        with self._lock:
            waits = sorted(self.spare_waits)
        beyond = sum(waits[: max(0, len(waits) - self.gpus)])
        wall = (time.monotonic() - self.t0) * self.gpus
        return beyond, (beyond / wall if wall > 0 else 0.0)

    def bottleneck(self) -> str:
        """A line where the builds, or the waits for spares, held the GPUs back for a fifth of their
        time or more (`BUILD_BOUND`, `SPARE_BOUND`), else ""."""
        said = []
        share = self.starved_share()
        if share >= BUILD_BOUND:
            said.append(
                f"builds were the bottleneck: the GPUs stood free for want of a built candidate {100 * share:.0f}% "
                f"of their time ({self.starved_s:.0f} GPU-s); more build workers (--build-workers) or a build "
                "cache warmed by an earlier run would shorten the suite"
            )
        waited, share = self.spare_wait_share()
        if share >= SPARE_BOUND:
            said.append(
                f"evaluations waited for a spare still starting up {100 * share:.0f}% of the GPUs' time "
                f"({waited:.0f} GPU-s beyond each GPU's first): the spares were not ready in time (a machine "
                "too loaded for them to start up, or spares that fail: each record's metadata.spare_wait_s)"
            )
        return "; ".join(said)

    def counts(self) -> dict[str, int]:
        with self._lock:
            c = Counter(self._state.values())
        return {s: c.get(s, 0) for s in STATES}

    def busy_share(self) -> float:
        wall = (time.monotonic() - self.t0) * self.gpus
        return self.busy_s / wall if wall > 0 else 0.0

    def line(self) -> str:
        c = self.counts()
        return (
            f"builds queued {c['build queued']}, building {c['building']}, waiting {c['waiting for a GPU']}, "
            f"on the GPU {c['on the GPU']}, done {c['done']}; GPU busy {100 * self.busy_share():.0f}%"
        )
