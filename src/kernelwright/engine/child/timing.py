"""Timing protocol, after `triton.testing.do_bench`.

1. Estimate one call's time from a few synchronised calls.
2. Derive warm-up and repetition counts from time budgets (warmup_ms, rep_ms), clamped.
3. Before every timed call, flush the cache by writing a buffer larger than it
   (L2 on a GPU: 2x its size, at least 64 MiB; the last-level cache on a CPU: 64 MiB).
4. Time each call alone: CUDA events on the current stream around the call (the flush is
   enqueued before the start event, so it is not counted), or `time.perf_counter` on the CPU.
5. Interleave the callables call by call (candidate, reference, candidate, ...), so a drift in
   clocks or load hits both alike and the speedup is a ratio measured side by side.
6. Report the median and the spread; the result says what was done.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from kernelwright.core.config import TimingConfig
from kernelwright.core.record import TimingStats


class _Flusher:
    def __init__(self, device: torch.device, enabled: bool):
        self.enabled = enabled
        self.buf = None
        if not enabled:
            return
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
            nbytes = max(2 * l2, 64 * 2**20)
        else:
            nbytes = 64 * 2**20
        self.buf = torch.empty(nbytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(samples: list[float], warmup: int, clock: str, flush: bool) -> TimingStats:
    s = sorted(samples)
    n = len(s)

    def q(p: float) -> float:
        return s[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return TimingStats(
        median_ms=statistics.median(s),
        mean_ms=statistics.fmean(s),
        std_ms=statistics.pstdev(s) if n > 1 else 0.0,
        min_ms=s[0],
        max_ms=s[-1],
        p10_ms=q(0.10),
        p90_ms=q(0.90),
        iterations=n,
        warmup=warmup,
        clock=clock,
        l2_flush=flush,
    )


def time_side_by_side(
    fns: dict[str, Callable[[], object]], device: torch.device, cfg: TimingConfig,
    check: Callable[[str, object], None] | None = None,
    between_rounds: Callable[[], None] | None = None,
) -> dict[str, TimingStats]:
    """Time each callable under the protocol above, interleaved; returns stats per name.

    `check(name, output)`, when given, sees every timed call's output, outside the timed region
    (after the end event is enqueued, or after the clock is read); it must not synchronise.
    `between_rounds()`, when given, runs between two timed rounds (one call of each callable),
    outside the timed region: the runner changes the inputs' contents there.
    """
    flush = _Flusher(device, cfg.flush_l2)
    names = list(fns)

    # 1. estimate (this also warms up lazy initialisation: module load, autotuning, handles)
    est = {}
    for name in names:
        fns[name]()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(3):
            flush()
            fns[name]()
        _sync(device)
        est[name] = max((time.perf_counter() - t0) * 1e3 / 3, 1e-4)
    per_round = sum(est.values())

    # 2. counts from budgets
    warmup = max(cfg.min_warmup, int(cfg.warmup_ms / per_round))
    reps = min(cfg.max_reps, max(cfg.min_reps, int(cfg.rep_ms / per_round)))

    for _ in range(warmup):
        for name in names:
            fns[name]()
    _sync(device)

    samples: dict[str, list[float]] = {n: [] for n in names}
    if device.type == "cuda":
        starts = {n: [torch.cuda.Event(enable_timing=True) for _ in range(reps)] for n in names}
        ends = {n: [torch.cuda.Event(enable_timing=True) for _ in range(reps)] for n in names}
        for i in range(reps):
            if between_rounds is not None and i:
                between_rounds()
            for name in names:
                flush()
                starts[name][i].record()
                out = fns[name]()
                ends[name][i].record()
                if check is not None:
                    check(name, out)
                del out
        torch.cuda.synchronize(device)
        for name in names:
            samples[name] = [s.elapsed_time(e) for s, e in zip(starts[name], ends[name])]
        clock = "cuda_event"
    else:
        for i in range(reps):
            if between_rounds is not None and i:
                between_rounds()
            for name in names:
                flush()
                t0 = time.perf_counter()
                out = fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
                if check is not None:
                    check(name, out)
                del out
        clock = "perf_counter"
    return {n: _stats(samples[n], warmup, clock, flush.enabled) for n in names}
