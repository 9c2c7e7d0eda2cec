"""Where a device-clock window's hand-over time goes, on the device's global timer.

Two trusted processes play the judge and the runner of `engine/child/timing/device_clock.py` with the same
machinery (a flags region in device memory, the driver's stream wait and write of a value), and
both stamp the device's `%globaltimer` (one clock for every context) with a one-thread kernel:

    judge's stream:  stamp J0, write `in`, wait for `done`, stamp J1
    runner's stream: wait for `in`, stamp R0, its calls, stamp R1, write `done`

start = R0 - J0 (the hand-over in), work = R1 - R0, end = J1 - R1 (the hand-over out). Nothing
here is the product's code path: it measures the mechanism the judge's windows stand on.
`--copies` times the judge's copy in against the calibrations that could stand for it instead.
(benchmarks/device_window.py times whole windows, copies included, against the runner's events.)

    python3 benchmarks/handoff_anatomy.py [--windows 8] [--json FILE] [--copies]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from kernelwright.engine.child import shared_region
from kernelwright.engine.child.timing import device_clock

PTX = r"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry stamp(.param .u64 p, .param .u32 i)
{
  .reg .b64 %rd<5>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [i];
  mov.u64 %rd2, %globaltimer;
  mul.wide.u32 %rd3, %r1, 8;
  add.s64 %rd4, %rd1, %rd3;
  st.global.u64 [%rd4], %rd2;
  ret;
}
"""


class Stamper:
    """A kernel of one thread that writes the device's global timer (ns) into slot i of `buf`."""

    def __init__(self, device: torch.device, slots: int = 64) -> None:
        torch.zeros(1, device=device)  # the primary context, current
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        self.mod, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        src = ctypes.create_string_buffer(PTX.encode())
        assert lib.cuModuleLoadData(ctypes.byref(self.mod), src) == 0, "cuModuleLoadData"
        assert lib.cuModuleGetFunction(ctypes.byref(self.fn), self.mod, b"stamp") == 0, "cuModuleGetFunction"
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.buf = torch.zeros(slots, dtype=torch.int64, device=device)

    def __call__(self, i: int, stream: torch.cuda.Stream | None = None) -> None:
        s = stream or torch.cuda.current_stream()
        p = ctypes.c_uint64(self.buf.data_ptr())
        idx = ctypes.c_uint32(i)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(idx))
        rc = self.lib.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, s.cuda_stream, params, None)
        assert rc == 0, f"cuLaunchKernel {rc}"

    def read(self) -> list[int]:
        torch.cuda.synchronize()
        return [int(v) for v in self.buf.tolist()]


def workload(name: str, device: torch.device, shared: torch.Tensor | None) -> Any:
    x = torch.randn(1024, 1024, device=device)
    if name == "none":
        return lambda i: None
    if name == "swish":
        return lambda i: x * torch.sigmoid(x)
    if name == "swish_shared":  # inputs read from the region the judge lent (as the runner's are)
        assert shared is not None
        per = 1024 * 1024
        return lambda i: (lambda v: v * torch.sigmoid(v))(shared[(i % 256) * per : (i % 256 + 1) * per])
    if name == "swish_commit":  # and its output copied into the lent region (as the runner's commit is)
        assert shared is not None
        per = 1024 * 1024
        return lambda i: shared[(i % 128 + 128) * per : (i % 128 + 129) * per].copy_(
            (lambda v: v * torch.sigmoid(v))(shared[(i % 128) * per : (i % 128 + 1) * per])
        )
    if name == "sleep":
        return lambda i: torch.cuda._sleep(20000)  # ~10 us at 2 GHz
    if name == "big":
        y = torch.randn(8192, 8192, device=device)
        return lambda i: y * torch.sigmoid(y)
    raise SystemExit(f"unknown workload {name}")


# ---- the runner -----------------------------------------------------------------------------------


def runner(fd: int) -> None:
    device = torch.device("cuda")
    sock = socket.socket(fileno=fd)
    st = Stamper(device)
    ops = device_clock.memops()
    data, fds = shared_region.recv(sock)
    hdr = json.loads(data)
    flags = shared_region.attach(fds[0], device_clock.FLAG_BYTES, device)
    inputs = shared_region.attach(fds[1], hdr["in_bytes"], device)
    shared = inputs.tensor.view(torch.float32)
    stream = torch.cuda.current_stream()
    fns: dict[str, Any] = {}
    while True:
        data, _ = shared_region.recv(sock)
        msg = json.loads(data)
        if msg.get("stop"):
            break
        w, n, kind = msg["w"], msg["n"], msg["work"]
        if kind not in fns:
            fns[kind] = workload(kind, device, shared)
            for i in range(3):
                fns[kind](i)
            torch.cuda.synchronize()
        f = fns[kind]
        ops.wait(stream, flags.tensor.data_ptr() + device_clock.IN_AT, w)
        st(0)
        with torch.no_grad():
            for i in range(n):
                f(i)
        st(1)
        ops.write(stream, flags.tensor.data_ptr() + device_clock.DONE_AT, w)
        shared_region.send(sock, b'{"armed": 1}', [])
        if msg.get("host") == "sleep":
            while not torch.cuda.current_stream().query():
                time.sleep(1e-4)
        torch.cuda.synchronize()
        r0, r1 = st.read()[:2]
        shared_region.send(sock, json.dumps({"r0": r0, "r1": r1}).encode(), [])


# ---- the judge ------------------------------------------------------------------------------------


def judge(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device("cuda")
    st = Stamper(device)
    ops = device_clock.memops()
    flags = shared_region.create(device_clock.FLAG_BYTES, device)
    flags.tensor.zero_()
    in_bytes = 256 * 1024 * 1024 * 4
    inputs = shared_region.create(in_bytes, device)
    inputs.tensor.view(torch.float32).normal_()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--runner", str(b.fileno())], pass_fds=[b.fileno()], env=dict(os.environ)
    )
    b.close()
    shared_region.send(a, json.dumps({"in_bytes": in_bytes}).encode(), [flags.fd, inputs.fd])
    stream = torch.cuda.current_stream()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    rows: list[dict[str, Any]] = []
    w = 0
    cases = [
        ("none", 0, "spin"),
        ("swish", 32, "spin"),
        ("swish", 64, "spin"),
        ("swish", 128, "spin"),
        ("swish", 256, "spin"),
        ("swish_shared", 256, "spin"),
        ("swish_commit", 256, "spin"),
        ("swish", 256, "sleep"),
        ("sleep", 256, "spin"),
        ("big", 8, "spin"),
        ("big", 32, "spin"),
    ]
    for work, n, host in cases:
        got: dict[str, list[float]] = {"start": [], "work": [], "end": [], "span": []}
        for k in range(args.windows + 1):
            w += 1
            shared_region.send(a, json.dumps({"w": w, "n": n, "work": work, "host": host}).encode(), [])
            assert json.loads(shared_region.recv(a)[0]).get("armed")
            ev[0].record()
            st(0)
            ops.write(stream, flags.tensor.data_ptr() + device_clock.IN_AT, w)
            ops.wait(stream, flags.tensor.data_ptr() + device_clock.DONE_AT, w)
            st(1)
            ev[1].record()
            while not ev[1].query():
                time.sleep(1e-4)
            j0, j1 = st.read()[:2]
            r = json.loads(shared_region.recv(a)[0])
            if k == 0:
                continue  # (the first window of a case: its allocations)
            got["start"].append((r["r0"] - j0) / 1e6)
            got["work"].append((r["r1"] - r["r0"]) / 1e6)
            got["end"].append((j1 - r["r1"]) / 1e6)
            got["span"].append(ev[0].elapsed_time(ev[1]))
        row = {"mode": "two processes", "work": work, "calls": n, "runner_host": host}
        row.update({k: round(statistics.median(v), 4) for k, v in got.items()})
        row["end_spread"] = [round(min(got["end"]), 4), round(max(got["end"]), 4)]
        rows.append(row)
        print(json.dumps(row), flush=True)
    shared_region.send(a, b'{"stop": 1}', [])
    proc.wait(timeout=30)
    return rows


def copies(reps: int = 5) -> list[dict[str, Any]]:
    """The judge's copy in (its pool into the inputs' region) against the calibrations that could
    stand for it, each timed as the judge times it: queued behind a device-side sleep, by events."""
    rows: list[dict[str, Any]] = []
    for nbytes in (1 << 30, 6710886400):
        rows += _copies_at(nbytes, reps)
        torch.cuda.empty_cache()
    return rows


def _copies_at(nbytes: int, reps: int) -> list[dict[str, Any]]:
    device = torch.device("cuda")
    region = shared_region.create(nbytes, device)
    r = region.tensor[:nbytes]
    r.zero_()
    pool = torch.ones(nbytes, dtype=torch.uint8, device=device)
    h = nbytes // 2

    def halves() -> None:
        device_clock.byte_copy(r[h : 2 * h], r[:h])
        device_clock.byte_copy(r[:h], r[h : 2 * h])

    flavors = {
        "window": lambda: device_clock.byte_copy(r, pool),  # the pool into the region
        "in_place": lambda: device_clock.byte_copy(r, r),  # main's calibration
        "halves": halves,
        "pool_in_place": lambda: device_clock.byte_copy(pool, pool),
    }
    rows = []
    for name, fn in flavors.items():
        got = [device_clock.queued_ahead(device, fn, 0.1)[1] for _ in range(reps)]
        med, low = round(statistics.median(got), 4), round(min(got), 4)
        row = {"bytes": nbytes, "copy": name, "median_ms": med, "min_ms": low}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for k in range(reps):  # interleaved, as a stage runs them
        row = {"bytes": nbytes, "interleaved": k}
        for name in ("in_place", "halves", "window"):
            row[name] = round(device_clock.queued_ahead(device, flavors[name], 0.1)[1], 4)
        print(json.dumps(row), flush=True)
    region.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", type=int)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--copies", action="store_true", help="only the copy in against its calibrations")
    args = ap.parse_args()
    if args.runner is not None:
        runner(args.runner)
        return
    print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), flush=True)
    rows = copies() if args.copies else judge(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
