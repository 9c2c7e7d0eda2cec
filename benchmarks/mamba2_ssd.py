"""Mamba-2 SSD benchmark: our fused kernel against mamba_ssm's Triton `mamba_chunk_scan_combined`,
side by side in the same run, in float32 and bfloat16.

For each shape (b, l, h, p, n, chunk) and dtype: median time (CUDA events, 256 MB L2 flush before
every run), normwise error ||out - ref64|| / ||ref64|| of each against a float64 evaluation of the
reference (`problem_y.ssd_chunked`) on exactly the inputs that method received, and the copy floor
(inputs read once, output written once, over the device-to-device copy bandwidth measured here).

Inputs (as in issue 18): X = randn; A = -softplus(randn)/2 - 0.01; B, C = randn / sqrt(n).
Shapes named *slow (l4096slow, l8192slow, l16384slow) use A = -softplus(randn)/64 - 0.001 instead:
decay slow enough that our local pass cannot skip any step (its worst case).
mamba_ssm is fed the same recurrence: its dt = -A (per step and head), its per-head A = -1, and
x = X / dt (it multiplies x by dt); in bfloat16 x, B, C are rounded to bf16 and dt stays float32,
our A stays float32 too. Each method's error is measured against the float64 oracle of its own
(rounded) inputs.

    python3 benchmarks/mamba2_ssd.py [--shapes kb,l2048,...] [--dtypes fp32,bf16] [--no-mamba]
                                     [--sweep] [--paths 2,5] [--out table.md]

--verdict also judges each output (ours and mamba_ssm's) with the engine's calibrated verdict
(kernelwright.engine.child.numerics.judge, defaults atol = rtol = 1e-3, factor 8), the reference
being the problem's float32 math on that method's own inputs, rounded once to the output dtype
(examples/mamba2_ssd/problem_y_bf16.py's definition), the oracle its float64 evaluation:
    python3 benchmarks/mamba2_ssd.py --shapes kb,l2048,l4096 --dtypes bf16 --verdict

--paths times our tensor-core kernels forced one by one (auto segment count), side by side, e.g.
path 2 (every product in 3xTF32) against path 5 (the state products in 3xBF16):
    python3 benchmarks/mamba2_ssd.py --shapes l2048 --dtypes fp32,bf16 --no-mamba --paths 2,5

mamba_ssm is optional (`pip install -e .[mamba]`, or its pure-Python wheel on PYTHONPATH: its
Triton kernels need no CUDA extension). Its package __init__ imports CUDA extensions
(selective_scan) that a pure-Python build lacks, so the benchmark imports the submodule
`mamba_ssm.ops.triton.ssd_combined` under an empty package stub (no code of it is copied).
With $OUT set (the device machine), the markdown table is also written to $OUT/mamba2_ssd.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mamba2_ssd"
sys.path.insert(0, str(ROOT / "src"))

from kernelwright.engine.child import numerics  # noqa: E402  (the engine's calibrated verdict, for --verdict)

# name: (b, l, h, p, n, chunk)
SHAPES = {
    "kb": (16, 128, 8, 64, 16, 64),  # KernelBench default
    "l2048": (8, 2048, 32, 64, 128, 64),
    "l2048n64": (8, 2048, 32, 64, 64, 128),
    "l4096": (4, 4096, 32, 64, 128, 256),
    "l8192": (2, 8192, 32, 64, 128, 256),
    "l16384": (1, 16384, 32, 64, 128, 256),
}
# the same shapes with slowly decaying A (about -0.014 a step): our local pass then walks whole
# segments (no step's weight underflows), the worst case for the segmented kernel
SLOW = {f"{k}slow": v for k, v in SHAPES.items() if k in ("l4096", "l8192", "l16384")}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def import_mamba_chunk_scan():
    """mamba_ssm's `mamba_chunk_scan_combined`, without running the package __init__ (which
    imports CUDA extensions a pure-Python build lacks). Returns (fn, version) or (None, reason)."""
    try:
        spec = importlib.util.find_spec("mamba_ssm")
    except Exception as exc:  # a broken install
        return None, f"{type(exc).__name__}: {exc}"
    if spec is None or not spec.submodule_search_locations:
        return None, "mamba_ssm not installed"
    if "mamba_ssm" not in sys.modules:
        stub = types.ModuleType("mamba_ssm")
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = stub
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    version = "?"
    try:
        from importlib.metadata import version as _v

        version = _v("mamba_ssm")
    except Exception:
        pass
    return mamba_chunk_scan_combined, version


class Bench:
    """do_bench-style timing: CUDA events around each run, L2 flushed before each, median."""

    def __init__(self, budget_ms: float = 250.0):
        self.flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
        self.budget_ms = budget_ms

    def time(self, fn, min_reps: int = 5, max_reps: int = 100) -> float:
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
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def copy_bandwidth(bench: Bench) -> float:
    """Bytes read plus bytes written per second, for a 1 GiB device-to-device copy."""
    src = torch.randn(256 * 1024 * 1024, device="cuda")
    dst = torch.empty_like(src)
    ms = bench.time(lambda: dst.copy_(src), max_reps=50)
    return 2 * 256 * 1024 * 1024 * 4 / (ms * 1e-3)


def normwise(out: torch.Tensor, ref64: torch.Tensor) -> float:
    return ((out.double() - ref64).norm() / ref64.norm()).item()


def oracle(prob, X, A, B, C, chunk):
    """float64 evaluation of the reference on exactly these inputs."""
    with torch.no_grad():
        Y, _ = prob.ssd_chunked(X.double(), A.double(), B.double(), C.double(), chunk)
    return Y


def judged(prob, out, X, A, B, C, chunk, ref64):
    """The engine's calibrated verdict on `out`: (passed, the output's LeafNumerics)."""
    with torch.no_grad():
        ref, _ = prob.ssd_chunked(X.float(), A.float(), B.float(), C.float(), chunk)
    rep = numerics.judge(out, ref.to(out.dtype), ref64, 1e-3, 1e-3, 8.0)
    return rep.passed, rep.leaves[0]


def verdict_text(passed, leaf):
    c, r = leaf.candidate, leaf.reference
    ratio = lambda a, b: f"{a / b:.2f}x" if b > 0 else "n/a"  # noqa: E731
    return (
        f"{'passed' if passed else 'FAILED'}: normwise {c.norm_rel:.2e} ({ratio(c.norm_rel, r.norm_rel)} the "
        f"reference's), max abs {ratio(c.max_abs, r.max_abs)}, {100 * leaf.excess_share:.3f}% of elements in "
        f"excess ({100 * leaf.excess_allowed:.3g}% allowed), rtol {leaf.rtol:.3g}"
    )


def make_inputs(shape, seed=0, slow=False):
    b, l, h, p, n, _ = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(b, l, h, p, device="cuda", generator=g)
    A = -F.softplus(torch.randn(b, l, h, device="cuda", generator=g)) / (64 if slow else 2) - (0.001 if slow else 0.01)
    B = torch.randn(b, l, h, n, device="cuda", generator=g) / math.sqrt(n)
    C = torch.randn(b, l, h, n, device="cuda", generator=g) / math.sqrt(n)
    return X, A, B, C


def floor_us(shape, dtype, bw):
    b, l, h, p, n, _ = shape
    es = torch.tensor([], dtype=dtype).element_size()
    nbytes = es * (2 * b * l * h * p + 2 * b * l * h * n) + 4 * b * l * h  # X, Y, B, C; A in fp32
    return nbytes / bw * 1e6


def run_shape(name, shape, dtype_name, prob, cand, mamba, bench, bw, sweep, paths, log, verdict=False):
    ext = cand.ssd_ext
    b, l, h, p, n, chunk = shape
    dtype = DTYPES[dtype_name]
    X, A, B, C = make_inputs(shape, slow=name.endswith("slow"))
    Xd, Bd, Cd = X.to(dtype), B.to(dtype), C.to(dtype)
    ref_ours = oracle(prob, Xd, A, Bd, Cd, chunk)
    row = dict(
        name=name, shape=shape, dtype=dtype_name, floor=floor_us(shape, dtype, bw), ours={}, mamba=None, verdict={}
    )

    def ours(label, fn):
        out = fn()
        torch.cuda.synchronize()
        err = normwise(out, ref_ours)
        if verdict and label == "auto":
            row["verdict"]["ours"] = judged(prob, out, Xd, A, Bd, Cd, chunk, ref_ours)
            log(f"  {name:9s} {dtype_name} ours verdict {verdict_text(*row['verdict']['ours'])}")
        del out
        ms = bench.time(fn)
        row["ours"][label] = (ms, err)
        log(f"  {name:9s} {dtype_name} ours {label:28s} {ms * 1e3:9.1f} us  err {err:.2e}")

    # through ModelNew.forward, as `kernelwright eval` calls it (its parameters set to these inputs)
    model = cand.ModelNew.__new__(cand.ModelNew)
    torch.nn.Module.__init__(model)
    model.block_len = chunk
    model.A, model.B, model.C = (torch.nn.Parameter(t, requires_grad=False) for t in (A, Bd, Cd))
    with torch.no_grad():
        ours("auto", lambda: model(Xd))
    for path in paths if n in (64, 128) else ():
        ours(f"path{path}", lambda path=path: ext.ssd_fused_cfg(Xd, A, Bd, Cd, None, False, 0, path, 0))
    if sweep and n in (64, 128):
        for path, nseg in [(2, 1), (2, 2), (2, 4), (2, 8), (2, 16)]:
            ours(
                f"path{path} nseg{nseg}",
                lambda path=path, nseg=nseg: ext.ssd_fused_cfg(Xd, A, Bd, Cd, None, False, 0, path, nseg),
            )
    ref_ours = None  # the float64 oracle's memory goes back before mamba_ssm's run
    if mamba is not None:
        dt = -A  # > 0
        x = (X / dt.unsqueeze(-1)).to(dtype)
        A_h = -torch.ones(h, device="cuda", dtype=torch.float32)
        Bm, Cm = Bd.contiguous(), Cd.contiguous()
        ref_m = oracle(prob, x.double() * dt.double().unsqueeze(-1), A, Bm, Cm, chunk)
        try:

            def fn():
                return mamba(x, dt, A_h, Bm, Cm, chunk)

            out = fn()
            torch.cuda.synchronize()
            err = normwise(out, ref_m)
            if verdict:
                row["verdict"]["mamba_ssm"] = judged(prob, out, x.float() * dt.unsqueeze(-1), A, Bm, Cm, chunk, ref_m)
                log(f"  {name:9s} {dtype_name} mamba_ssm verdict {verdict_text(*row['verdict']['mamba_ssm'])}")
            del out
            ms = bench.time(fn)
            row["mamba"] = (ms, err)
            log(f"  {name:9s} {dtype_name} mamba_ssm {'':23s} {ms * 1e3:9.1f} us  err {err:.2e}")
        except Exception as exc:
            log(f"  {name} {dtype_name} mamba_ssm failed: {type(exc).__name__}: {str(exc)[:300]}")
        del ref_m, x
    torch.cuda.empty_cache()
    return row


def fmt_us(ms):
    return f"{ms * 1e3:.1f} us"


def shape_cell(row):
    return ", ".join(map(str, row["shape"])) + (" (slow A)" if row["name"].endswith("slow") else "")


def markdown(rows, device, bw, mamba_version) -> str:
    lines = [
        f"Device: {device}; torch {torch.__version__}; mamba_ssm {mamba_version}; measured copy bandwidth "
        f"{bw / 1e12:.2f} TB/s; date {datetime.date.today().isoformat()}. Median time, CUDA events, L2 flushed; "
        "error normwise against float64 of each method's own inputs.",
        "",
        "| shape (b, l, h, p, n, chunk) | dtype | ours | err | mamba_ssm | err | mamba_ssm / ours | copy floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms, err = r["ours"]["auto"]
        if r["mamba"]:
            mms, merr = r["mamba"]
            m = f"{fmt_us(mms)} | {merr:.1e} | {mms / ms:.2f}x"
        else:
            m = "n/a | | "
        lines.append(f"| {shape_cell(r)} | {r['dtype']} | {fmt_us(ms)} | {err:.1e} | {m} | {r['floor']:.1f} us |")
    extra = [(r, k, v) for r in rows for k, v in r["ours"].items() if k != "auto"]
    if extra:
        lines += ["", "| shape | dtype | our variant | time | err |", "|---|---|---|---|---|"]
        for r, k, (ms, err) in extra:
            lines.append(f"| {shape_cell(r)} | {r['dtype']} | {k} | {fmt_us(ms)} | {err:.1e} |")
    judged_rows = [(r, who, v) for r in rows for who, v in r["verdict"].items()]
    if judged_rows:
        lines += [
            "",
            "The engine's calibrated verdict on each output (reference: float32 math on the method's own "
            "inputs rounded to the output dtype; oracle: float64):",
            "",
            "| shape | dtype | method | verdict |",
            "|---|---|---|---|",
        ]
        for r, who, v in judged_rows:
            lines.append(f"| {', '.join(map(str, r['shape']))} | {r['dtype']} | {who} | {verdict_text(*v)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join([*SHAPES, *SLOW])}")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--no-mamba", action="store_true", help="skip mamba_ssm")
    ap.add_argument("--sweep", action="store_true", help="also time our kernel's forced variants (path, segments)")
    ap.add_argument("--paths", default="", help="also time these tensor-core paths forced, e.g. 2,5")
    ap.add_argument(
        "--verdict", action="store_true", help="also judge each output with the engine's calibrated verdict"
    )
    ap.add_argument("--out", default=None, help="write the markdown table here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mamba2_ssd benchmark needs a CUDA GPU; run it on the device machine", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    t0 = time.perf_counter()
    prob = load(EXAMPLE / "problem_y.py", "m2_problem_y")
    cand = load(EXAMPLE / "candidate_y.py", "m2_candidate_y")
    print(f"build/import {time.perf_counter() - t0:.1f} s", flush=True)
    mamba, mamba_version = (None, "skipped") if a.no_mamba else import_mamba_chunk_scan()
    if mamba is None:
        print(f"mamba_ssm not measured: {mamba_version}", flush=True)
    bench = Bench()
    bw = copy_bandwidth(bench)
    device = torch.cuda.get_device_name()
    print(f"{device}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    out_path = os.path.join(os.environ["OUT"], "mamba2_ssd.md") if os.environ.get("OUT") else None
    for name in a.shapes.split(","):
        for dt in a.dtypes.split(","):
            rows.append(
                run_shape(
                    name,
                    {**SHAPES, **SLOW}[name],
                    dt,
                    prob,
                    cand,
                    mamba,
                    bench,
                    bw,
                    a.sweep,
                    [int(x) for x in a.paths.split(",") if x],
                    lambda m: print(m, flush=True),
                    verdict=a.verdict,
                )
            )
            table = markdown(rows, device, bw, mamba_version)
            for path in filter(None, [a.out, out_path]):
                Path(path).write_text(table)  # as it stands: a cut-off run keeps its rows
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
