"""The probe: a trusted stand-in for the runner that tells the judge what a window costs besides the calls.

A timing window's wall time, on the judge's clock, holds more than the candidate's calls: the
runner maps the inputs' region, the messages cross between the two processes, each side wakes,
the runner commits its outputs to the ring and the judge snapshots them. The judge cannot take
the runner's word for any of that (the runner is the candidate's process), and its own
measures of the same steps, taken in its own process, miss what only a second process pays:
about 1 ms a window on an H100, 15-25% of a memory-bound window (docs/PERFORMANCE.md).

The probe is a second process that runs no candidate code: the judge starts it with the GPU
judge and opens windows on it exactly as it does on the runner (the same sizes, the same
`runner_window.serve_window`), with a model that only allocates outputs of the window's layout. Its
account of the time its calls took on the device is trusted (nothing of the candidate's runs
there), so `wall - calls` of a probe window is what a window costs besides the calls, measured
on the same path as the runner's. The judge takes the smallest of these per window size off the
candidate's windows (a process that slows the probe's windows can only make them larger).
On the CPU there is no probe: a second process would take a core from the calls being timed;
the judge's own measures stand there (`window_plan.Measures`).

Imports only torch, the standard library and the child's own modules.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import torch

from kernelwright.engine.child import shared_region
from kernelwright.engine.child.timing import device_clock, runner_window, window_io
from kernelwright.engine.child.timing.layouts import Layout

READY = b"probe-ready"


class Probe:
    """The judge's handle on its probe process: the socket its windows go on."""

    def __init__(self, device: torch.device):
        self.device = device
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        name = str(device)
        if device.type == "cuda" and device.index is None:
            name = f"cuda:{torch.cuda.current_device()}"
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-u", "-m", "kernelwright.engine.child.timing.probe", str(theirs.fileno()), name],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            self.proc = None
        theirs.close()
        self.ready = False
        self.failed = "" if self.proc is not None else "the probe process could not be started"

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the process said it is ready (its CUDA context made); False, with `failed` set,
        when it died or said nothing in `timeout_s`."""

        if self.ready or self.failed:
            return self.ready
        if not window_io.wait_readable([self.sock], timeout_s):
            self.fail(f"the probe process was not ready within {timeout_s:g} s")
            return False
        try:
            data = self.sock.recv(64)
        except OSError as exc:
            data = b""
            self.failed = f"the probe's socket failed ({exc})"
        if data != READY:
            self.fail(self.failed or "the probe process ended before it was ready")
            return False
        self.ready = True
        return True

    def fail(self, why: str) -> None:
        self.failed = self.failed or why
        self.ready = False
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


_PROBES: dict[str, Probe] = {}


def start(device: torch.device) -> Probe | None:
    """The probe of this process for `device`, started now if it is not yet (a GPU only)."""
    if device.type != "cuda":
        return None
    key = str(device)
    p = _PROBES.get(key)
    if p is None or p.failed:
        p = _PROBES[key] = Probe(device)
    return p


def drop(device: torch.device, why: str) -> None:
    """The probe of `device` failed: ended, and a new one is started at the next `start`."""
    p = _PROBES.get(str(device))
    if p is not None:
        p.fail(why)


def fixed_ms(wall_ms: float, probe_says: dict[str, Any]) -> float | None:
    """What the part of a probe window up to `computed` cost besides its calls (the opening: the
    hand-over, the mapping, the waits): the judge's time of it less the probe's own device time
    of its calls (trusted: no candidate code runs in the probe). None where the probe's account
    is not a time inside it. (The commit and the snapshot after `computed` the judge measures
    in its own process: `window_timer.WindowTimer.copy_ms`.)"""
    dev = probe_says.get("device", probe_says.get("calls"))  # (a CPU probe, in tests: the calls' wall)
    if not isinstance(dev, (int, float)) or dev < 0 or dev > wall_ms:
        return None
    return wall_ms - float(dev)


def _stub(header: dict[str, Any], device: torch.device) -> Any:
    """A model that only fills outputs of the window's layout (one fill kernel a leaf, a call)."""

    lout = Layout.from_json(header["outputs"], 1 << 40)  # dtypes checked there
    leaves = [(getattr(torch, leaf[2]), tuple(leaf[3])) for leaf in lout.leaves if leaf[0] == "tensor"]

    outs = [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in leaves]

    def model(*_args: Any) -> Any:
        for o in outs:  # one buffer for every call: the commit copies the same bytes as the runner's
            o.zero_()
        return outs[0] if len(outs) == 1 else list(outs)

    return model


def main(argv: list[str] | None = None) -> int:
    """`probe.py FD DEVICE`: serve the judge's windows on the socket FD until it closes."""
    argv = sys.argv[1:] if argv is None else argv
    fd, dev = int(argv[0]), torch.device(argv[1])
    sock = socket.socket(fileno=fd)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.ones(1, device=dev).add_(1).item()  # the context, before the judge needs it
    sock.send(READY)
    rings = runner_window.Rings()
    lent = device_clock.Lent()  # the device clock's flags (its empty windows)
    stubs: dict[str, Any] = {}  # by output layout: its buffers made once, not inside every window
    spin = window_io.SPIN_S  # polled between the wall clock's windows; the device clock's need no wake-up
    while True:
        window_io.wait_readable([sock], None, spin)
        try:
            data, fds = shared_region.recv(sock)
        except OSError:
            break
        if not data:
            break
        header: Any = None
        try:
            header = json.loads(data.decode())
            if isinstance(header, dict) and header.get("release"):  # the timing stage is over
                rings.close()
                lent.close()
                continue
            spin = window_io.SPIN_S if not (isinstance(header, dict) and header.get("clock") == "device") else 0.0
            if isinstance(header, dict) and header.get("clock") == "device":
                try:
                    device_clock.serve(sock, header, fds, None, dev, 1 << 40, lent)  # closes the descriptors
                except Exception:
                    pass  # said in the window's reply
                continue
            key = json.dumps(header.get("outputs"))
            model = stubs.get(key) or stubs.setdefault(key, _stub(header, dev))
            if len(stubs) > 4:
                stubs = {key: model}
        except Exception as exc:  # the judge's own header: an engine bug, said in the reply
            for f in fds:
                os.close(f)
            wid = header.get("id") if isinstance(header, dict) else None
            shared_region.send(sock, json.dumps({"done": wid, "error": f"probe: {exc}"[:300]}).encode(), [])
            continue
        try:
            runner_window.serve_window(sock, header, fds, model, dev, 1 << 40, rings)  # closes the descriptors
        except Exception:
            pass  # said in the window's reply
    rings.close()
    lent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
