"""Where the work of one machine goes: which GPUs, which CPU cores feed each, and when builds wait.

Timing stays honest under concurrency by two rules:
- one evaluation worker per GPU, each running one evaluation at a time, so two timed evaluations
  never share a GPU;
- no build on the cores that feed a GPU while it is being timed. Where the machine has cores to
  spare, each GPU worker gets its own cores and builds run on the rest (`plan_cores`); where it
  has not, builds share all cores and a new build waits while any GPU is in its timing stage
  (`TimingGate`).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass


def detect_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (no CUDA context is created)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible_entries(visible)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def visible_entries(value: str) -> list[str]:
    """A CUDA_VISIBLE_DEVICES value's entries as CUDA reads them: up to the first that names no GPU
    (`-1`, an empty or malformed entry), after which the driver ignores the rest (`1,-1,0` is GPU 1
    alone). An index or UUID the machine lacks is not checked here: that needs the driver."""
    entries: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def parse_gpus(text: str | None) -> list[str] | None:
    """`--gpus 0,1,3` -> ["0", "1", "3"]; None or "" -> None (all visible GPUs)."""
    if not text:
        return None
    gpus = [g.strip() for g in text.split(",") if g.strip()]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus names a GPU twice ({text}); name each GPU once, e.g. --gpus 0,1")
    return gpus


def refuse_unseen(gpus: list[str]) -> None:
    """ValueError where a GPU of `gpus` is outside this process's CUDA_VISIBLE_DEVICES. Each worker
    gets its entry as its own CUDA_VISIBLE_DEVICES, so such an entry would reach a GPU the caller was
    not given (on a shared machine, someone else's). Nothing to check where the variable is unset."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return
    visible = detect_gpus()
    outside = [g for g in gpus if g not in visible]
    if not outside:
        return
    if not visible:
        raise ValueError(
            f"--gpus {','.join(gpus)}: this shell's CUDA_VISIBLE_DEVICES gives no GPU; unset it, or set it to"
            " the GPUs to use"
        )
    raise ValueError(
        f"--gpus {','.join(gpus)}: {','.join(outside)} not among this shell's CUDA_VISIBLE_DEVICES"
        f" ({','.join(visible)}); name GPUs as it does, e.g. --gpus {','.join(visible[:2])}, or leave"
        " --gpus out for all of them"
    )


@dataclass
class CorePlan:
    workers: list[set[int] | None]  # the cores of each GPU worker (None: not pinned)
    builds: set[int] | None  # the cores of the build children (None: not pinned)
    scarce: bool  # no cores to spare: builds wait while any GPU is timed

    def describe(self) -> str:
        if self.scarce:
            return "cores shared; builds wait while a GPU is timed"
        return f"{len(self.builds or ())} build cores, " + ", ".join(
            f"{len(c or ())} per GPU" for c in self.workers[:1]
        )


def plan_cores(
    n_workers: int, cores_per_worker: int = 2, min_build_cores: int = 2, available: list[int] | None = None
) -> CorePlan:
    """Give each GPU worker `cores_per_worker` cores of its own and builds the rest, when at least
    `min_build_cores` remain; otherwise pin nothing and gate builds on timing."""
    cores = sorted(
        available
        if available is not None
        else (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))
    )
    need = n_workers * cores_per_worker + min_build_cores
    if n_workers < 1 or len(cores) < need:
        return CorePlan([None] * max(n_workers, 0), None, True)
    workers: list[set[int] | None] = [
        set(cores[i * cores_per_worker : (i + 1) * cores_per_worker]) for i in range(n_workers)
    ]
    return CorePlan(workers, set(cores[n_workers * cores_per_worker :]), False)


def default_build_workers(plan: CorePlan, cores_per_build: int = 2) -> int:
    """Builds at once, sized to the machine: one per `cores_per_build` of the build cores where
    builds have cores of their own (a one-kernel load_inline build is two compiler processes,
    main.cpp and cuda.cu, most of its time in one), else a quarter of the cores (1 to 4)."""
    if not plan.scarce and plan.builds:
        return max(1, len(plan.builds) // cores_per_build)
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class TimingGate:
    """How many GPUs are in their timing stage; `wait_clear` holds a new build back while any is.

    Inactive (`active=False`, cores to spare), it counts but never holds anything back.
    """

    def __init__(self, active: bool):
        self.active = active
        self._timing = 0
        self._cv = threading.Condition()
        self.held_s = 0.0  # total time builds were held back

    def enter(self) -> None:
        with self._cv:
            self._timing += 1

    def leave(self) -> None:
        with self._cv:
            self._timing = max(0, self._timing - 1)
            self._cv.notify_all()

    @property
    def timing(self) -> int:
        return self._timing

    def wait_clear(self) -> float:
        """Block while a GPU is being timed (when active); the seconds waited."""
        if not self.active:
            return 0.0
        t0 = time.monotonic()
        with self._cv:
            self._cv.wait_for(lambda: self._timing == 0)
            waited = time.monotonic() - t0
            self.held_s += waited
        return waited
