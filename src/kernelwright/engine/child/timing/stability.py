"""Timing that says when it is not to be trusted (`timing_unstable`): the timing stage's rules.

On a machine shared with other work a speed-up can be precise in one run and wrong in the
next: the reference's intra-op threads contend with other processes on a CPU, a host paces a
GPU's small launches, clocks change. Each run's own band can stay tight while the medians of two
runs differ tenfold. This module

- controls what it can: one fixed, recorded CPU thread count for candidate and reference alike
  (`TimingConfig.cpu_threads`);
- detects what it cannot, and says so (`assess`, one line a reason): on a CPU, load on the
  timing threads' cores (other processes' busy cores over the stage: the machine's busy time from
  /proc/stat less this process's own; runnable tasks; the load average); on either device, a side
  whose per-call medians drift between the first and the second half of the interleaved windows,
  or whose windows spread (p90/p10: `max_band` on a CPU, the narrower `max_band_device` on a GPU);
  on the judge's wall clock, windows whose fixed costs did not all come off (`unresolved`) or
  whose own speed-ups spread (`ratio_spread`).

It never repeats a measurement: the window plan (`window_plan.py`) sets the stage's budget. The
rules are pure functions of samples and load facts, tested with fake samples.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from kernelwright.core.config import TimingConfig


@dataclass
class LoadFacts:
    cores: int  # cores this process may run on
    threads: int  # intra-op threads used for timing (CPU)
    others_busy_cores: float | None = None  # cores kept busy by other processes during the timing stage
    others_runnable: float | None = None  # other runnable tasks, mean of readings during the stage
    loadavg_1m: float | None = None


# ---- facts about the machine ---------------------------------------------------------------------


def _proc_stat() -> tuple[float, float] | None:
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        vals = [float(v) for v in parts]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
        return sum(vals), idle
    except (OSError, ValueError, IndexError):
        return None


def _procs_running() -> int | None:
    """Runnable tasks on the machine right now (/proc/stat), this reading thread included."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class CpuLoadMonitor:
    """Load from *other* processes over an interval, at no cost to it: the cores they kept busy
    (the machine's busy time from /proc/stat minus this process's own CPU time, over the wall
    time), and how many of their tasks were runnable (read at `tick()`s). On a saturated machine
    the busy cores cannot exceed what this process leaves; the runnable count still shows the queue."""

    def __init__(self) -> None:
        self.start = self._read()
        self.runnable: list[int] = []
        self.tick()

    def tick(self) -> None:
        n = _procs_running()
        if n is not None:
            self.runnable.append(max(0, n - 1))  # less the thread reading it

    def others_runnable(self) -> float | None:
        return statistics.fmean(self.runnable) if self.runnable else None

    @staticmethod
    def _read() -> tuple[tuple[float, float] | None, float, float]:
        t = os.times()
        return _proc_stat(), t.user + t.system, time.perf_counter()

    def others_busy_cores(self) -> float | None:
        (a, own_a, wall_a), (b, own_b, wall_b) = self.start, self._read()
        if a is None or b is None or b[0] <= a[0] or wall_b <= wall_a:
            return None
        ncpu = os.cpu_count() or 1
        busy_cores = (1.0 - (b[1] - a[1]) / (b[0] - a[0])) * ncpu
        own_cores = (own_b - own_a) / (wall_b - wall_a)
        return max(0.0, busy_cores - own_cores)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_threads(cfg: TimingConfig, cores: int) -> int:
    """The fixed CPU thread count: `cpu_threads` when set, else every core this process may use."""
    return cfg.cpu_threads if cfg.cpu_threads > 0 else max(1, cores)


# ---- the decision ----------------------------------------------------------------------------------


def drift(samples: list[float]) -> float:
    """|median(second half) - median(first half)| / the smaller median of the two (samples in time order)."""
    n = len(samples)
    if n < 6:
        return 0.0
    a, b = statistics.median(samples[: n // 2]), statistics.median(samples[n // 2 :])
    lo = min(a, b)
    return abs(b - a) / lo if lo > 0 else 0.0


def band(samples: list[float]) -> float:
    """p90 / p10 of the samples."""
    s = sorted(samples)
    if not s:
        return 1.0
    p10 = s[int(round(0.1 * (len(s) - 1)))]
    p90 = s[int(round(0.9 * (len(s) - 1)))]
    return p90 / p10 if p10 > 0 else 1.0


def sample_problems(
    samples: dict[str, list[float]], cfg: TimingConfig, on_gpu: bool = False, planned: int | None = None
) -> list[str]:
    """Reasons found in the samples themselves: drift between the halves, a wide band (on a GPU the
    narrower `max_band_device`: there a side's windows spread only where something besides its device
    work paces them). `planned`: the drift is of the planned windows only (more were timed because a
    burst slowed some of them: `timing.more_windows`; a burst is not a drift)."""
    reasons = []
    limit = cfg.max_band_device if on_gpu else cfg.max_band
    for name in ("reference", "candidate"):
        xs = samples.get(name)
        if not xs:
            continue
        d, w = drift(xs[:planned]), band(xs)
        if d > cfg.max_drift:
            reasons.append(
                f"the {name}'s median time moved by {100 * d:.0f}% between the first and the second half "
                f"of the stage (more than {100 * cfg.max_drift:.0f}%)"
            )
        if w > limit and on_gpu:
            reasons.append(
                f"the {name}'s windows spread widely (p90/p10 = {w:.3g}, more than {limit:g} on a GPU, where "
                "work the device paces reads within a few percent): its calls were paced by the host, or "
                "slowed at random; its time moves with the machine's load, for any timer"
            )
        elif w > limit:
            reasons.append(
                f"the {name}'s times spread widely (p90/p10 = {w:.2g}, more than {limit:g}): "
                "calls were slowed at random"
            )
    return reasons


def unresolved(judge_ms: list[float], runner_ms: list[float], factor: float) -> str:
    """Why the candidate's windows on the judge's wall clock do not resolve its time ('' if they
    do): per call, the judge's figure (the window's wall less what the judge measured of its fixed
    costs) against the runner's own account of its calls, window by window. Where the judge's median
    is over `factor` times the runner's, what a window costs besides the calls (the hand-over, the
    wake-ups, the views, the commit) did not all come off, and the speed-up says more about the
    window than about the code. The runner's account is the candidate's word: it can only withhold
    trust here, never grant it (a runner that under-reports gets its own speed-up distrusted)."""
    ratios = [j / r for j, r in zip(judge_ms, runner_ms, strict=True) if r > 0 and j > 0]
    if factor <= 0 or not ratios:
        return ""
    m = statistics.median(ratios)
    if m <= factor:
        return ""
    return (
        f"the judge's windows gave the candidate {m:.3g}x the time its own calls took (more than {factor:g}x): "
        "what a window costs besides the calls did not all come off, so the speed-up is not resolved; "
        "larger inputs (more work a call) or a quieter machine resolve it"
    )


def ratio_spread(reference_ms: list[float], candidate_ms: list[float], limit: float) -> str:
    """Why the windows' speed-ups do not agree ('' if they do): each timed window's speed-up (the
    reference's window over the candidate's beside it, the same draw) and their p90/p10. Each side
    alone can look steady while the two drift apart from one window to the next (the machine's
    other work falls on one side's windows); a speed-up that moves more than `limit` between
    windows is not one figure."""
    ratios = sorted(r / c for r, c in zip(reference_ms, candidate_ms, strict=True) if r > 0 and c > 0)
    if limit <= 0 or len(ratios) < 3:
        return ""
    w = band(ratios)
    if w <= limit:
        return ""
    return (
        f"the windows' speed-ups spread from {ratios[0]:.3g}x to {ratios[-1]:.3g}x (p90/p10 = {w:.3g}, more than "
        f"{limit:g}): the speed-up is not one figure; time on an idle machine"
    )


def load_problems(load: LoadFacts, cfg: TimingConfig) -> list[str]:
    """Reasons found in the machine (a CPU's timing): other processes on the timing threads' cores.
    (On a GPU the runner is another process on the device by design, and the GPU's turn keeps
    kernelwright's other evaluations' checks, windows and start-up anchors off it, not the rest of
    their start-ups: engine/child/gpu_turn.py; what the host's load does to a GPU's windows shows in their band.)"""
    reasons = []
    busy = load.others_busy_cores
    runnable = load.others_runnable
    free_busy = load.cores - busy if busy is not None else None
    free_queue = load.cores - runnable if runnable is not None else None
    if (free_busy is not None and free_busy < load.threads - cfg.load_slack_cores) or (
        free_queue is not None and free_queue < load.threads - cfg.load_slack_cores
    ):
        reasons.append(
            f"other processes kept {busy or 0:.1f} of {load.cores} cores busy "
            f"({runnable or 0:.1f} of their tasks runnable on average) while {load.threads} timing "
            f"thread(s) needed them (load average {load.loadavg_1m or 0:.1f}); time on an idle "
            "machine, or with fewer threads (timing.cpu_threads)"
        )
    return reasons


def assess(
    samples: dict[str, list[float]], load: LoadFacts, cfg: TimingConfig, on_gpu: bool, planned: int | None = None
) -> list[str]:
    """Every reason in the samples and the machine not to trust the figures (empty: trust them)."""
    return sample_problems(samples, cfg, on_gpu, planned) + ([] if on_gpu else load_problems(load, cfg))
