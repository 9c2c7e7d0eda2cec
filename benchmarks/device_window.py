"""A window timed on the device's own clock across two processes: can the judge's CUDA events span
another process's kernels, ordered by stream memory operations on memory both have mapped?

The judge (this process) and a runner (a child it starts) share three regions made with the driver's
virtual memory API (`shared_region`): the inputs (mapped by both once), the output ring, and a page
of flags. Per window, on the judge's stream: an event, its copy of fresh inputs into the region, a
write of the window's number to the `in` flag, a wait for the `out` flag to reach it, an event, the
snapshot of the ring, an event. On the runner's stream, enqueued before the window: a wait for the
`in` flag, the calls, the commit into the ring, a write of the `out` flag. The span between the
judge's first and last events holds all of it on the device's timeline; the runner's own events
around its calls say what the calls alone took (evidence here, the thing to compare with).

    python3 benchmarks/device_window.py [--sets 48] [--windows 8] [--kernel-copy]

Prints one JSON line per window. Needs one CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from kernelwright.engine.child import shared_region  # noqa: E402

_GEQ = 0x0


def _memops() -> tuple[object, object]:
    lib = ctypes.CDLL("libcuda.so.1")
    wait = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
    write = getattr(lib, "cuStreamWriteValue32_v2", None) or lib.cuStreamWriteValue32
    for fn in (wait, write):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return wait, write


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed ({rc})")


def runner(fd_sock: int) -> None:
    dev = torch.device("cuda")
    torch.cuda.init()
    sock = socket.socket(fileno=fd_sock)
    data, fds = shared_region.recv(sock)
    hdr = json.loads(data)
    n, numel = hdr["sets"], hdr["numel"]
    rin = shared_region.attach(fds[0], hdr["in_bytes"], dev)
    rout = shared_region.attach(fds[1], hdr["out_bytes"], dev)
    rflag = shared_region.attach(fds[2], 4096, dev)
    wait, write = _memops()
    ins = rin.tensor[: n * numel * 4].view(torch.float32).view(n, numel)
    ring = rout.tensor[: n * numel * 4].view(torch.float32).view(n, numel)
    flag_in, flag_out = rflag.tensor.data_ptr(), rflag.tensor.data_ptr() + 256
    s = torch.cuda.current_stream().cuda_stream
    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    while True:
        data, _ = shared_region.recv(sock)
        msg = json.loads(data)
        if msg.get("stop"):
            return
        w = msg["window"]
        _check(wait(s, flag_in, w, _GEQ), "wait")
        e0.record()
        outs = [torch.nn.functional.silu(ins[i]) for i in range(n)]
        e1.record()
        if msg.get("split"):
            _check(write(s, flag_out + 256, w, 0), "write")
        for i, o in enumerate(outs):
            ring[i].copy_(o)
        e2.record()
        _check(write(s, flag_out, w, 0), "write")
        del outs
        torch.cuda.synchronize()
        sock.send(json.dumps({"window": w, "calls_ms": e0.elapsed_time(e1), "commit_ms": e1.elapsed_time(e2)}).encode())


def judge(args: argparse.Namespace) -> None:
    dev = torch.device("cuda")
    n, numel = args.sets, args.rows * args.cols
    set_bytes = numel * 4
    a, b = socket.socketpair()
    ns = ["unshare", "--pid", "--fork"] if args.unshare else []
    child = subprocess.Popen(
        [*ns, sys.executable, __file__, "--runner", str(b.fileno())],
        pass_fds=[b.fileno()],
        env=os.environ.copy(),
    )
    b.close()
    rin = shared_region.create(n * set_bytes, dev)
    rout = shared_region.create(n * set_bytes, dev)
    rflag = shared_region.create(4096, dev)
    rflag.tensor.zero_()
    torch.cuda.synchronize()
    hdr = {"sets": n, "numel": numel, "in_bytes": rin.nbytes, "out_bytes": rout.nbytes}
    shared_region.send(a, json.dumps(hdr).encode(), [rin.fd, rout.fd, rflag.fd])
    wait, write = _memops()
    ins = rin.tensor[: n * set_bytes].view(torch.float32).view(n, numel)
    ring = rout.tensor[: n * set_bytes].view(torch.float32).view(n, numel)
    flag_in, flag_out = rflag.tensor.data_ptr(), rflag.tensor.data_ptr() + 256
    snap = torch.empty_like(ring)
    s = torch.cuda.current_stream().cuda_stream
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
    # the same calls in this process, back to back, for comparison
    pool = torch.randn(n, numel, device=dev)
    outs: list[torch.Tensor] = []
    for _ in range(3):  # (the last, once the allocator holds a block for every output)
        outs = []
        torch.cuda.synchronize()
        ev[0].record()
        outs = [torch.nn.functional.silu(pool[i]) for i in range(n)]
        ev[1].record()
        torch.cuda.synchronize()
    alone = ev[0].elapsed_time(ev[1]) / n
    del outs
    # the judge's copies alone
    ev[0].record()
    (torch.add(pool, 0, out=ins) if args.kernel_copy else ins.copy_(pool))
    ev[1].record()
    (torch.add(ring, 0, out=snap) if args.kernel_copy else snap.copy_(ring))
    ev[2].record()
    torch.cuda.synchronize()
    copy_alone, snap_alone = ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])
    print(json.dumps({"alone_ms_per_call": alone, "copy_in_ms": copy_alone, "snapshot_ms": snap_alone}))
    for w in range(1, args.windows + 1):
        pool.normal_()
        ring.zero_()
        torch.cuda.synchronize()
        shared_region.send(a, json.dumps({"window": w, "split": args.split}).encode(), [])
        time.sleep(args.lead_s)  # the runner enqueues its side before the clock
        t0 = time.perf_counter()
        ev[0].record()
        (torch.add(pool, 0, out=ins) if args.kernel_copy else ins.copy_(pool))
        ev[1].record()
        _check(write(s, flag_in, w, 0), "write")
        if args.split:
            _check(wait(s, flag_out + 256, w, _GEQ), "wait")
        ev[4].record()
        _check(wait(s, flag_out, w, _GEQ), "wait")
        ev[2].record()
        (torch.add(ring, 0, out=snap) if args.kernel_copy else snap.copy_(ring))
        ev[3].record()
        while not ev[3].query():
            pass
        host_ms = (time.perf_counter() - t0) * 1e3
        rep = json.loads(a.recv(4096))
        ok = bool(torch.allclose(snap, torch.nn.functional.silu(pool)))
        span = ev[0].elapsed_time(ev[3])
        middle = ev[1].elapsed_time(ev[2])
        print(
            json.dumps(
                {
                    "window": w,
                    "span_ms": round(span, 4),
                    "copy_in_ms": round(ev[0].elapsed_time(ev[1]), 4),
                    "middle_ms": round(middle, 4),
                    "snapshot_ms": round(ev[2].elapsed_time(ev[3]), 4),
                    "runner_calls_ms": round(rep["calls_ms"], 4),
                    "runner_commit_ms": round(rep["commit_ms"], 4),
                    "middle_over_runner_ms": round(middle - rep["calls_ms"] - rep["commit_ms"], 4),
                    "to_computed_over_calls_ms": round(ev[1].elapsed_time(ev[4]) - rep["calls_ms"], 4),
                    "computed_to_done_over_commit_ms": round(ev[4].elapsed_time(ev[2]) - rep["commit_ms"], 4),
                    "alone_ms_per_call": round(alone, 5),
                    "host_ms": round(host_ms, 3),
                    "outputs_right": ok,
                }
            ),
            flush=True,
        )
    a.send(b'{"stop": 1}')
    child.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runner", type=int, default=None)
    p.add_argument("--sets", type=int, default=48)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--lead-s", type=float, default=0.05)
    p.add_argument("--kernel-copy", action="store_true")
    p.add_argument("--split", action="store_true", help="a `computed` flag between the calls and the commit")
    p.add_argument("--unshare", action="store_true", help="the runner in a PID namespace of its own")
    args = p.parse_args()
    if args.runner is not None:
        runner(args.runner)
    else:
        judge(args)


if __name__ == "__main__":
    main()
