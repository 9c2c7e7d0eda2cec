"""Where a memory-bound call's time goes by where its memory lies (GPU): the same elementwise
kernel (F.silu, 128 MB fp32 in and out) timed per call on the same buffer after an L2 flush (the
old per-call events), back to back on distinct buffers from the caching allocator, on sets in a
fresh region made with the driver's virtual memory API (as the judge's windows), and on a second
mapping of that region (as the runner maps it), first and second pass.

    python3 benchmarks/window_memory.py --sets 24 --mb 128
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.nn.functional as F

from kernelwright.engine.child import shared_region


def events(fn, repeats: int = 5) -> float:
    """Median ms of fn() by CUDA events."""
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def kernels(which: str):
    """(name, f(x) -> y): F.silu, and the cuda_swish example's fused kernel (built here)."""
    out = [("F.silu", F.silu)]
    if which == "all":
        import importlib.util

        spec = importlib.util.spec_from_file_location("cand", "examples/cuda_swish/candidate.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cols = 4096
        scale, bias = torch.randn(cols, device="cuda"), torch.randn(cols, device="cuda")
        out.append(("cuda_swish", lambda x: mod.fused.fused_swish_affine(x.view(-1, cols), scale, bias)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", type=int, default=24)
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--kernels", default="all")
    a = ap.parse_args()
    for name, fn in kernels(a.kernels):
        print(f"== {name}")
        measure(fn, a.sets, a.mb)


def measure(fn, n: int, mb: int) -> None:
    numel = (mb << 20) // 4
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    x0 = torch.randn(numel, device=dev)
    fn(x0)

    def single() -> None:
        fn(x0)

    def single_then_flush() -> None:
        fn(x0)
        flush.zero_()

    per, with_flush, flush_only = [], [], []
    for _ in range(20):
        flush.zero_()
        per.append(events(single, 1))
        flush.zero_()
        with_flush.append(events(single_then_flush, 1))
        flush.zero_()
        flush_only.append(events(flush.zero_, 1))
    print(
        f"one call after an L2 flush, same buffer: {statistics.median(per):.4f} ms; with the next flush in the "
        f"interval, less a flush alone: {statistics.median(with_flush) - statistics.median(flush_only):.4f} ms"
    )
    xs = [torch.randn(numel, device=dev) for _ in range(n)]
    keep: list[torch.Tensor] = []

    def distinct() -> None:
        keep.clear()
        for x in xs:
            keep.append(fn(x))

    print(f"back to back, {n} distinct caching-allocator inputs, outputs kept: {events(distinct) / n:.4f} ms a call")
    xs.clear()
    keep.clear()
    region = shared_region.create(n * numel * 4, dev)
    region.tensor.view(torch.float32).normal_()
    views = [region.tensor[i * numel * 4 : (i + 1) * numel * 4].view(torch.float32) for i in range(n)]

    def in_region() -> None:
        keep.clear()
        for v in views:
            keep.append(fn(v))

    print(f"back to back, {n} sets in the judge's region: {events(in_region) / n:.4f} ms a call")
    for k in range(3):
        fresh = shared_region.attach(os.dup(region.fd), n * numel * 4, dev)
        fviews = [fresh.tensor[i * numel * 4 : (i + 1) * numel * 4].view(torch.float32) for i in range(n)]

        def in_fresh(fviews: list[torch.Tensor] = fviews) -> None:
            keep.clear()
            for v in fviews:
                keep.append(fn(v))

        first = events(in_fresh, 1)
        again = events(in_fresh, 3)
        print(f"second mapping #{k}: first pass {first / n:.4f} ms a call, then {again / n:.4f}")
        fviews.clear()
        keep.clear()
        fresh.close()
    outs = shared_region.create(n * numel * 4, dev)
    oviews = [outs.tensor[i * numel * 4 : (i + 1) * numel * 4].view(torch.float32) for i in range(n)]

    def commit() -> None:
        for v, o in zip(views, oviews, strict=True):
            o.copy_(v)

    print(
        f"commit copies into a region: {events(commit) / n:.4f} ms a set; snapshot clone: "
        f"{events(lambda: outs.tensor.clone()) / n:.4f} ms a set"
    )
    views.clear()
    oviews.clear()
    keep.clear()
    region.close()
    outs.close()


if __name__ == "__main__":
    main()
