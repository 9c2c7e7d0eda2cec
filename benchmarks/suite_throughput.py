"""Suite throughput: N one-kernel candidates for N problems, evaluated by `kernelwright suite eval`
(one process; builds of queued candidates run ahead on the CPU in a BuildPool while the device
evaluates; every evaluation in a prestarted child) against N separate `kernelwright eval` calls
(a fresh CLI process each, builds not overlapped). Both start from an empty build cache.

    PYTHONPATH=src python3 benchmarks/suite_throughput.py                      # GPU: 30 CUDA candidates
    PYTHONPATH=src python3 benchmarks/suite_throughput.py --device cpu --n 2   # the CPU path, tiny

Options: --kind cuda|cpp|torch (candidates: a load_inline CUDA kernel, a load_inline C++ kernel, or
plain PyTorch; default cuda on a GPU, torch on the CPU), --n N problems, --separate-n K (time only
the first K separate calls: the figure is per candidate; a device command has a 10-minute limit),
--modes separate,suite, --build-workers W (the suite's BuildPool; default 4), --out DIR (default:
$OUT when set, else benchmarks/out). Writes suite_throughput.json and suite_throughput.md there,
after each mode, and prints the table. The target: the suite at least 3x faster per candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBLEM = '''"""Suite-throughput problem {i}: y = relu(x * {a} + {b})."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x * {a} + {b})


def get_inputs():
    return [torch.randn({rows}, 1024)]


def get_init_inputs():
    return []
'''

CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void affine_relu_{i}(const float* x, float* y, int64_t n) {{
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) y[idx] = fmaxf(x[idx] * {a}f + {b}f, 0.0f);
}}

torch::Tensor affine_relu(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    affine_relu_{i}<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""
cpp_src = "torch::Tensor affine_relu(torch::Tensor x);"

ext = load_inline(name="kw_bench_suite_{i}", cpp_sources=cpp_src, cuda_sources=source, functions=["affine_relu"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.affine_relu(x.contiguous())
'''

CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
#include <torch/extension.h>

torch::Tensor affine_relu(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    float* py = y.data_ptr<float>();
    int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) {{ float v = px[i] * {a}f + {b}f; py[i] = v > 0.f ? v : 0.f; }}
    return y;
}}
"""

ext = load_inline(name="kw_bench_suite_cpp_{i}", cpp_sources=cpp_src, functions=["affine_relu"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.affine_relu(x)
'''

TORCH = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x * {a} + {b}, 0.0)
"""


def write_suite(root: Path, n: int, kind: str, rows: int) -> tuple[Path, Path]:
    probs, cands = root / "level1", root / "candidates"
    probs.mkdir(parents=True)
    cands.mkdir()
    template = {"cuda": CUDA, "cpp": CPP, "torch": TORCH}[kind]
    for i in range(1, n + 1):
        a, b = f"{1.0 + i / 64:.6f}", f"{(i % 7) / 10 - 0.3:.6f}"
        name = f"{i}_affine_relu_{i}.py"
        (probs / name).write_text(PROBLEM.format(i=i, a=a, b=b, rows=rows))
        (cands / name).write_text(template.format(i=i, a=a, b=b))
    return probs, cands


def cli(*args: str, cache: Path, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELWRIGHT_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_separate(probs: Path, cands: Path, k: int, device: str, cache: Path, trials: int) -> dict:
    verdicts, walls, builds = {}, [], []
    for f in sorted(probs.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))[:k]:
        t0 = time.perf_counter()
        out = cli(
            "eval", str(f), str(cands / f.name), "--device", device, "--trials", str(trials), "--json", cache=cache
        )
        walls.append(time.perf_counter() - t0)
        if out.returncode != 0:
            raise SystemExit(f"kernelwright eval failed for {f.name}: {out.stderr[-1500:]}")
        rec = json.loads(out.stdout)
        verdicts[f.stem] = rec["status"]
        builds.append((rec.get("stage_times") or {}).get("build_s") or 0.0)
    return {
        "candidates": len(walls),
        "wall_s": sum(walls),
        "per_candidate_s": sum(walls) / len(walls),
        "median_build_s": statistics.median(builds),
        "verdicts": verdicts,
    }


def run_suite(probs: Path, cands: Path, device: str, cache: Path, trials: int, workers: int, work: Path) -> dict:
    t0 = time.perf_counter()
    out = cli(
        "suite",
        "eval",
        str(probs),
        str(cands),
        "--device",
        device,
        "--trials",
        str(trials),
        "--name",
        "bench",
        "--out",
        str(work / "suite-out"),
        "--store",
        str(work / "suite.db"),
        "--build-workers",
        str(workers),
        cache=cache,
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"kernelwright suite eval failed: {out.stderr[-2000:]}")
    verdicts, builds = {}, []
    for ev in sorted((work / "suite-out").glob("level1/*/000_*/eval.json")):
        rec = json.loads(ev.read_text())
        verdicts[ev.parent.parent.name] = rec["status"]
        builds.append((rec.get("stage_times") or {}).get("build_s") or 0.0)
    return {
        "candidates": len(verdicts),
        "wall_s": wall,
        "per_candidate_s": wall / max(len(verdicts), 1),
        "median_build_s": statistics.median(builds) if builds else None,
        "verdicts": verdicts,
        "build_workers": workers,
    }


def device_name(device: str) -> str:
    if device == "cuda":
        try:
            return (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, IndexError, subprocess.SubprocessError):
            return "cuda"
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def table(res: dict) -> str:
    lines = [
        f"Suite throughput, {res['n']} {res['kind']} candidates, {res['device_name']}, {res['date']}",
        "",
        "| mode | candidates | wall s | s per candidate | median build_s in the evaluation |",
        "|---|---|---|---|---|",
    ]
    for mode in ("separate", "suite"):
        r = res.get(mode)
        if r:
            b = "-" if r["median_build_s"] is None else f"{r['median_build_s']:.2f}"
            label = mode if mode == "separate" else f"suite (build workers {r['build_workers']})"
            lines.append(f"| {label} | {r['candidates']} | {r['wall_s']:.1f} | {r['per_candidate_s']:.2f} | {b} |")
    if "speedup_per_candidate" in res:
        lines += [
            "",
            f"suite speed-up per candidate: {res['speedup_per_candidate']:.2f}x (target 3x); "
            f"verdicts agree: {res['verdicts_agree']}",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--kind", default=None, choices=["cuda", "cpp", "torch"])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--separate-n", type=int, default=None)
    ap.add_argument("--modes", default="separate,suite")
    ap.add_argument("--build-workers", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument(
        "--rows", type=int, default=None, help="input rows (x is rows x 1024); default 4096 on cuda, 64 on cpu"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.device is None:
        args.device = "cuda" if shutil.which("nvidia-smi") else "cpu"
    kind = args.kind or ("cuda" if args.device == "cuda" else "torch")
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kw-suite-bench-"))
    try:
        probs, cands = write_suite(work / "suite", args.n, kind, args.rows or (4096 if args.device == "cuda" else 64))
        res: dict = {
            "n": args.n,
            "kind": kind,
            "device": args.device,
            "device_name": device_name(args.device),
            "date": date.today().isoformat(),
            "trials": args.trials,
        }
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]

        def save() -> None:
            (out_dir / "suite_throughput.json").write_text(json.dumps(res, indent=2) + "\n")
            (out_dir / "suite_throughput.md").write_text(table(res))

        if "separate" in modes:
            res["separate"] = run_separate(
                probs, cands, args.separate_n or args.n, args.device, work / "cache-separate", args.trials
            )
            save()
            print(f"separate: {res['separate']['per_candidate_s']:.2f} s per candidate", flush=True)
        if "suite" in modes:
            res["suite"] = run_suite(
                probs, cands, args.device, work / "cache-suite", args.trials, args.build_workers, work
            )
        if res.get("separate") and res.get("suite"):
            res["speedup_per_candidate"] = res["separate"]["per_candidate_s"] / res["suite"]["per_candidate_s"]
            sep = res["separate"]["verdicts"]
            res["verdicts_agree"] = all(res["suite"]["verdicts"].get(k) == v for k, v in sep.items())
        save()
        print(table(res))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
