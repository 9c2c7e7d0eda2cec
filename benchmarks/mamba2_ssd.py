"""Mamba-2 SSD benchmark: the reference (eager, in a CUDA graph, torch.compile) against our fused kernel.

For each shape: median time (CUDA events, L2 flushed before every run), normwise error of each
against a float64 evaluation of the reference, and the minimal-bytes floor (inputs read once,
output written once, over the device-to-device copy bandwidth measured here).

    python3 benchmarks/mamba2_ssd.py [--no-compile] [--shapes default,l2048,l4096] [--out table.md]

With $OUT set (the device machine), the markdown table is also written to $OUT/mamba2_ssd.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mamba2_ssd"

SHAPES = {
    "default": dict(b=16, l=128, h=8, p=64, n=16, block=64, a="randn"),
    "l2048": dict(b=8, l=2048, h=32, p=64, n=128, block=64, a="-softplus(randn)"),
    "l4096": dict(b=4, l=4096, h=32, p=64, n=128, block=256, a="-softplus(randn)"),
}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Bench:
    """do_bench-style timing: CUDA events around each run, L2 flushed before each, median."""

    def __init__(self, budget_ms: float = 300.0):
        self.flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
        self.budget_ms = budget_ms

    def time(self, fn, min_reps: int = 5, max_reps: int = 200) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = (time.perf_counter() - t0) * 1e3
        reps = int(max(min_reps, min(max_reps, self.budget_ms / max(est, 1e-3))))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth(bench: Bench) -> float:
    """Bytes read plus bytes written per second, for a 1 GiB device-to-device copy."""
    src = torch.randn(256 * 1024 * 1024, device="cuda")
    dst = torch.empty_like(src)
    ms = bench.time(lambda: dst.copy_(src), max_reps=50)
    return 2 * src.numel() * 4 / (ms * 1e-3)


def in_cuda_graph(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()  # capture records work without running it: fill `out` once
    torch.cuda.synchronize()
    return graph, out


def normwise(out: torch.Tensor, ref64: torch.Tensor) -> float:
    return ((out.double() - ref64).norm() / ref64.norm()).item()


def run_shape(name, s, mods, bench, bw, do_compile, log):
    torch.manual_seed(0)
    rows = []
    for kind in ("y", "state"):
        prob, cand = mods[f"problem_{kind}"], mods[kind]
        args = (s["b"], s["l"], s["h"], s["p"], s["n"], s["block"])
        torch.manual_seed(0)
        ref = prob.Model(*args).cuda()
        if s["a"] != "randn":
            ref.A.data.copy_(-F.softplus(torch.randn_like(ref.A)))
        new = cand.ModelNew(*args).cuda()
        new.load_state_dict(ref.state_dict())
        X = torch.randn(s["b"], s["l"], s["h"], s["p"], device="cuda")
        with torch.no_grad():
            ref64 = copy.deepcopy(ref).double()(X.double())
            torch.cuda.synchronize()
            entries = []

            def add(label, fn, out=None):
                out = fn() if out is None else out
                torch.cuda.synchronize()
                err = normwise(out, ref64)
                ms = bench.time(fn)
                entries.append((label, ms, err))
                log(f"  {name:8s} {kind:5s} {label:28s} {ms * 1e3:10.1f} us   normwise err {err:.2e}")

            add("reference eager", lambda: ref(X))
            try:
                graph, gout = in_cuda_graph(lambda: ref(X))
                add("reference in CUDA graph", graph.replay, gout)
                del graph, gout
            except Exception as exc:  # report and go on
                log(f"  {name} {kind} CUDA graph failed: {type(exc).__name__}: {exc}")
            if do_compile:
                try:
                    t0 = time.perf_counter()
                    compiled = torch.compile(ref)
                    cout = compiled(X)
                    torch.cuda.synchronize()
                    log(f"  {name} {kind} torch.compile took {time.perf_counter() - t0:.1f} s")
                    add("torch.compile(reference)", lambda: compiled(X), cout)
                except Exception as exc:
                    log(f"  {name} {kind} torch.compile failed: {type(exc).__name__}: {str(exc)[:200]}")
            add("ours (fused CUDA)", lambda: new(X))
            ext = cand.ssd_ext
            variants = [("FP32 CUDA-core kernel", 1, 0)]
            if s["n"] in (64, 128):  # the tensor-core kernel's d_state
                variants += [("3xTF32 tensor cores, 2 blocks/SM", 2, 64), ("3xTF32 tensor cores, p_tile=32", 2, 32)]
                if s["n"] == 128 and kind == "y":
                    variants.append(("3xTF32 tensor cores, 1 block/SM", 3, 64))
            for label, path, pt in variants:
                add(f"ours, {label}",
                    lambda path=path, pt=pt: ext.ssd_fused_path(X, new.A, new.B, new.C, None, kind == "state", pt, path))
        out_elems = X.numel() if kind == "y" else s["b"] * s["h"] * s["p"] * s["n"]
        in_elems = X.numel() + ref.A.numel() + ref.B.numel() + (ref.C.numel() if kind == "y" else 0)
        floor_us = (in_elems + out_elems) * 4 / bw * 1e6
        rows.append((name, kind, s, entries, floor_us))
        del ref, new, X, ref64
        torch.cuda.empty_cache()
    return rows


def markdown(rows, device, bw) -> str:
    lines = [
        f"Device: {device}; torch {torch.__version__}; measured copy bandwidth {bw / 1e12:.2f} TB/s; "
        f"date {datetime.date.today().isoformat()}.",
        "",
        "| shape | output | variant | median time | normwise error vs float64 | floor (min bytes) |",
        "|---|---|---|---|---|---|",
    ]
    for name, kind, s, entries, floor_us in rows:
        shape = f"b{s['b']} l{s['l']} h{s['h']} p{s['p']} n{s['n']} block{s['block']}, A={s['a']}"
        for label, ms, err in entries:
            t = f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"
            lines.append(f"| {shape} | {kind} | {label} | {t} | {err:.1e} | {floor_us:.1f} us |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="default,l2048,l4096")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mamba2_ssd benchmark needs a CUDA GPU; run it on the device machine", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    t0 = time.perf_counter()
    mods = {
        "problem_y": load(EXAMPLE / "problem_y.py", "m2_problem_y"),
        "problem_state": load(EXAMPLE / "problem_state.py", "m2_problem_state"),
        "y": load(EXAMPLE / "candidate_y.py", "m2_candidate_y"),
        "state": load(EXAMPLE / "candidate_state.py", "m2_candidate_state"),
    }
    print(f"build/import {time.perf_counter() - t0:.1f} s", flush=True)
    bench = Bench()
    bw = copy_bandwidth(bench)
    device = torch.cuda.get_device_name()
    print(f"{device}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for name in a.shapes.split(","):
        rows += run_shape(name, SHAPES[name], mods, bench, bw, not a.no_compile, lambda m: print(m, flush=True))
    table = markdown(rows, device, bw)
    print(table)
    for path in filter(None, [a.out, os.path.join(os.environ["OUT"], "mamba2_ssd.md") if os.environ.get("OUT") else None]):
        Path(path).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
