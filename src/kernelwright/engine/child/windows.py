"""Timing windows: the judge's clock around the candidate's calls, on inputs it has never seen.

The judge times the candidate itself; nothing the runner says about time is used. A window:

1. The judge draws P fresh input sets (from its secret seed), times the reference on them in its
   own process (one call per set, back to back, synchronised at the end), and keeps the
   reference's outputs as the truth for this window.
2. It copies the same inputs into a fresh shared region (`shared_region.py`); the runner cannot
   reach it until it gets its descriptor. The outputs go to the output ring: one region the
   runner maps once per timing stage (`Rings`), whose slots the judge zeroes before each window.
3. The clock starts; the judge sends the window (sizes, layout, the ring) and the descriptor on
   the pair's socket. The runner maps it, calls ModelNew once per set, says `computed`, copies
   each output into its slot of the ring, synchronises and answers `committed`.
4. The judge then copies the slots into memory of its own (made before the clock) and
   synchronises; the clock stops there. Work the runner left running after `computed` either
   delays the snapshot (and is counted) or is missing from it (and fails the check). What a
   window costs beyond the calls comes off: after `computed`, the commit and the snapshot as the
   judge times them on its own memory; before it, on a GPU, the opening (hand-over, mapping,
   waits) as the judge's probe process shows it on the same path (`probe.py`), on the CPU the
   judge's own measure of the mapping and a message's round trip.
5. Every slot of the snapshot is compared with the reference's output for the same set.

Windows alternate with reference windows on fresh draws, so both see the same machine, and no
content repeats within or across windows: a cache keyed on an input's contents never hits.
Imports only torch, the standard library and `core`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.engine.child import shared_region

ALIGN = 256  # every tensor of a set starts on this byte boundary (any dtype, any vector width)
from kernelwright.engine.child.wire import _DTYPES  # noqa: E402  (the dtypes that may cross the boundary)

_REGION_IDS = [0]


def _next_region_id() -> int:
    """A fresh id for a region lent to another process (unique in this process: a peer's mapping
    of an earlier region is never taken for a new one)."""
    _REGION_IDS[0] += 1
    return _REGION_IDS[0]


class WindowError(RuntimeError):
    """The window could not run as planned (the problem's inputs or outputs do not fit it)."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@dataclass
class Layout:
    """Where each leaf of one set lies in a region: `[kind, offset, dtype, shape]` for a tensor,
    `["value", v]` for a plain argument. Sets follow each other every `stride` bytes."""

    leaves: list[list[Any]]
    stride: int

    @staticmethod
    def of_inputs(inputs: list[Any]) -> Layout:
        leaves: list[list[Any]] = []
        off = 0
        for x in inputs:
            if isinstance(x, torch.Tensor):
                if _dtype_name(x.dtype) not in _DTYPES:
                    raise WindowError(f"an input of dtype {x.dtype} cannot be shared")
                leaves.append(["tensor", off, _dtype_name(x.dtype), list(x.shape)])
                off += _align(x.numel() * x.element_size())
            elif x is None or isinstance(x, (bool, int, float, str)):
                leaves.append(["value", x])
            else:
                raise WindowError(f"an input of type {type(x).__name__} cannot be shared (tensors and numbers only)")
        return Layout(leaves, max(off, ALIGN))

    @staticmethod
    def of_outputs(out: Any) -> Layout:
        from kernelwright.engine.child.compare import flatten

        leaves: list[list[Any]] = []
        off = 0
        for _, x in flatten(out):
            if not isinstance(x, torch.Tensor) or _dtype_name(x.dtype) not in _DTYPES:
                raise WindowError("the reference returns something other than tensors: no output slots")
            leaves.append(["tensor", off, _dtype_name(x.dtype), list(x.shape)])
            off += _align(x.numel() * x.element_size())
        return Layout(leaves, max(off, ALIGN))

    def to_json(self) -> dict[str, Any]:
        return {"leaves": self.leaves, "stride": self.stride}

    @staticmethod
    def from_json(raw: Any, max_bytes: int) -> Layout:
        """A layout from the other process, checked: known dtypes, offsets inside the stride."""
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("leaves"), list)
            or not isinstance(raw.get("stride"), int)
        ):
            raise WindowError("malformed layout")
        stride = raw["stride"]
        if not 0 < stride <= max_bytes:
            raise WindowError("layout stride out of range")
        leaves = []
        for leaf in raw["leaves"][:256]:
            if isinstance(leaf, list) and leaf and leaf[0] == "value" and len(leaf) == 2:
                leaves.append(leaf)
                continue
            if not (
                isinstance(leaf, list)
                and len(leaf) == 4
                and leaf[0] == "tensor"
                and leaf[2] in _DTYPES
                and isinstance(leaf[1], int)
                and isinstance(leaf[3], list)
                and all(isinstance(s, int) and s >= 0 for s in leaf[3])
            ):
                raise WindowError("malformed layout leaf")
            n = math.prod(leaf[3]) * torch.empty(0, dtype=_DTYPES[leaf[2]]).element_size()
            if leaf[1] < 0 or leaf[1] + n > stride:
                raise WindowError("layout leaf outside its set")
            leaves.append(leaf)
        return Layout(leaves, stride)

    def views(self, region: shared_region.Region, i: int) -> list[Any]:
        base = i * self.stride
        return [
            region.view(base + leaf[1], _DTYPES[leaf[2]], leaf[3]) if leaf[0] == "tensor" else leaf[1]
            for leaf in self.leaves
        ]

    def sets(self, region: shared_region.Region, n: int) -> list[list[Any]]:
        """`views(region, i)` for every i < n, made leaf by leaf in one strided view each (a few
        microseconds for a whole window, against ~15 a view made alone: in a window of a hundred
        sets that was a millisecond of fixed cost before the first call, and its noise)."""
        if n <= 0:
            return []
        if n * self.stride > region.nbytes:
            raise ValueError("the sets run past the region")
        columns: list[list[Any]] = []
        for leaf in self.leaves:
            if leaf[0] != "tensor":
                columns.append([leaf[1]] * n)
                continue
            dtype, shape = _DTYPES[leaf[2]], tuple(int(d) for d in leaf[3])
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if leaf[1] % itemsize or self.stride % itemsize:
                columns.append([region.view(i * self.stride + leaf[1], dtype, leaf[3]) for i in range(n)])
                continue
            usable = region.nbytes - region.nbytes % itemsize
            typed = region.tensor[:usable].view(dtype)
            inner = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                inner[d] = inner[d + 1] * shape[d + 1]
            stacked = typed.as_strided((n, *shape), (self.stride // itemsize, *inner), leaf[1] // itemsize)
            columns.append(list(stacked.unbind(0)))
        return [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in range(n)]


def _sync(device: torch.device) -> None:
    """Wait for the device's work. On a GPU the wait polls an event first, then synchronises the
    device (work on other streams too): a blocking synchronisation's wake-up costs 0.1-0.3 ms,
    counted once per window on each side (both sides wait the same way)."""
    if device.type == "cuda":
        ev = torch.cuda.Event()
        ev.record()
        while not ev.query():
            pass
        torch.cuda.synchronize(device)


# ---- the runner's side ----------------------------------------------------------------------------


class Rings:
    """The runner's mapping of the judge's output ring: one region for the outputs of every window
    of a timing stage, mapped once (the inputs come in a fresh region each window). The judge
    zeroes the slots before each window and snapshots them after; what the runner writes there
    outside a window is overwritten or read only after a window's own commit."""

    def __init__(self) -> None:
        self.region: shared_region.Region | None = None
        self.id: int | None = None

    def take(self, ring: Any, fd: int | None, need: int, max_bytes: int, device: torch.device) -> shared_region.Region:
        """The ring the header names (`{"id", "bytes"}`): a new one (its descriptor came with the
        header) replaces the one mapped before; else the one mapped before, if it is the one named.
        Either must hold `need` bytes."""
        if not (isinstance(ring, dict) and isinstance(ring.get("id"), int) and isinstance(ring.get("bytes"), int)):
            raise WindowError("malformed output ring")
        if fd is not None:
            if not need <= ring["bytes"] <= max_bytes:
                raise WindowError("output ring size out of range")
            self.close()
            self.region = shared_region.attach(fd, ring["bytes"], device)
            self.id = ring["id"]
        if self.region is None or self.id != ring["id"] or self.region.nbytes < need:
            raise WindowError("the window names an output ring this runner has not mapped")
        return self.region

    def close(self) -> None:
        if self.region is not None:
            self.region.close()
        self.region = self.id = None


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Python's cyclic collector held off while calls are timed, on both sides (as `timeit` does):
    a collection of a large heap inside a window is neither side's work."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _protocol_threads(device: torch.device) -> Iterator[None]:
    """On the CPU the window's own copies (the commit, the judge's measure of it, the snapshot) run
    on one thread whatever the timed calls use: they are neither side's work, and a parallel copy
    between two processes on shared cores waits for its slowest thread (docs/PERFORMANCE.md)."""
    if device.type != "cpu":
        yield
        return
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _faults() -> int:
    """This process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


_EVENTS: list[Any] = []  # the runner's two timing events (its own account), made once


def serve_window(
    sock: socket.socket,
    header: dict[str, Any],
    fds: list[int],
    model: Callable[..., Any],
    device: torch.device,
    max_bytes: int,
    rings: Rings | None = None,
) -> None:
    """Run one window the judge opened (the runner's side; it runs the candidate, so it decides
    nothing): map the inputs' region, call once per set, copy each output into its slot of the
    output ring, answer `done`."""

    regions: list[shared_region.Region] = []
    mismatched = 0
    reply: dict[str, Any] = {"done": header.get("id"), "phase": "committed"}
    failure: BaseException | None = None
    rings = rings if rings is not None else Rings()
    computed = json.dumps({"done": header.get("id"), "phase": "computed"}).encode()
    try:
        t_start = time.perf_counter()
        if isinstance(header.get("threads"), int) and header["threads"] > 0 and device.type == "cpu":
            torch.set_num_threads(header["threads"])  # the count the judge times the reference with
        n = int(header["calls"])
        lin = Layout.from_json(header["inputs"], max_bytes)
        lout = Layout.from_json(header["outputs"], max_bytes)
        rin = shared_region.attach(fds[0], n * lin.stride, device)
        regions.append(rin)
        rout = rings.take(header.get("ring"), fds[1] if len(fds) > 1 else None, n * lout.stride, max_bytes, device)
        fds = fds[:1]
        # every set's views before the first call: serial work the judge measures and takes off
        # (made between calls they would hide behind a GPU's work and be taken off all the same)
        args = lin.sets(rin, n)
        faults0 = _faults()
        t_mapped = time.perf_counter()
        outs = []
        if device.type == "cuda" and not _EVENTS:
            _EVENTS.extend(torch.cuda.Event(enable_timing=True) for _ in range(2))
        events = _EVENTS if device.type == "cuda" else []
        if events:
            events[0].record()
        with torch.no_grad(), _no_gc():
            for a in args:
                outs.append(model(*a))
        t_launched = time.perf_counter()
        if events:
            events[1].record()
        _sync(device)
        t_computed = time.perf_counter()
        shared_region.send(sock, computed, [])
        # the runner's own account (evidence only: this process is the candidate's): the calls'
        # wall, how long they took to enqueue, and the device's own time for them
        reply["runner_ms"] = {
            "map": round((t_mapped - t_start) * 1e3, 4),
            "calls": round((t_computed - t_mapped) * 1e3, 4),
            "enqueue": round((t_launched - t_mapped) * 1e3, 4),
            "faults": _faults() - faults0,  # page faults in the calls (heap.py says why they matter)
        }
        if events:
            reply["runner_ms"]["device"] = round(events[0].elapsed_time(events[1]), 4)
        with _protocol_threads(device):
            mismatched = commit(outs, lout, rout)  # after the clock's `computed`
        del outs, args
        _sync(device)
        reply["runner_ms"]["commit"] = round((time.perf_counter() - t_computed) * 1e3, 4)
        reply["mismatched"] = mismatched
    except Exception as exc:
        _sync_quietly(device)
        reply["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        failure = exc
    finally:
        for r in regions:
            r.close()
        for fd in fds[len(regions) :]:
            try:
                os.close(fd)
            except OSError:
                pass
        shared_region.send(sock, json.dumps(reply).encode(), [])
    if failure is not None:
        raise failure


def commit(
    outs: list[Any],
    layout: Layout,
    region: shared_region.Region,
    fused: bool = False,
    slots: list[list[Any]] | None = None,
) -> int:
    """Every output into its slot of `region` (the runner's commit; the judge times the same code
    on its own memory): the number of outputs left unwritten because their structure, a shape or a
    dtype is not the reference's (the judge finds those slots wrong). `fused`: the copies in as few
    kernels as torch's multi-tensor copy makes (the device clock: the commit's host work is then
    about one launch, however many outputs a window has). `slots`: `layout.sets(region, n)`, made
    before the clock (on the device clock the commit's host work is the candidate's time wherever
    its calls leave the device idle, so the window's commit does as little of it as it can)."""
    from kernelwright.engine.child.compare import flatten

    mismatched = 0
    dsts: list[torch.Tensor] = []
    srcs: list[torch.Tensor] = []
    all_slots = slots if slots is not None else layout.sets(region, len(outs))
    if len(all_slots) < len(outs):
        raise ValueError("more outputs than slots")
    one = layout.leaves[0] if len(layout.leaves) == 1 and layout.leaves[0][0] == "tensor" else None
    one_dtype = _DTYPES[one[2]] if one is not None else None
    one_shape = torch.Size(int(d) for d in one[3]) if one is not None else None
    for i, out in enumerate(outs):
        slot = all_slots[i]
        if one is not None and isinstance(out, torch.Tensor):  # (the common case, without flatten's walk)
            leaves = [out]
            ok = out.dtype == one_dtype and out.shape == one_shape
        else:
            leaves = [x for _, x in flatten(out)]
            ok = len(leaves) == len(slot) and all(
                isinstance(x, torch.Tensor) and x.shape == q.shape and x.dtype == q.dtype
                for x, q in zip(leaves, slot, strict=False)
            )
        if not ok:
            mismatched += 1
            continue
        if fused:
            dsts.extend(slot)
            srcs.extend(leaves)
            continue
        for x, q in zip(leaves, slot, strict=False):
            q.copy_(x)
    if dsts:
        torch._foreach_copy_(dsts, srcs)
    return mismatched


def _sync_quietly(device: torch.device) -> None:
    try:
        _sync(device)
    except Exception:
        pass


# ---- the judge's side -----------------------------------------------------------------------------


@dataclass
class WindowResult:
    calls: int
    wall_ms: float  # open to snapshot, on the judge's clock
    copy_ms: float  # the judge's own measure of the copies the window adds (subtracted)
    per_call_ms: float
    bad_slots: int
    open_ms: float = 0.0  # the judge's own measure of mapping the regions and a message round trip (subtracted)
    after_ms: float = 0.0  # from `computed` to the snapshot (the commit, and anything left running)
    open_to_computed_ms: float = 0.0
    runner_ms: dict[str, Any] = field(default_factory=dict)  # the runner's own account: evidence, never used
    phases: Any = None  # on the device clock: device_clock.Phases (what per_call_ms is made from)


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
    """After a warm-up window: a candidate much faster than the reference gets windows that hold
    `window_ms` of its own work (within `plan.limit`), so that a window's fixed costs (mapping, the
    hand-over, the commit's bookkeeping) are shared by enough of its calls. True when they grew (by
    more than `min_factor`: a second look grows them only where the first one was far off)."""
    want = math.ceil(window_ms / max(candidate_ms, 1e-4))
    grown = min(max(want, plan.calls), plan.limit or plan.calls)
    if grown <= plan.calls * min_factor:
        return False
    plan.reasons.append(
        f"{grown} sets per window (the candidate's warm-up window took {candidate_ms:.4g} ms a call; "
        f"{plan.calls} had been planned from the reference's time)"
    )
    plan.calls = grown
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
    memory budget allows: per set, its inputs twice (the pool, the region; the reference's staging
    copy is freed first) and its output six times (the reference's, the ring, the snapshot, the
    runner's own, and what the caching allocators of the judge and the runner keep of the
    reference's temporaries and the last window's blocks: with four, windows run out of memory)."""
    want = max(2, math.ceil(window_ms / max(est_ms, 1e-4)))
    per_set = 2 * set_bytes + 6 * out_bytes
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


class WindowTimer:
    """The judge's side: draws, reference windows, candidate windows, snapshots, checks."""

    def __init__(
        self,
        sock: socket.socket,
        device: torch.device,
        draw: Callable[[], list[Any]],
        reference: Callable[..., Any],
        check: Callable[[tuple[float, float] | None, Any], bool],
        deadline_s: Callable[[float], float],
        threads: int | None = None,
    ):
        self.sock = sock
        self.threads = threads  # CPU: the intra-op thread count both sides time with
        self.device = device
        self.draw = draw  # fresh inputs from the judge's secret stream
        self.reference = reference
        self.check = check  # (a slot's errors against its reference output, that output) -> acceptable
        self.deadline_s = deadline_s  # (expected window seconds) -> how long to wait for `done`
        self.next_id = 0
        self.ring: shared_region.Region | None = None  # the outputs' region, lent once for every window
        self.ring_id = 0
        self.ring_owner: WindowTimer = self  # the timer whose ring this one lends (the probe's: the runner's)
        self.sent_ring = 0  # the ring this timer's peer has mapped
        self._snap: torch.Tensor | None = None  # where windows' slots are snapshot (`_snapshot_buffer`)
        # the device clock (GPU, device_clock.py): the judge's stream spans the runner's work
        self.clock: Any = None  # device_clock.Clock
        self.cal: Any = None  # device_clock.Calibration (the probe's empty windows add its switches)
        self.inputs: shared_region.Region | None = None  # the stage's inputs' region (device clock)
        self.sent: dict[str, int] = {}  # the lent regions this timer's peer has mapped: name -> id
        self._staged: tuple[torch.Tensor, int] | None = None  # the last pool, in one block (device clock)
        self.ref_host_ms: float | None = None  # the host's time to queue one reference call (device clock)
        self.ref_queued = True  # the last reference window was all queued before the device began
        # a reference window could not be queued whole before the device began (a launch queue
        # too small for it): both sides are timed as launched, the candidate's window started
        # without waiting for it to be queued, the reference's by the wall clock
        self.as_launched = False

    def close(self) -> None:
        """The output ring given back (the runner drops its mapping at its next command)."""
        if self.clock is not None:
            self.clock.close()  # first: a window left waiting is released
            if self.clock.stuck:  # a stream still waits on them: left as they are
                self.ring = self.inputs = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.inputs is not None:
            self.inputs.close()
            self.inputs = None
        self._snap = None
        self._staged = None

    def _snapshot_buffer(self, nbytes: int) -> torch.Tensor:
        """The judge's memory a window's slots are copied into when it closes, made before any
        clock. On the CPU one buffer for the stage, written once, grown where a window outgrows
        it: a fresh one each window pays a page fault per 4 KiB inside the after-phase, by an
        amount that varies from window to window. On a GPU a fresh block of the caching allocator
        each window: with one buffer kept for the stage, the runner's calls and commit ran 11%
        slower on an H100 (docs/PERFORMANCE.md). Its contents never outlive the check of their
        own window (`candidate_window` checks them before it returns, and the next window
        overwrites them). Kept by the ring's owner."""
        if self.device.type == "cuda":
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        owner = self.ring_owner  # the probe's windows, one at a time after the candidate's, share it
        if owner._snap is None or owner._snap.numel() < nbytes:
            owner._snap = None
            owner._snap = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        return owner._snap[:nbytes]

    def _ring_for(self, nbytes: int) -> tuple[shared_region.Region, int, bool]:
        """The output ring, replaced by a larger one where a window outgrows it: (ring, its id,
        whether this timer's peer has yet to map it)."""
        owner = self.ring_owner
        if owner.ring is None or owner.ring.nbytes < nbytes:
            if owner.ring is not None:
                owner.ring.close()
                owner.ring = None
            owner._snap = None
            owner.ring = shared_region.create(nbytes, self.device)
            owner.ring_id = _next_region_id()
        new = self.sent_ring != owner.ring_id
        self.sent_ring = owner.ring_id
        return owner.ring, owner.ring_id, new

    # -- the reference ------------------------------------------------------------------------------
    def pool(self, calls: int) -> tuple[list[list[Any]], Layout]:
        """`calls` fresh input sets and their layout. On the device clock the sets are views of one
        block of the judge's memory in the layout of the inputs' region, so that the window's copy
        in is one kernel (`device_clock.byte_copy`)."""
        if self.clock is None:
            sets = [self.draw() for _ in range(calls)]
            layout = Layout.of_inputs(sets[0])
            for s in sets[1:]:
                if Layout.of_inputs(s).leaves != layout.leaves:
                    raise WindowError("get_inputs() returns differently shaped inputs from one draw to the next")
            return sets, layout
        self._staged = None
        first = self.draw()
        layout = Layout.of_inputs(first)
        block = torch.empty(calls * layout.stride, dtype=torch.uint8, device=self.device)
        staged = layout.sets(shared_region.Region(block, block.numel(), -1), calls)
        for i in range(calls):
            s = first if i == 0 else self.draw()
            if i and Layout.of_inputs(s).leaves != layout.leaves:
                raise WindowError("get_inputs() returns differently shaped inputs from one draw to the next")
            for dst, x in zip(staged[i], s, strict=True):
                if isinstance(x, torch.Tensor):
                    dst.copy_(x)
            del s
        del first
        self._staged = (block, calls)
        return staged, layout

    def reference_window(
        self, sets: list[list[Any]], layout: Layout | None = None, device_time: bool | None = None
    ) -> tuple[float, list[Any]]:
        """The reference's time per call on `sets`, read from the same kind of memory the candidate
        reads its inputs from (a fresh region: its placement changes a CPU's speed several-fold),
        and its outputs, the truth for the candidate's window on the same sets. `device_time` (the
        device clock's, by default where this timer has it): the calls queued before the device
        starts on them, as the runner's are (`device_clock.queued_ahead`), once more with a longer
        head start where the host was still queueing when the device began; else the wall clock
        from the first call to the last one's end."""
        layout = layout or Layout.of_inputs(sets[0])
        if device_time is None:
            device_time = self.clock is not None and not self.as_launched
        region = shared_region.create(len(sets) * layout.stride, self.device)
        staged: list[list[Any]] = []
        per_call = self.ref_host_ms
        try:
            staged = layout.sets(region, len(sets))
            ref = self.reference
            outs: list[Any] = []
            for _ in range(2 if device_time else 1):
                outs = []  # (a first attempt's outputs freed before the second)
                for i, s in enumerate(sets):  # a copy: the reference may change its inputs in place
                    for dst, x in zip(staged[i], s, strict=True):
                        if isinstance(x, torch.Tensor):
                            dst.copy_(x)
                _sync(self.device)
                with torch.no_grad(), _no_gc():
                    if device_time:
                        from kernelwright.engine.child import device_clock

                        guess = (per_call if per_call is not None else 0.05) * len(sets)
                        outs, span_ms, host_ms, ahead = device_clock.queued_ahead(
                            self.device, lambda st=staged: [ref(*args) for args in st], guess
                        )
                        per_call = host_ms / len(sets)
                        self.ref_host_ms, self.ref_queued = per_call, ahead
                    else:
                        t0 = time.perf_counter()
                        outs = [ref(*args) for args in staged]
                        _sync(self.device)
                        span_ms, ahead = (time.perf_counter() - t0) * 1e3, True
                if ahead:
                    break
            if not ahead:
                # more launches than the device's queue holds (or a host slower than the sleep
                # allows for): the stage times both sides as they are launched from here on
                self.as_launched = True
            outs = [_own(o) for o in outs]  # nothing of the region outlives it
        finally:
            del staged
            region.close()
        return span_ms / len(sets), outs

    def copy_ms(self, ref_outs: list[Any], out_layout: Layout, in_bytes: int, repeats: int = 3) -> float:
        """The time after `computed` that is not the candidate's, as the judge measures it on its own
        memory with the runner's own code: the commit of outputs like the window's (the reference's
        own) into a second mapping of a fresh region, the mapping of the inputs closed (the runner
        unmaps them before it answers; the output ring stays mapped), then the snapshot of the
        region (best of `repeats`). Making and freeing the regions is not timed: neither side does
        that inside a window."""
        nbytes = len(ref_outs) * out_layout.stride
        best = float("inf")
        for _ in range(repeats):
            made = [shared_region.create(n, self.device) for n in (in_bytes, nbytes)]
            mapped: list[shared_region.Region] = []
            try:
                mapped = [shared_region.attach(os.dup(r.fd), r.nbytes, self.device) for r in made]
                snap = self._snapshot_buffer(nbytes)
                _sync(self.device)
                with _protocol_threads(self.device):
                    t0 = time.perf_counter()
                    commit(ref_outs, out_layout, mapped[1])
                    _sync(self.device)
                    mapped[0].close()
                    snap.copy_(made[1].tensor[:nbytes])
                    _sync(self.device)
                    best = min(best, (time.perf_counter() - t0) * 1e3)
            finally:
                for m in mapped:
                    m.close()
                for r in made:
                    r.close()
        return best

    def open_ms(self, calls: int, in_layout: Layout, out_layout: Layout, repeats: int = 3) -> float:
        """What a window costs the runner before its first call, measured by the judge alone: the
        inputs' region imported and mapped from its descriptor, a view made for every set's inputs
        (as the runner makes them), and a message's round trip to another thread (best of three).
        The output ring is mapped once, before the first window; the outputs' views are made in the
        commit, which `copy_ms` times."""
        in_bytes = calls * in_layout.stride
        best = float("inf")
        for _ in range(repeats):
            made = shared_region.create(in_bytes, self.device)
            try:
                _sync(self.device)
                t0 = time.perf_counter()
                rin = shared_region.attach(os.dup(made.fd), in_bytes, self.device)
                in_layout.sets(rin, calls)  # as the runner makes them before its calls
                ms = (time.perf_counter() - t0) * 1e3
                rin.close()
            finally:
                made.close()
            best = min(best, ms + _round_trip_ms(SPIN_S if self.device.type == "cuda" else 0.0))
        return best

    # -- a candidate window -----------------------------------------------------------------------------
    def measures(self, sets: list[list[Any]], in_layout: Layout, ref_outs: list[Any], opening: bool = True) -> Measures:
        """The judge's own measure of what a window of these sets costs that is not the candidate's
        work (the commit and snapshot, and the opening unless `opening` is off: the probe measures
        it), taken before the window opens: the runner then waits for it, and the moment is one it
        cannot tell from the reference's window just before it (load it makes then falls on that
        window too, where the judge looks for load)."""
        calls, out_layout = len(sets), Layout.of_outputs(ref_outs[0])
        copy = self.copy_ms(ref_outs, out_layout, calls * in_layout.stride, repeats=1)
        open_ms = self.open_ms(calls, in_layout, out_layout, repeats=1) if opening else 0.0
        return Measures(copy_ms=copy, open_ms=open_ms)

    def candidate_window(
        self,
        sets: list[list[Any]],
        in_layout: Layout,
        ref_outs: list[Any],
        expected_ms: float,
        measures: Measures,
        ceiling: Measures | None = None,
    ) -> WindowResult:
        """One window of the candidate's calls on `sets`, timed by the judge. What comes off its wall
        time is `measures` (taken before it), never more than `ceiling` (per call: a share of the
        smallest measures of the stage, so a measure the runner managed to slow cannot hide its
        work) and never more than the phase it belongs to."""
        if self.clock is not None:
            return self._device_window(sets, in_layout, ref_outs, expected_ms)
        calls = len(sets)
        out_layout = Layout.of_outputs(ref_outs[0])
        out_bytes = calls * out_layout.stride
        rin = shared_region.create(calls * in_layout.stride, self.device)
        try:
            rout, ring_id, new_ring = self._ring_for(out_bytes)
            for dst_set, s in zip(in_layout.sets(rin, calls), sets, strict=True):
                for dst, x in zip(dst_set, s, strict=False):
                    if isinstance(x, torch.Tensor):
                        dst.copy_(x)
            slots = rout.tensor[:out_bytes]
            slots.zero_()  # an unwritten slot is zeros, never last window's answer
            snap_into = self._snapshot_buffer(out_bytes)  # made before the clock, as in `copy_ms`
            _sync(self.device)
            wid = self.next_id
            self.next_id += 1
            header = {
                "window": wid,
                "id": wid,
                "calls": calls,
                "inputs": in_layout.to_json(),
                "outputs": out_layout.to_json(),
                "ring": {"id": ring_id, "bytes": rout.nbytes},
                "threads": self.threads,
            }
            payload = json.dumps(header).encode()  # made before the clock starts: not the candidate's time
            fds = [rin.fd, rout.fd] if new_ring else [rin.fd]
            t0 = time.perf_counter()
            try:
                shared_region.send(self.sock, payload, fds)
            except OSError as exc:
                raise WindowError(f"the runner's end of the window socket is gone ({exc.strerror or exc})") from None
            limit = self.deadline_s(expected_ms * calls / 1e3)
            reply = self._await_done(wid, limit)
            t_done = time.perf_counter()
            if reply.get("phase") == "computed":
                reply = self._await_done(wid, limit)
            with _protocol_threads(self.device):
                snap = snap_into.copy_(slots)
            _sync(self.device)
            t_end = time.perf_counter()
        finally:
            rin.close()
        copy_ms, open_ms = measures.copy_ms, measures.open_ms
        if ceiling is not None:
            copy_ms, open_ms = min(copy_ms, ceiling.copy_ms * calls), min(open_ms, ceiling.open_ms * calls)
        # the commit and the snapshot are not the candidate's work: their measured time comes off,
        # but never more than the time after `computed` (work left running past it counts)
        wall_ms = (t_end - t0) * 1e3
        after_ms = (t_end - t_done) * 1e3
        before_ms = (t_done - t0) * 1e3
        # what the judge measured for the same mapping, hand-over and commit comes off each phase,
        # never more than the phase lasted
        timed_ms = wall_ms - min(copy_ms, after_ms) - min(open_ms, 0.5 * before_ms)
        if reply.get("error"):
            raise WindowError(f"ModelNew failed in a timing window: {str(reply['error'])[:300]}")
        bad = self._bad_slots(snap, out_layout, ref_outs)
        runner_ms = reply.get("runner_ms")
        return WindowResult(
            calls=calls,
            wall_ms=wall_ms,
            copy_ms=copy_ms,
            open_ms=open_ms,
            per_call_ms=timed_ms / calls,
            bad_slots=bad,
            after_ms=after_ms,
            open_to_computed_ms=(t_done - t0) * 1e3,
            runner_ms=runner_ms if isinstance(runner_ms, dict) else {},
        )

    def _bad_slots(self, snap: torch.Tensor, out_layout: Layout, ref_outs: list[Any]) -> int:
        """How many of a window's slots, as snapshot into `snap`, are wrong for their own inputs."""
        region = shared_region.Region(snap, snap.numel(), -1)
        cands = [_rebuild(ref, sl) for ref, sl in zip(ref_outs, out_layout.sets(region, len(ref_outs)), strict=True)]
        errs = slot_errors(cands, ref_outs)
        return sum(1 for e, ref in zip(errs, ref_outs, strict=True) if not self.check(e, ref))

    def _lend(self, name: str, region: shared_region.Region, rid: int, fds: list[int]) -> list[Any]:
        """`[name, id, bytes, new]` for a window's header; a region this timer's peer has not mapped
        yet adds its descriptor to `fds`."""
        new = self.sent.get(name) != rid
        if new:
            fds.append(region.fd)
            self.sent[name] = rid
        return [name, rid, region.nbytes, new]

    def lend_flags(self, fds: list[int]) -> list[Any]:
        """The clock's flags, lent (for every window, and the probe's empty ones)."""
        flags: shared_region.Region = self.clock.flags_region()
        if not flags.lent_id:
            flags.lent_id = _next_region_id()
        return self._lend("flags", flags, flags.lent_id, fds)

    def _device_window(
        self, sets: list[list[Any]], in_layout: Layout, ref_outs: list[Any], expected_ms: float
    ) -> WindowResult:
        """A window on the device clock (device_clock.py): the regions are the stage's, the copy of
        the sets into the inputs' region is inside the judge's span, and what comes off is the
        stage's calibration (`self.cal`), applied to every window again when the stage ends."""
        from kernelwright.engine.child import device_clock

        calls = len(sets)
        out_layout = Layout.of_outputs(ref_outs[0])
        in_bytes, out_bytes = calls * in_layout.stride, calls * out_layout.stride
        if self._staged is None or self._staged[1] != calls:
            raise WindowError("the window's sets are not the last pool drawn (an engine bug)")
        block = self._staged[0]
        if self.inputs is None or self.inputs.nbytes < in_bytes:
            if self.inputs is not None:
                self.inputs.close()
            self.inputs = shared_region.create(in_bytes, self.device)
            self.inputs.tensor.zero_()
            self.inputs.lent_id = _next_region_id()
        rout, ring_id, _ = self._ring_for(out_bytes)
        fds: list[int] = []
        lent = [
            self._lend("inputs", self.inputs, self.inputs.lent_id, fds),
            self._lend("ring", rout, ring_id, fds),
            self.lend_flags(fds),
        ]
        # before the clock, on the judge's own memory only (the runner can read the ring and the
        # inputs' region): what the window's copy in, snapshot and commit cost (device_clock)
        snap_into = torch.empty(out_bytes, dtype=torch.uint8, device=self.device)
        # (the copy in measured on the inputs' region onto itself, the memory the window's copy
        # writes: it holds only the last window's inputs, which the runner has seen)
        cal = self.clock.calibrate(self.inputs.tensor[:in_bytes], snap_into, ref_outs, out_layout)
        t_views = time.perf_counter()
        in_layout.sets(self.inputs, calls)  # (the judge's own time for the views the runner makes)
        judge_host_ms = (time.perf_counter() - t_views) * 1e3 + self.clock.views_ms + self.clock.host_ms
        slots = rout.tensor[:out_bytes]
        slots.zero_()  # an unwritten slot is zeros, never last window's answer
        torch.cuda.synchronize(self.device)
        wid = self.next_id
        self.next_id += 1
        header = {
            "id": wid,
            "calls": calls,
            "clock": "device",
            "inputs": in_layout.to_json(),
            "outputs": out_layout.to_json(),
            "lent": lent,
        }
        limit = self.deadline_s(expected_ms * calls / 1e3)
        reply, (copy_in_ms, middle_ms, snap_ms) = self.clock.run(
            self.sock,
            header,
            fds,
            (self.inputs.tensor[:in_bytes], block[:in_bytes]),
            (snap_into, slots),
            limit,
            lambda lim: self._await_done(wid, lim),
            # (the judge's wait for the window to be queued: twice its own queueing of the
            # reference's window, 20 ms at least; a runner slower than that is timed as it queues)
            queue_s=0.0
            if self.as_launched
            else max(0.02, min(device_clock.HEAD_START_S, 2e-3 * (self.ref_host_ms or 0.05) * calls)),
        )
        if reply.get("error"):
            raise WindowError(f"ModelNew failed in a timing window: {str(reply['error'])[:300]}")
        if reply.get("phase") != "committed":
            raise WindowError("the runner answered a timing window out of turn")
        phases = device_clock.Phases(
            calls=calls,
            in_bytes=in_bytes,
            out_bytes=out_bytes,
            copies=calls * sum(1 for leaf in out_layout.leaves if leaf[0] == "tensor"),
            copy_in_ms=copy_in_ms,
            middle_ms=middle_ms,
            snapshot_ms=snap_ms,
            cal_copy_in_ms=cal[0],
            cal_snapshot_ms=cal[1],
            cal_commit_ms=cal[2],
            queued_ms=self.clock.queued_ms,
            judge_queued=self.clock.judge_queued,
            judge_host_ms=judge_host_ms,
            reference_queued=self.ref_queued and not self.as_launched,
        )
        if self.cal is not None:
            self.cal.see(phases)
        per_call = self.cal.candidate_ms(phases) if self.cal is not None else phases.span_ms / calls
        bad = self._bad_slots(snap_into, out_layout, ref_outs)
        runner_ms = reply.get("runner_ms")
        return WindowResult(
            calls=calls,
            wall_ms=phases.span_ms,
            copy_ms=0.0,
            open_ms=0.0,
            per_call_ms=per_call,
            bad_slots=bad,
            after_ms=snap_ms,
            open_to_computed_ms=copy_in_ms + middle_ms,
            runner_ms=runner_ms if isinstance(runner_ms, dict) else {},
            phases=phases,
        )

    def empty_window(self) -> float | None:
        """A device-clock window of no calls (the probe's): what the two context switches between
        the flags cost, device ms; None where the peer did not answer it as one."""
        fds: list[int] = []
        lent = [self.lend_flags(fds)]
        wid = self.next_id
        self.next_id += 1
        header = {"id": wid, "calls": 0, "clock": "device", "lent": lent}
        reply, (_, middle_ms, _) = self.clock.run(
            self.sock, header, fds, None, None, self.deadline_s(0.0), lambda lim: self._await_done(wid, lim)
        )
        if reply.get("error") or reply.get("phase") != "committed":
            return None
        return float(middle_ms)

    def _await_done(self, wid: int, limit_s: float) -> dict[str, Any]:
        end = time.monotonic() + limit_s
        # polled on the wall clock's GPU windows only: the device clock's span holds no hand-over
        spin = SPIN_S if self.device.type == "cuda" and self.clock is None else 0.0
        for _ in range(64):
            left = end - time.monotonic()
            if left <= 0 or not wait_readable([self.sock], left, spin):
                raise WindowTimeout(limit_s)
            try:
                data, fds = shared_region.recv(self.sock)
            except OSError as exc:
                raise WindowError(f"the runner's end of the window socket failed ({exc.strerror or exc})") from None
            for fd in fds:  # the runner sends no descriptors to the judge here
                os.close(fd)
            if not data:
                raise WindowError("the runner closed the window socket")
            try:
                msg = json.loads(data.decode(errors="replace"))
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("done") == wid:
                return msg
        raise WindowError("the runner flooded the window socket")


# On a GPU both sides poll their socket instead of sleeping in select() while a window is open or
# due (the runner after each window, the judge while it waits for `done`): a sleeping process's
# wake-up costs a hundred microseconds or more, a few percent of a short window. Not on the CPU,
# where a polling process would take a core from the calls being timed.
SPIN_S = 0.25


def wait_readable(fds: list[Any], timeout_s: float | None, spin_s: float = 0.0) -> list[Any]:
    """select() on `fds` for reading: polled without sleeping for up to `spin_s`, then blocking for
    what is left of `timeout_s` (None: for ever). The ready ones, or [] at the timeout."""
    t0 = time.monotonic()
    if spin_s > 0:
        stop = t0 + (spin_s if timeout_s is None else min(spin_s, timeout_s))
        while True:
            ready = select.select(fds, [], [], 0)[0]
            if ready or time.monotonic() >= stop:
                break
        if ready:
            return ready
    if timeout_s is None:
        return select.select(fds, [], [], None)[0]
    return select.select(fds, [], [], max(0.0, timeout_s - (time.monotonic() - t0)))[0]


def _round_trip_ms(spin_s: float = 0.0) -> float:
    """One message to another thread and its answer on a socket pair: the hand-over's own latency
    (both ends waiting as the judge and the runner do: polling on a GPU)."""
    import threading

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:

        def echo() -> None:
            wait_readable([b], 5.0, spin_s)
            b.send(b.recv(16))

        th = threading.Thread(target=echo, daemon=True)
        th.start()
        time.sleep(0.001)  # the thread waits in recv, as the runner waits for a window
        t0 = time.perf_counter()
        a.send(b"x")
        wait_readable([a], 5.0, spin_s)
        a.recv(16)
        ms = (time.perf_counter() - t0) * 1e3
        th.join(1.0)
        return ms
    finally:
        a.close()
        b.close()


class WindowTimeout(WindowError):
    def __init__(self, limit_s: float):
        super().__init__(f"the runner did not finish a timing window within {limit_s:.3g} s")
        self.limit_s = limit_s


STACKED_CHECK_BYTES = 256 << 20  # the stacked check's float64 temporaries, at most (per chunk of slots)


def slot_errors(cands: list[Any], refs: list[Any], stacked: bool | None = None) -> list[tuple[float, float] | None]:
    """`errors` of every slot (None for a slot that cannot be compared or raised): with `stacked`,
    at once over the stacked slots where every output is the same floating-point leaves (a few
    tensor operations, not a dozen and four synchronisations per slot), in chunks whose float64
    temporaries stay under STACKED_CHECK_BYTES (a window of 128 MB outputs would need tens of GB at
    once); otherwise, and where the slots cannot be stacked, one slot at a time with `errors`.
    `stacked` None: stacked on an accelerator, one slot at a time on a CPU, where a slot costs no
    synchronisation and `errors` works in the leaf's own precision (a tenth of the stacked float64
    check's time: benchmarks/slot_check.py)."""
    from kernelwright.engine.child.compare import flatten

    leaves = [x for _, x in flatten(refs[0]) if isinstance(x, torch.Tensor)] if refs else []
    if stacked is None:
        stacked = any(x.device.type != "cpu" for x in leaves)
    if not stacked:
        return _one_by_one(cands, refs)
    per_slot = sum(x.numel() for x in leaves)
    chunk = max(1, STACKED_CHECK_BYTES // max(1, 6 * 8 * per_slot))  # ~6 float64 temporaries an element
    batched: list[tuple[float, float] | None] | None = []
    for i in range(0, len(refs), chunk):
        try:
            part = _errors_stacked(cands[i : i + chunk], refs[i : i + chunk])
        except Exception:
            part = None
        if part is None or batched is None:
            batched = None
            break
        batched += part
    if batched is not None:
        return batched
    return _one_by_one(cands, refs)


def _one_by_one(cands: list[Any], refs: list[Any]) -> list[tuple[float, float] | None]:
    out: list[tuple[float, float] | None] = []
    for c, r in zip(cands, refs, strict=True):
        try:
            out.append(errors(c, r))
        except Exception:
            out.append(None)
    return out


def _errors_stacked(cands: list[Any], refs: list[Any]) -> list[tuple[float, float] | None] | None:
    from kernelwright.engine.child.compare import flatten, structure_mismatch

    if not refs or len(cands) != len(refs):
        return None
    ref_leaves = [[x for _, x in flatten(r)] for r in refs]
    cand_leaves = [[x for _, x in flatten(c)] for c in cands]
    first = ref_leaves[0]
    for r, c, rl, cl in zip(refs, cands, ref_leaves, cand_leaves, strict=True):
        if structure_mismatch(c, r) or len(rl) != len(first) or len(cl) != len(first):
            return None
        for x, y, f in zip(rl, cl, first, strict=True):
            ok = (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.is_floating_point()
                and x.shape == f.shape
                and y.shape == x.shape
                and x.dtype == f.dtype
            )
            if not ok:
                return None
    n = len(refs)
    dev = first[0].device if first else torch.device("cpu")
    norm = torch.zeros(n, dtype=torch.float64, device=dev)
    elem = torch.zeros(n, dtype=torch.float64, device=dev)
    bad = torch.zeros(n, dtype=torch.bool, device=dev)
    for j in range(len(first)):
        r64 = torch.stack([rl[j] for rl in ref_leaves]).to(torch.float64).reshape(n, -1)
        c64 = torch.stack([cl[j].to(r64.device) for cl in cand_leaves]).to(torch.float64).reshape(n, -1)
        if not r64.shape[1]:
            continue
        fin = torch.isfinite(r64)
        bad |= (fin != torch.isfinite(c64)).any(dim=1)
        zero = torch.zeros((), dtype=torch.float64, device=r64.device)
        d = torch.where(fin, c64 - r64, zero)
        rf = torch.where(fin, r64, zero)
        one = torch.ones((), dtype=torch.float64, device=r64.device)
        scale = torch.linalg.vector_norm(rf, dim=1)
        norm = torch.maximum(norm, torch.linalg.vector_norm(d, dim=1) / torch.where(scale > 0, scale, one))
        top = rf.abs().amax(dim=1)
        elem = torch.maximum(elem, d.abs().amax(dim=1) / torch.where(top > 0, top, one))
    return [
        None if b else (float(x), float(y)) for b, x, y in zip(bad.tolist(), norm.tolist(), elem.tolist(), strict=True)
    ]


def errors(cand: Any, ref: Any) -> tuple[float, float] | None:
    """(largest normwise relative error, largest element error relative to the output's scale) over
    the leaves, or None where the structure, a shape or the non-finite pattern differs."""
    from kernelwright.engine.child.compare import flatten, structure_mismatch

    if structure_mismatch(cand, ref):
        return None
    norm = elem = 0.0
    for (_, c), (_, r) in zip(flatten(cand), flatten(ref), strict=False):
        if not isinstance(r, torch.Tensor):
            if c != r:
                return None
            continue
        if not isinstance(c, torch.Tensor) or c.shape != r.shape:
            return None
        if not (r.is_floating_point() or r.is_complex()):
            if not torch.equal(c.to(r.dtype), r):
                return None
            continue
        quick = _finite_leaf_errors(c, r)
        if quick is not None:
            norm, elem = max(norm, quick[0]), max(elem, quick[1])
            continue
        c64, r64 = (
            c.to(torch.float64 if not r.is_complex() else torch.complex128),
            r.to(torch.float64 if not r.is_complex() else torch.complex128),
        )
        fin = torch.isfinite(r64)
        if not torch.equal(fin, torch.isfinite(c64)):  # NaN or Inf where the reference has none, or the reverse
            return None
        if not r64.numel():
            continue
        zero = torch.zeros((), dtype=r64.dtype, device=r64.device)
        d = torch.where(fin, c64 - r64, zero)  # (a boolean mask index costs ms on a CPU: where() does not)
        rf = torch.where(fin, r64, zero)
        scale = float(torch.linalg.vector_norm(rf)) or 1.0
        norm = max(norm, float(torch.linalg.vector_norm(d)) / scale)
        top = float(rf.abs().max()) or 1.0
        elem = max(elem, float(d.abs().max()) / top)
    return norm, elem


def _finite_leaf_errors(c: torch.Tensor, r: torch.Tensor) -> tuple[float, float] | None:
    """`errors` of one real floating-point leaf where both sides are finite everywhere, in the
    leaf's own precision (float32 for float32 and narrower; float64 stays float64): a third of the
    float64 path's memory traffic. None where a difference or a norm is not finite (a non-finite
    value on either side, or an overflow): the caller takes the exact float64 path then. The
    judge's bound for timed outputs comes from this same function, with 16x room above it."""
    if r.is_complex() or c.is_complex() or not r.numel():
        return None
    wd = torch.float64 if r.dtype == torch.float64 else torch.float32
    rw = r if r.dtype == wd else r.to(wd)
    cw = c if (c.dtype == wd and c.device == r.device) else c.to(device=r.device, dtype=wd)
    d = cw - rw  # non-finite wherever either side is (inf - inf, nan - x): the exact path decides then
    if not bool(torch.isfinite(d).all()):
        return None
    nd, nr = float(torch.linalg.vector_norm(d)), float(torch.linalg.vector_norm(rw))
    dmax, top = float(d.abs().max()), float(rw.abs().max())
    if not all(math.isfinite(v) for v in (nd, nr, dmax, top)):
        return None
    return nd / (nr or 1.0), dmax / (top or 1.0)


def _own(out: Any) -> Any:
    """`out` with every tensor that shares memory with something else copied into memory of its own."""
    if isinstance(out, torch.Tensor):
        return out.clone() if out._base is not None or not out.is_contiguous() else out
    if isinstance(out, tuple):
        return tuple(_own(x) for x in out)
    if isinstance(out, list):
        return [_own(x) for x in out]
    if isinstance(out, dict):
        return {k: _own(v) for k, v in out.items()}
    return out


def _rebuild(like: Any, leaves: list[torch.Tensor]) -> Any:
    """`leaves` in the structure of `like` (the reference's output: a tensor or nested containers)."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return next(it)
        if isinstance(node, tuple):
            return tuple(build(x) for x in node)
        if isinstance(node, list):
            return [build(x) for x in node]
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        return node

    return build(like)
