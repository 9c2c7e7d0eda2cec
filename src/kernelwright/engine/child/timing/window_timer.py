"""The judge's side of a window (`WindowTimer`): draws, reference windows, candidate windows,
snapshots and the check of every slot. See the package's docstring for the protocol.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.engine.child import shared_region
from kernelwright.engine.child.correctness import leaf_scales, slot_errors
from kernelwright.engine.child.timing import device_clock
from kernelwright.engine.child.timing.layouts import Layout, WindowError, _next_region_id
from kernelwright.engine.child.timing.runner_window import commit, laid_out
from kernelwright.engine.child.timing.window_io import (
    SPIN_S,
    WindowTimeout,
    _no_gc,
    _protocol_threads,
    _round_trip_ms,
    _sync,
    wait_readable,
)
from kernelwright.engine.child.timing.window_plan import Measures


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
    # the first wrong slots, as evidence: [index in the window, [normwise, element] error or None]
    bad_at: list[Any] = field(default_factory=list)


class WindowTimer:
    """The judge's side: draws, reference windows, candidate windows, snapshots, checks."""

    def __init__(
        self,
        sock: socket.socket,
        device: torch.device,
        draw: Callable[[], list[Any]],
        reference: Callable[..., Any],
        check: Callable[[tuple[float, float] | None, Any, Any, Any], bool],
        deadline_s: Callable[[float], float],
        threads: int | None = None,
    ):
        self.sock = sock
        self.threads = threads  # CPU: the intra-op thread count both sides time with
        self.device = device
        self.draw = draw  # fresh inputs from the judge's secret stream
        self.reference = reference
        # (a slot's errors against its reference output, that output, the slot's own, the window's
        # scales or None) -> acceptable
        self.check = check
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

    def requeue(self) -> None:
        """Both sides' windows tried queued whole again (after the windows were made shorter)."""
        self.as_launched = False
        self.ref_queued = True

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
        wrong = self._wrong_slots(snap, out_layout, ref_outs, reply.get("orders"))
        runner_ms = reply.get("runner_ms")
        return WindowResult(
            calls=calls,
            wall_ms=wall_ms,
            copy_ms=copy_ms,
            open_ms=open_ms,
            per_call_ms=timed_ms / calls,
            bad_slots=len(wrong),
            bad_at=_evidence(wrong),
            after_ms=after_ms,
            open_to_computed_ms=(t_done - t0) * 1e3,
            runner_ms=runner_ms if isinstance(runner_ms, dict) else {},
        )

    def _wrong_slots(
        self, snap: torch.Tensor, out_layout: Layout, ref_outs: list[Any], orders: Any = None
    ) -> list[tuple[int, tuple[float, float] | None]]:
        """A window's slots, as snapshot into `snap`, that are wrong for their own inputs: (index,
        its errors as `slot_errors` gives them).
        `orders`: the runner's word on the dim order its outputs were committed in (runner_window's
        `dense_orders`); an order that does not fit a slot is ignored (`laid_out`)."""
        region = shared_region.Region(snap, snap.numel(), -1)
        slots = out_layout.sets(region, len(ref_outs))
        if isinstance(orders, list) and orders:
            slots = [[laid_out(q, o) for q, o in zip(sl, orders, strict=False)] + sl[len(orders) :] for sl in slots]
        cands = [_rebuild(ref, sl) for ref, sl in zip(ref_outs, slots, strict=True)]
        errs = slot_errors(cands, ref_outs)
        rows = [(i, e, ref, c) for i, (e, ref, c) in enumerate(zip(errs, ref_outs, cands, strict=True))]
        wrong = [row for row in rows if not self.check(row[1], row[2], row[3], None)]
        if wrong:  # looked at again against the window's scale (`TimedBound.allows`)
            scales = leaf_scales(ref_outs)
            wrong = [row for row in wrong if not self.check(row[1], row[2], row[3], scales)]
        return [(i, e) for i, e, _, _ in wrong]

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
        wrong = self._wrong_slots(snap_into, out_layout, ref_outs, reply.get("orders"))
        runner_ms = reply.get("runner_ms")
        return WindowResult(
            calls=calls,
            wall_ms=phases.span_ms,
            copy_ms=0.0,
            open_ms=0.0,
            per_call_ms=per_call,
            bad_slots=len(wrong),
            bad_at=_evidence(wrong),
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


def _evidence(wrong: list[tuple[int, tuple[float, float] | None]], most: int = 3) -> list[Any]:
    """The first `most` wrong slots of a window for the record: [index, [norm, element] or None]."""
    return [[i, None if e is None else [float(f"{x:.3g}") for x in e]] for i, e in wrong[:most]]


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
