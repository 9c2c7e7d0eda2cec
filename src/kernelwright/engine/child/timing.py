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

import os
import statistics
import time
from collections.abc import Callable

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


def stats_of(samples: list[float], warmup: int, clock: str, flush: bool) -> TimingStats:
    """Median, spread and quantiles of `samples` (ms) as the record keeps them."""
    return _stats(samples, warmup, clock, flush)


def measure(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    cfg: TimingConfig,
    check: Callable[[str, object], None] | None = None,
    rep_scale: float = 1.0,
    between_rounds: Callable[[], None] | None = None,
) -> tuple[dict[str, list[float]], int, str, bool]:
    """The protocol's raw samples, in the order they were taken: (samples per name, warm-up, clock,
    cache flushed). `rep_scale` widens the repetition budget (a repeated, unstable measurement)."""
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
    reps = min(cfg.max_reps, max(int(rep_scale * cfg.min_reps), int(rep_scale * cfg.rep_ms / per_round)))

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
            samples[name] = [s.elapsed_time(e) for s, e in zip(starts[name], ends[name], strict=False)]
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
    return samples, warmup, clock, flush.enabled


def time_with_stability(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    cfg: TimingConfig,
    check: Callable[[str, object], None] | None = None,
    between_rounds: Callable[[], None] | None = None,
):
    """Time each callable under the protocol above, interleaved, under a fixed CPU thread count,
    with load and sample checks and repeats (engine/child/stability.py). Returns (stats per name,
    TimingReport).

    `check(name, output)`, when given, sees every timed call's output, outside the timed region
    (after the end event is enqueued, or after the clock is read); it must not synchronise.
    `between_rounds()`, when given, runs between two timed rounds (one call of each callable),
    outside the timed region: the runner changes the inputs' contents there.
    """
    from kernelwright.engine.child import stability

    on_gpu = device.type == "cuda"
    cores = stability.available_cores()
    threads = stability.resolve_threads(cfg, cores)
    prev_threads = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(threads)

    monitor = stability.CpuLoadMonitor()

    def sample_load() -> stability.LoadFacts:
        facts = stability.LoadFacts(cores=cores, threads=threads)
        try:
            facts.loadavg_1m = os.getloadavg()[0]
        except OSError:
            pass
        if on_gpu:
            for k, v in stability.gpu_facts(_gpu_id(device)).items():
                setattr(facts, k, v)
        else:
            monitor.tick()
            facts.others_busy_cores = monitor.others_busy_cores()
            facts.others_runnable = monitor.others_runnable()
        return facts

    try:
        result: dict[str, tuple[int, str, bool]] = {}

        def measure_once(scale: float) -> dict[str, list[float]]:
            samples, warmup, clock, flushed = measure(
                fns, device, cfg, check, rep_scale=scale, between_rounds=between_rounds
            )
            result["meta"] = (warmup, clock, flushed)
            monitor.tick()
            return samples

        if cfg.stability_checks:
            samples, report = stability.timed_stably(measure_once, sample_load, cfg, on_gpu)
        else:
            samples = measure_once(1.0)
            report = stability.TimingReport(threads if not on_gpu else None, 1, {}, {}, {}, [])
    finally:
        if not on_gpu:
            torch.set_num_threads(prev_threads)
    warmup, clock, flushed = result["meta"]
    return {n: _stats(samples[n], warmup, clock, flushed) for n in samples}, report


def _gpu_id(device: torch.device) -> str:
    """nvidia-smi's name for the device: its UUID (CUDA_VISIBLE_DEVICES renumbers indices), else its index."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    except Exception:
        return str(device.index or 0)
