"""Timing statistics as the record keeps them: median, spread and quantiles of per-call times.

The measurement itself is the judge's (`window_timer.py`, `stage.py`): windows of calls on fresh
inputs, on the judge's clock; this module only summarises the per-window figures.
"""

from __future__ import annotations

import statistics

from kernelwright.core.record import TimingStats


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


def stats_of(samples: list[float], warmup: int, clock: str, flush: bool) -> TimingStats:
    """Median, spread and quantiles of `samples` (ms) as the record keeps them."""
    return _stats(samples, warmup, clock, flush)
