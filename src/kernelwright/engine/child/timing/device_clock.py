"""GPU timing windows on the device's own timeline: the judge's CUDA events span the runner's kernels.

A window timed by the judge's wall clock holds, besides the candidate's calls, what two processes
pay to hand a window over (messages, wake-ups, the runner's mapping of a fresh region): about 1 ms
on an H100 that the judge can only estimate from another process (probe.py). On a GPU the judge
can do better: both processes map one small region of flags (`shared_region`, device memory made
with the driver's virtual memory API), and the driver's stream memory operations
(`cuStreamWaitValue32`, `cuStreamWriteValue32`) order work across the two processes on the device
itself. A window:

- before the clock, the runner maps the stage's regions once (the inputs' region, the output ring,
  the flags), makes its views, enqueues on its stream a wait for the window's number in the `in`
  flag, then its calls and its commit, and a write of the number to the `done` flag, and says
  `armed`. Nothing of that runs yet: its stream waits on the device. (Where the launch queue fills
  first, the runner's host waits for the device: the judge waits for `armed` a while, then goes
  on, and the rest of the window is timed as the runner queues it.)
- the judge's stream then runs, all of it queued behind a kernel that only waits (so that none of the
  host's launches fall inside the span): an event, its copy of the window's fresh inputs from its own
  memory into the inputs' region (until this copy the region holds only the last window's inputs,
  which the runner has seen), an event, the write of `in` (the runner's work starts on the device),
  a wait for `done`, an event, the snapshot of the ring into its own memory, an event.

The span between the judge's first and last events is device time on the judge's own stream:
host latencies on either side fall outside it unless the device waits for them (then they are
the candidate's). The reference's window is timed the same way: its calls queued behind a
device-side sleep before the device starts on them (`queued_ahead`): both sides' figures are the
device's time for the work, and neither side's launch overhead counts unless its queueing could
not keep ahead of the device. What comes off is each phase's calibrated cost, never more than the
phase took: the judge's copy in and snapshot and the commit (the judge's own copies of as many
bytes, and its own commit of the reference's outputs, on its own memory before each window: the
smallest of the stage) and the two context switches between the processes (the probe's empty
windows: a trusted process running one kernel of one element between the flags, so that the SMs
switch contexts as for any window), capped by what the probe showed at the judge's start-up,
before any candidate code could run (`Anchor`). Work the runner runs beside the judge's measures
(a persistent kernel, time-sliced with them) can only make them larger; what it gains beside the
window's own copies is what separates them from the judge's measures (docs/SANDBOX.md).

Every copy the judge makes inside a window is a kernel (`byte_copy`), never a copy engine: kernels
of two processes are time-sliced on the device, so work the runner runs during the judge's copies
lengthens them; a copy engine would run beside the runner's kernels.

Imports only torch, the standard library and the child's own modules.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.engine.child import device_handoff, shared_region
from kernelwright.engine.child.timing import runner_window, window_io
from kernelwright.engine.child.timing.layouts import Layout, WindowError

FLAG_BYTES = 4096
IN_AT, DONE_AT = 0, 512  # byte offsets of the two flags (apart: no shared cache line)
_WAIT_GEQ = 0x0
SLACK_MS = 0.02
SWITCH_CAP_MS = 1.0  # the most two context switches may take off a window
# the most a window's own measure of its copy in may take off, as a multiple of the stage's smallest
# (the copy's rate drifts over a stage: docs/PERFORMANCE.md)
COPY_IN_DRIFT = 1.25
HEAD_START_S = 0.25  # the most the judge waits for a window to be queued before it starts it
POLL_FIRST_S, POLL_MAX_S = 50e-6, 1e-3  # the judge's naps while a window runs (doubling from the first)
JUDGE_HEAD_MS = 1.0  # the device-side wait the judge's part of a window is queued behind
CONTENDED_FACTOR = 3.0  # switches this many times the start-up's (+0.1 ms): another context kept the device


# (the driver's own: this driver or device cannot do what the device clock needs; the wall clock stands)
Unavailable = device_handoff.Unavailable


class _MemOps:
    """The driver's stream wait/write of a 32-bit value, through ctypes on libcuda."""

    def __init__(self) -> None:
        self.driver = device_handoff._driver()
        lib = self.driver.lib
        self.fns: dict[str, Any] = {}
        for op in ("Wait", "Write"):
            fn = getattr(lib, f"cuStream{op}Value32_v2", None) or getattr(lib, f"cuStream{op}Value32", None)
            if fn is None:
                raise Unavailable(f"the CUDA driver has no cuStream{op}Value32")
            fn.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            self.fns[op] = fn

    def wait(self, stream: torch.cuda.Stream, addr: int, value: int) -> None:
        self.driver.check(self.fns["Wait"](stream.cuda_stream, addr, value, _WAIT_GEQ), "cuStreamWaitValue32")

    def write(self, stream: torch.cuda.Stream, addr: int, value: int) -> None:
        self.driver.check(self.fns["Write"](stream.cuda_stream, addr, value, 0), "cuStreamWriteValue32")


_OPS: list[_MemOps] = []


def memops() -> _MemOps:
    if not _OPS:
        _OPS.append(_MemOps())
    return _OPS[0]


def byte_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`src` into `dst` with a kernel on the current stream (bit for bit; `copy_` where either is
    not one contiguous block of the same dtype and shape, which is a kernel too)."""
    if not (dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype and dst.shape == src.shape):
        dst.copy_(src)
        return
    d, s = dst.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8)
    if d.numel() % 4 == 0 and d.data_ptr() % 4 == 0 and s.data_ptr() % 4 == 0:
        d, s = d.view(torch.int32), s.view(torch.int32)
    torch.bitwise_or(s, 0, out=d)


def self_test(device: torch.device) -> str:
    """'' when this process can order its stream on a flag in device memory, else why not."""
    try:
        ops = memops()
        region = shared_region.create(FLAG_BYTES, device)
        try:
            region.tensor.zero_()
            stream = torch.cuda.current_stream(device)
            ops.write(stream, region.tensor.data_ptr() + IN_AT, 7)
            ops.wait(stream, region.tensor.data_ptr() + IN_AT, 7)
            torch.cuda.synchronize(device)
            got = int(region.tensor[IN_AT : IN_AT + 4].view(torch.int32).item())
        finally:
            region.close()
        return "" if got == 7 else "a flag written on the stream did not arrive"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"


# ---- what the judge measures before any candidate code runs ---------------------------------------


@dataclass
class Anchor:
    """The two processes' hand-over as the judge's probe showed it at the judge's start-up, before
    any candidate code could run: the cap of what the stage's context switches may take off, and
    the yardstick for a device kept busy by another context (`Calibration.contended`).

    Measured twice, each time once the judge has waited for the GPU's turn (engine/child/gpu_turn.py):
    at start-up, and again when its turn for the checks begins (`see_in_turn`). The least of the
    two stands: another context's work only lengthens a hand-over, so the lesser is the cleaner (an
    anchor taken while another evaluation timed its windows would widen the cap and hide the
    contention it is the yardstick of). The candidate has been imported by the second: work it
    left running can only lengthen that one, and a shorter anchor only takes less off both sides'
    windows, which lowers a speed-up above 1, never raises it."""

    switch_ms: float | None = None  # the probe's empty window (two context switches): the least seen
    startup_ms: float | None = None  # as measured at the judge's start-up
    in_turn_ms: float | None = None  # as measured when the judge's turn for its checks began
    startup_turn: str = ""  # how the start-up measure had the GPU ('held', 'held after N s', or why not)

    def see_in_turn(self, ms: float | None) -> None:
        self.in_turn_ms = ms
        if ms is not None and (self.switch_ms is None or ms < self.switch_ms):
            self.switch_ms = ms

    def switch_cap(self) -> float:
        if self.switch_ms is None:
            return SWITCH_CAP_MS
        return min(SWITCH_CAP_MS, 1.25 * self.switch_ms + SLACK_MS)

    def to_json(self) -> dict[str, Any]:
        def ms(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "switch_ms": ms(self.switch_ms),
            "startup_ms": ms(self.startup_ms),
            "in_turn_ms": ms(self.in_turn_ms),
            "startup_turn": self.startup_turn,
        }


def _events(n: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def queued_ahead(device: torch.device, enqueue: Any, guess_ms: float) -> tuple[Any, float, float, bool]:
    """`enqueue()` (work it queues on the current stream) timed on the device with the whole of it
    queued first, as the runner's window is: behind a device-side sleep of 1.5 times `guess_ms`
    (the host's expected time to queue it) plus 1 ms, at most `HEAD_START_S`. (its result, device
    ms, host ms, whether the sleep outlasted the host's queueing: else the device may have waited
    for the host inside the span, as where the launch queue is full)."""
    torch.cuda.synchronize(device)
    ev = _events(2)
    sleep_ms = min(1.5 * max(guess_ms, 0.0) + 1.0, HEAD_START_S * 1e3)
    torch.cuda._sleep(int(sleep_ms * 2e6))  # clock cycles at 2 GHz (a slower clock only sleeps longer)
    ev[0].record()
    t0 = time.perf_counter()
    result = enqueue()
    host_ms = (time.perf_counter() - t0) * 1e3
    ahead = not ev[0].query()
    ev[1].record()
    torch.cuda.synchronize(device)
    return result, float(ev[0].elapsed_time(ev[1])), host_ms, ahead


# ---- the runner's side ----------------------------------------------------------------------------


class Lent:
    """The runner's mappings of the regions the judge lends it for a timing stage (the inputs'
    region, the output ring, the flags), each mapped once and replaced when the judge names a
    new one."""

    def __init__(self) -> None:
        self.regions: dict[str, tuple[int, shared_region.Region]] = {}

    def take(self, spec: Any, fds: list[int], max_bytes: int, device: torch.device) -> dict[str, shared_region.Region]:
        """The regions `spec` names (`[[name, id, bytes, new], ...]`); a new one's descriptor is the
        next of `fds` (taken from it)."""
        if not isinstance(spec, list) or len(spec) > 3:
            raise ValueError("malformed lent regions")
        out: dict[str, shared_region.Region] = {}
        for item in spec:
            if not (
                isinstance(item, list)
                and len(item) == 4
                and item[0] in ("inputs", "ring", "flags")
                and isinstance(item[1], int)
                and isinstance(item[2], int)
                and 0 < item[2] <= max_bytes
            ):
                raise ValueError("malformed lent region")
            name, rid, nbytes, new = item
            if new:
                if not fds:
                    raise ValueError("a new region without its descriptor")
                fd = fds.pop(0)
                old = self.regions.pop(name, None)
                if old is not None:
                    old[1].close()
                self.regions[name] = (rid, shared_region.attach(fd, nbytes, device))
            held = self.regions.get(name)
            if held is None or held[0] != rid or held[1].nbytes < nbytes:
                raise ValueError(f"the window names a {name} region this runner has not mapped")
            out[name] = held[1]
        return out

    def close(self) -> None:
        for _, r in self.regions.values():
            r.close()
        self.regions.clear()


_RUNNER_EVENTS: list[Any] = []
_TOUCHED: dict[str, torch.Tensor] = {}


def _touch(device: torch.device) -> None:
    """One kernel of one element: an empty window (the probe's) still switches the device's SMs to
    its context and back, as every candidate's window does. Without a kernel only the front end
    switches: 0.03-0.05 ms on an H100, against 0.29 ms with one (benchmarks/handoff_anatomy.py)."""
    key = str(device)
    if key not in _TOUCHED:
        _TOUCHED[key] = torch.zeros(1, device=device)
    _TOUCHED[key].zero_()


def serve(
    sock: socket.socket,
    header: dict[str, Any],
    fds: list[int],
    model: Any,
    device: torch.device,
    max_bytes: int,
    lent: Lent,
) -> None:
    """The runner's side of a device-clock window (it runs the candidate, so it decides nothing):
    map what is new, arm the wait, say `armed`, enqueue the calls and the commit and the `done`
    flag, then answer with its own account (evidence only)."""

    wid = header.get("id")
    reply: dict[str, Any] = {"done": wid, "phase": "committed"}
    failure: BaseException | None = None
    ops = stream = None
    done_at = w = None
    armed = done = False
    fds = list(fds)
    try:
        t_start = time.perf_counter()
        w = header.get("window")
        if not isinstance(w, int) or not 0 < w < 1 << 30:
            raise WindowError("malformed window number")
        n = int(header["calls"])
        if not 0 <= n <= 1 << 16:
            raise WindowError("window size out of range")
        regions = lent.take(header.get("lent"), fds, max_bytes, device)
        flags = regions["flags"].tensor.data_ptr()
        args: list[list[Any]] = []
        slots: list[list[Any]] = []
        lout = None
        if n:
            lin = Layout.from_json(header["inputs"], max_bytes)
            lout = Layout.from_json(header["outputs"], max_bytes)
            args = lin.sets(regions["inputs"], n)
            if n * lout.stride > regions["ring"].nbytes:
                raise WindowError("the output ring is smaller than the window")
            slots = lout.sets(regions["ring"], n)  # (before the clock: the commit only copies)
        ops = memops()
        stream = torch.cuda.current_stream(device)
        if not _RUNNER_EVENTS:
            _RUNNER_EVENTS.extend(_events(3))
        ev = _RUNNER_EVENTS
        ops.wait(stream, flags + IN_AT, w)
        done_at = flags + DONE_AT
        t_armed = time.perf_counter()
        ev[0].record()
        outs = []
        with torch.no_grad(), window_io._no_gc():
            for a in args:
                outs.append(model(*a))
        if n == 0:
            _touch(device)
        ev[1].record()
        t_launched = time.perf_counter()
        if lout is not None:
            orders = runner_window.dense_orders(outs[0]) if outs else []
            reply["mismatched"] = runner_window.commit(
                outs, lout, regions["ring"], fused=True, slots=slots, orders=orders
            )
            if any(orders):
                reply["orders"] = orders
        ev[2].record()
        ops.write(stream, done_at, w)
        done = True
        # `armed` once the whole window is queued: the device runs it back to back from the judge's
        # `in` (where the launch queue fills first, this waits for the judge, which goes on without it)
        shared_region.send(sock, json.dumps({"done": wid, "phase": "armed"}).encode(), [])
        armed = True
        del outs, args, slots
        reply["runner_ms"] = {
            "map": round((t_armed - t_start) * 1e3, 4),
            "enqueue": round((t_launched - t_armed) * 1e3, 4),
        }
    except Exception as exc:
        reply["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        failure = exc
    finally:
        for fd in fds:  # descriptors a malformed header left untaken
            try:
                os.close(fd)
            except OSError:
                pass
        if ops is not None and stream is not None and done_at is not None and w is not None:
            if not done:
                try:  # always: the judge's stream waits for it
                    ops.write(stream, done_at, w)
                except Exception:
                    pass
            if not armed:  # (its wait is queued: the judge's `in` lets this stream go)
                try:
                    shared_region.send(sock, json.dumps({"done": wid, "phase": "armed"}).encode(), [])
                except OSError:
                    pass
        window_io._sync_quietly(device)
        if failure is None and isinstance(reply.get("runner_ms"), dict):
            try:
                reply["runner_ms"]["device"] = round(_RUNNER_EVENTS[0].elapsed_time(_RUNNER_EVENTS[1]), 4)
                reply["runner_ms"]["commit"] = round(_RUNNER_EVENTS[1].elapsed_time(_RUNNER_EVENTS[2]), 4)
            except Exception:
                pass
        shared_region.send(sock, json.dumps(reply).encode(), [])
    if failure is not None:
        raise failure


# ---- the judge's side -----------------------------------------------------------------------------


_SIDE_STREAMS: dict[str, torch.cuda.Stream] = {}


def _nonblocking_stream(device: torch.device) -> torch.cuda.Stream:
    """A stream of the driver's own that never waits for the legacy default stream (the one the
    judge's windows wait on): one a device for the process (a judge lives on, and the driver's
    streams are never destroyed here)."""
    key = str(device)
    if key not in _SIDE_STREAMS:
        lib = device_handoff._driver().lib
        handle = ctypes.c_void_p()
        fn = lib.cuStreamCreate
        fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint], ctypes.c_int
        if fn(ctypes.byref(handle), 1) != 0:  # CU_STREAM_NON_BLOCKING
            return torch.cuda.Stream(device)
        _SIDE_STREAMS[key] = torch.cuda.ExternalStream(handle.value, device=device)
    return _SIDE_STREAMS[key]


def _closed(sock: socket.socket) -> bool:
    """Whether the runner's end of the socket is gone (a message waiting is left where it is)."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@dataclass
class Phases:
    """One window on the judge's stream (device ms): its copy in, the runner's part (between the
    `in` flag and the `done` flag: the calls, the commit and two context switches) and the
    snapshot; and the judge's own measures of the three copies, taken just before it."""

    calls: int
    in_bytes: int
    out_bytes: int
    copies: int  # the commit's outputs' leaves
    copy_in_ms: float
    middle_ms: float
    snapshot_ms: float
    cal_copy_in_ms: float
    cal_snapshot_ms: float
    cal_commit_ms: float
    queued_ms: float | None = None  # the judge's wait for the runner's `armed` (None: it went on without)
    reference_queued: bool = True  # the reference's window beside it was all queued before it began
    judge_queued: bool = True  # the judge's own part was all queued before the device reached it
    judge_host_ms: float = 0.0  # the judge's own time to make the window's views and queue its commit

    @property
    def span_ms(self) -> float:
        return self.copy_in_ms + self.middle_ms + self.snapshot_ms


@dataclass
class Calibration:
    """The smallest of the judge's own measures of each fixed cost over the stage (by size), and of
    the probe's empty windows. Each is taken where the runner cannot tell it from idle time (the
    judge's own memory, between windows): work the runner runs on the device beside them (a
    persistent kernel, time-sliced with the judge's) can only make them larger, and the smallest
    is the closest to the truth (the copy in excepted: `off`)."""

    anchor: Anchor | None
    copy_in: dict[int, float] = field(default_factory=dict)  # bytes -> ms
    snapshot: dict[int, float] = field(default_factory=dict)
    commit: dict[tuple[int, int], float] = field(default_factory=dict)  # (bytes, leaves) -> ms
    switches: list[float] = field(default_factory=list)  # the probe's empty windows, in order
    armed_ms: float | None = None  # the smallest wait for `armed` of the probe's empty windows (host ms)

    def see(self, p: Phases) -> None:
        self.copy_in[p.in_bytes] = min(self.copy_in.get(p.in_bytes, float("inf")), p.cal_copy_in_ms)
        self.snapshot[p.out_bytes] = min(self.snapshot.get(p.out_bytes, float("inf")), p.cal_snapshot_ms)
        key = (p.out_bytes, p.copies)
        self.commit[key] = min(self.commit.get(key, float("inf")), p.cal_commit_ms)

    @property
    def switch(self) -> float | None:
        """The two context switches: the smallest of the probe's empty windows."""
        return min(self.switches) if self.switches else None

    def see_switch(self, ms: float) -> None:
        self.switches.append(ms)

    def see_armed(self, ms: float | None) -> None:
        """An empty window's wait for `armed`: a message each way and a runner's minimal queueing."""
        if ms is not None:
            self.armed_ms = ms if self.armed_ms is None else min(self.armed_ms, ms)

    def launch_ms(self, p: Phases) -> float | None:
        """The host's time to queue the candidate's calls of window `p`, per call, by the judge's
        clock: its wait for `armed`, less what the probe's empty windows waited (the messages) and
        the judge's own time for the rest of what the runner queues (the views, the commit). None
        where the judge went on without `armed` (the window was timed as it was queued)."""
        if p.queued_ms is None:
            return None
        return max(p.queued_ms - (self.armed_ms or 0.0) - p.judge_host_ms, 0.0) / max(p.calls, 1)

    def contended(self) -> str:
        """Why the device looked busy with another context's work between windows ('' if not): the
        probe's empty windows, every one of the stage, far slower than at the judge's start-up."""
        a = self.anchor
        if a is None or a.switch_ms is None or self.switch is None:
            return ""
        if self.switch > CONTENDED_FACTOR * a.switch_ms + 0.1:
            return (
                f"the hand-over between two processes took {self.switch:.3g} ms at best in this stage against "
                f"{a.switch_ms:.3g} ms before the candidate ran: another context kept the device busy"
            )
        return ""

    def off(self, p: Phases) -> dict[str, float]:
        """What comes off window `p`, phase by phase, never more than the phase took. The copy in
        takes off the window's own measure (taken just before it, on the memory it writes), at most
        COPY_IN_DRIFT times the stage's smallest: work the runner runs beside that measure can
        inflate it, and gains at most that share of the copy, never more than the phase took. The
        snapshot and the commit take off the stage's smallest (their own measures drift less than
        they vary: a window's own over-corrects)."""
        smallest = self.copy_in.get(p.in_bytes, p.cal_copy_in_ms)
        c_in = min(p.cal_copy_in_ms, COPY_IN_DRIFT * smallest)
        c_snap = self.snapshot.get(p.out_bytes, p.cal_snapshot_ms)
        c_commit = self.commit.get((p.out_bytes, p.copies), p.cal_commit_ms)
        c_switch = 0.0 if self.switch is None else self.switch
        c_switch = min(c_switch, self.anchor.switch_cap() if self.anchor is not None else SWITCH_CAP_MS)
        return {
            "copy_in": min(c_in, p.copy_in_ms),
            "snapshot": min(c_snap, p.snapshot_ms),
            "commit_and_switch": min(c_commit + c_switch, p.middle_ms),
        }

    def candidate_ms(self, p: Phases) -> float:
        """The candidate's time per call in window `p`."""
        return max(p.span_ms - sum(self.off(p).values()), 0.0) / max(p.calls, 1)


class Clock:
    """The judge's device-side window machinery for one timing stage (one per WindowTimer)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.ops = memops()
        self.flags: shared_region.Region | None = None
        self.seq = 0  # the last window number written to the flags
        self.events = _events(4)
        self.host_ms = 1.0  # the host's time to enqueue the last calibration's commit
        self.views_ms = 0.0  # the host's time to make the last calibration's output views
        self.pending: int | None = None  # a window left waiting for its `done` (released at `close`)
        self.stuck = False  # a window's wait never ended: the stream is not waited on again
        self.queued_ms: float | None = None  # the last window's wait for `armed` (None: not waited out)
        self.judge_queued = True  # the last window's judge part was all queued before the device reached it

    def flags_region(self) -> shared_region.Region:
        if self.flags is None:
            self.flags = shared_region.create(FLAG_BYTES, self.device)
            self.flags.tensor.zero_()
            self.seq = 0
        return self.flags

    def calibrate(
        self, block: torch.Tensor, snap: torch.Tensor, ref_outs: list[Any], out_layout: Any
    ) -> tuple[float, float, float]:
        """The judge's own measure, device ms, of the window's three copies, on its own memory: the
        copy in (`block`, the inputs' region, onto itself: as many bytes read and written), the snapshot (the
        snapshot's memory onto itself) and the commit (the reference's outputs into the snapshot's
        memory, with the runner's code). Enqueued behind a device-side sleep, so that the device
        runs them back to back, as it runs the runner's commit: queued, with its calls, before the
        judge lets its window start."""
        torch.cuda.synchronize(self.device)
        # a kernel that only waits, so that the host has enqueued everything before the device
        # starts on it (as the runner's commit is queued behind its calls): twice the host's
        # last enqueue, in clock cycles at 2 GHz (a slower clock only waits longer; not timed)
        torch.cuda._sleep(int(max(1.0, 2.0 * self.host_ms) * 2e6))
        ev = self.events
        ev[0].record()
        byte_copy(block, block)
        ev[1].record()
        byte_copy(snap, snap)
        ev[2].record()
        region = shared_region.Region(snap, snap.numel(), -1)
        t_views = time.perf_counter()
        slots = out_layout.sets(region, len(ref_outs))  # (made before the clock, as the runner's are)
        t0 = time.perf_counter()
        runner_window.commit(ref_outs, out_layout, region, fused=True, slots=slots)
        self.host_ms = (time.perf_counter() - t0) * 1e3
        self.views_ms = (t0 - t_views) * 1e3
        ev[3].record()
        torch.cuda.synchronize(self.device)
        return (
            float(ev[0].elapsed_time(ev[1])),
            float(ev[1].elapsed_time(ev[2])),
            float(ev[2].elapsed_time(ev[3])),
        )

    def run(
        self,
        sock: socket.socket,
        header: dict[str, Any],
        fds: list[int],
        copy_in: tuple[torch.Tensor, torch.Tensor] | None,
        snapshot: tuple[torch.Tensor, torch.Tensor] | None,
        limit_s: float,
        await_msg: Any,
        queue_s: float = HEAD_START_S,
    ) -> tuple[dict[str, Any], tuple[float, float, float]]:
        """One window: the header out, `armed` back (the runner's whole window queued behind its
        wait on `in`: waited for `queue_s` at most, then the judge goes on and whatever the runner
        has yet to queue is timed as it comes), the judge's part on its stream, the runner's
        reply. (copy in ms, middle ms, snapshot ms) on the device; `await_msg(limit_s)` reads the
        runner's next message for this window. `self.queued_ms`: the judge's wait for `armed`
        (None: it went on without it)."""
        flags = self.flags_region()
        self.seq += 1
        w = self.seq
        header = dict(header, window=w)
        t0 = time.perf_counter()
        try:
            shared_region.send(sock, json.dumps(header).encode(), fds)
        except OSError as exc:
            why = exc.strerror or exc
            raise WindowError(f"the runner's end of the window socket is gone ({why})") from None
        msg: dict[str, Any] | None
        try:
            msg = await_msg(min(queue_s, limit_s))
        except window_io.WindowTimeout:
            msg = None  # still queueing (its launch queue full, or slow): the device starts it now
        self.queued_ms = None if msg is None else (time.perf_counter() - t0) * 1e3
        if msg is not None and msg.get("phase") != "armed":  # it failed before its wait was armed
            return msg, (0.0, 0.0, 0.0)
        stream = torch.cuda.current_stream(self.device)
        ev = self.events
        # the judge's part queued whole behind a kernel that only waits, so that the device runs it
        # back to back: without it the host's launch of each step after the first event was in the
        # span (0.1-0.2 ms a window on an H100, where the runner and the probe share its cores)
        torch.cuda._sleep(int(JUDGE_HEAD_MS * 2e6))  # clock cycles at 2 GHz (a slower clock only waits longer)
        ev[0].record()
        if copy_in is not None:
            byte_copy(*copy_in)
        ev[1].record()
        self.ops.write(stream, flags.tensor.data_ptr() + IN_AT, w)
        self.ops.wait(stream, flags.tensor.data_ptr() + DONE_AT, w)
        ev[2].record()
        if snapshot is not None:
            byte_copy(*snapshot)
        ev[3].record()
        self.judge_queued = not ev[0].query()  # (False: the device reached the span before the host queued it)
        # the judge sleeps between its looks at the last event: when it notices is outside the span
        # (a judge polling without a pause takes a core from the runner's launches, which are the
        # candidate's time where its calls are not all queued)
        end = time.monotonic() + limit_s
        nap = POLL_FIRST_S
        while not ev[3].query():
            if time.monotonic() > end:
                self.pending = w  # released when the timer closes, after the runner was told to stop
                raise window_io.WindowTimeout(limit_s)
            if nap >= POLL_MAX_S:
                if _closed(sock):
                    self.pending = w
                    raise WindowError("the runner closed the window socket")
                if msg is None and window_io.wait_readable([sock], 0.0):
                    msg = await_msg(1.0)  # its late `armed`, or an answer without one: it armed nothing
                    if msg.get("phase") != "armed":
                        self.pending = w
                        return msg, (0.0, 0.0, 0.0)
            time.sleep(nap)
            nap = min(2 * nap, POLL_MAX_S)
        reply = await_msg(max(limit_s, 5.0))
        if msg is None and reply.get("phase") == "armed":
            reply = await_msg(max(limit_s, 5.0))
        return reply, (ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2]), ev[2].elapsed_time(ev[3]))

    def release(self, w: int, wait_s: float = 120.0) -> None:
        """A window whose `done` never came: the judge writes it itself, on a stream of its own, until
        its window stream has moved past the wait (a runner that overwrites it is ended by the
        parent, at the latest at the timing stage's limit), for `wait_s` at most; else the stream
        is left stuck and its regions are never freed."""
        if self.flags is None:
            return
        side = _nonblocking_stream(self.device)
        end = time.monotonic() + wait_s
        addr = self.flags.tensor.data_ptr() + DONE_AT
        while time.monotonic() < end:
            self.ops.write(side, addr, w)
            side.synchronize()
            if self.events[3].query():
                return
            time.sleep(0.05)
        self.stuck = True

    def close(self) -> None:
        if self.pending is not None:
            w, self.pending = self.pending, None
            self.release(w)
        if self.flags is not None and not self.stuck:
            self.flags.close()
        self.flags = None
