"""What both sides of a window wait with: the device's work (`sync`), a socket's readiness
(`wait_readable`, polled on a GPU), the cyclic collector held off and, on the CPU, the window's own
copies on one thread. `WindowTimeout`: the runner did not finish a window in time.
"""

from __future__ import annotations

import contextlib
import gc
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from kernelwright.engine.child.timing.layouts import WindowError


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


def _sync_quietly(device: torch.device) -> None:
    try:
        _sync(device)
    except Exception:
        pass


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
