"""The runner's side of a wall-clock window (`serve_window`): it runs the candidate, so it decides
nothing. It maps the inputs' region, calls once per set, says `computed`, commits each output into
its slot of the output ring (`commit`, which the judge times on its own memory too) and answers.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from kernelwright.engine.child import shared_region
from kernelwright.engine.child.compare import flatten
from kernelwright.engine.child.timing.layouts import Layout, WindowError
from kernelwright.engine.child.timing.window_io import _no_gc, _protocol_threads, _sync, _sync_quietly
from kernelwright.engine.child.wire import _DTYPES


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
