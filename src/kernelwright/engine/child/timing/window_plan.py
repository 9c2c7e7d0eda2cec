"""How many sets a window holds and how many windows run (`plan`, `regrow`, `fit_queue`, from the
memory at hand: `budget_bytes`), and how much of a window's own cost may come off it (`Measures`, `ceiling`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from kernelwright.core.config import TimingConfig


@dataclass
class Measures:
    """The judge's own measure of a window's costs that are not the candidate's work (ms)."""

    copy_ms: float  # the commit of the outputs into their slots, the runner's unmapping, the snapshot
    open_ms: float  # mapping the regions, every set's views, a message's round trip

    def per_call(self, calls: int) -> Measures:
        return Measures(self.copy_ms / max(calls, 1), self.open_ms / max(calls, 1))


def ceiling(seen: list[Measures], factor: float = 2.0) -> Measures | None:
    """What a window may have taken off per call: `factor` x the smallest per-call measure of the
    stage so far (each of `seen` is per call). A process that slows the judge's measures (a burst
    of load when it expects them) can only make them larger; the smallest is the closest to the
    truth, and the factor leaves room for the honest spread from one window to the next."""
    if not seen:
        return None
    return Measures(factor * min(m.copy_ms for m in seen), factor * min(m.open_ms for m in seen))


@dataclass
class Plan:
    calls: int  # sets per window
    rounds: int
    warmup_calls: int
    reasons: list[str] = field(default_factory=list)
    limit: int = 0  # the most sets a window may hold (memory budget, max_window_calls)


def regrow(plan: Plan, candidate_ms: float, window_ms: float, min_factor: float = 1.0) -> bool:
    """After a warm-up window: windows that hold `window_ms` of work at `candidate_ms` a call (the
    faster side's time in the warm-up round: a candidate much faster than the reference, or a
    reference faster than the estimate the plan was made from), within `plan.limit`, so that a
    window's fixed costs (mapping, the hand-over, the commit's bookkeeping) are shared by enough of
    its calls. True when they grew (by more than `min_factor`: a second look grows them only where
    the first one was far off)."""
    want = math.ceil(window_ms / max(candidate_ms, 1e-4))
    grown = min(max(want, plan.calls), plan.limit or plan.calls)
    if grown <= plan.calls * min_factor:
        return False
    plan.reasons.append(
        f"{grown} sets per window (the warm-up round took {candidate_ms:.4g} ms a call; "
        f"{plan.calls} had been planned from the reference's time)"
    )
    plan.calls = grown
    return True


QUEUE_MIN_CALLS = 16  # the fewest sets `fit_queue` leaves a window (on the device clock a window's
# own costs come off as calibrated, so a short window loses no accuracy to them)


def fit_queue(plan: Plan, side: str, min_calls: int = QUEUE_MIN_CALLS) -> bool:
    """After a warm-up window on the device clock that `side` could not queue whole before the
    device began on it (more launches than the device's launch queue holds, or a host slower than
    the head start allows): half as many sets per window, at least `min_calls`, so that the timed
    windows are queued whole and timed as the device runs them, not as the host launches them.
    True when they shrank; False at `min_calls` (the stage is then timed as launched)."""
    if plan.calls <= min_calls:
        return False
    plan.calls = plan.limit = max(min_calls, plan.calls // 2)
    plan.warmup_calls = plan.calls
    plan.reasons.append(
        f"{plan.calls} sets per window ({side} could not queue a window twice as long whole "
        "before the device began on it)"
    )
    return True


def plan(
    est_ms: float,
    set_bytes: int,
    out_bytes: int,
    budget_bytes: int,
    window_ms: float,
    rounds: int,
    max_calls: int,
) -> Plan:
    """How many sets a window holds: enough for `window_ms` of reference work, no more than the
    memory budget allows: per set, its inputs four times (the drawn sets, their packed copy, the
    inputs' region, and the reference's staging region while its window runs) and its output eight
    times (the reference's, its copy out of the staging region, the ring, the snapshot, the runner's
    own, and what the caching allocators of the judge and the runner keep of the reference's first
    attempt, its temporaries and the last window's blocks). Counted lower, a memory-bound window
    outgrows the device and is halved after the fact (`out_of_memory`)."""
    want = max(2, math.ceil(window_ms / max(est_ms, 1e-4)))
    per_set = 4 * set_bytes + 8 * out_bytes
    fit = max(1, budget_bytes // max(per_set, 1))
    calls = int(min(want, fit, max_calls))
    reasons = []
    if calls < want:
        reasons.append(
            f"{calls} sets per window (memory budget {budget_bytes >> 20} MiB; "
            f"{want} would make {window_ms:g} ms of reference work)"
        )
    # the warm-up window as large as the others, so that the runner's allocator holds a block for
    # every output before the first timed window (else that window pays for cudaMalloc on a GPU, and
    # on the CPU for a page fault per 4 KiB of its outputs: heap.py)
    warmup = max(calls, 1)
    limit = max(1, int(min(fit, max_calls)))
    return Plan(calls=max(calls, 1), rounds=rounds, warmup_calls=warmup, reasons=reasons, limit=limit)


def budget_bytes(config: TimingConfig, device: torch.device) -> int:
    """The memory a window's sets, outputs and snapshot may take."""
    mb = config.window_budget_mb
    if mb > 0:
        return mb << 20
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # windows of a memory-bound problem are as long as this allows: each hand-over's fixed cost
        # is shared by more calls (the plan counts the runner's outputs too; a window that finds the
        # memory taken meanwhile, by other evaluations on the device, is halved and run again)
        return int(free * 0.7)
    return 1 << 30


def out_of_memory(exc: BaseException) -> bool:
    """A device or host allocation refused (torch's, or the driver's for a window's region)."""
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "OUT_OF_MEMORY" in text or "out of memory" in text
