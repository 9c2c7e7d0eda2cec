"""How soon a stuck kernel is stopped, and that an honest first-call compile is not.

    PYTHONPATH=src python3 benchmarks/stuck_kernel.py [--device cuda|cpu] [--floor 10] [--allowance 120]

Three candidates of y = relu(x) + 1, each evaluated once in a fresh child under the default
limits (or `--floor`, `--allowance`):

- `spins`: never returns from its first call (CUDA: a kernel looping for ever; CPU: a Python
  loop) without compiling anything: stopped at the floor (the issue's goal: within 15 s);
- `compiles`: an honest kernel that compiles at its first call (CUDA: a Triton kernel, its JIT;
  CPU: a C++ extension built in `forward`), longer than `--floor` on a cold cache: passes;
- `spins_after_compiling` (CUDA): a Triton kernel that loops for ever: compiled, then stopped.

Prints, per candidate: verdict, the evaluation's wall, the correctness stage's seconds (its
span: from the stage's start to the stop), the limit, what the compile watch saw; writes
`$OUT/stuck_kernel.json` when `$OUT` is set. Each evaluation gets a fresh build cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kernelwright.core.config import EvalConfig  # noqa: E402
from kernelwright.engine import evaluate  # noqa: E402
from kernelwright.engine.config_resolution import resolve_config  # noqa: E402

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0


def get_inputs():
    return [torch.randn(4096, 1024)]


def get_init_inputs():
    return []
"""

CUDA_SPINS = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda = r"""
__global__ void spin(float* y, const float* x, int n) {
    // a volatile read of an input the compiler cannot see through, equal to itself for ever (an
    // empty loop over a local, volatile or not, may be compiled away: the kernel then returns)
    const volatile float* vx = x;
    while (vx[0] == vx[0]) { }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + 1.f;
}
torch::Tensor relu_plus_one(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    spin<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), x.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="kw_stuck_spin", cpp_sources="torch::Tensor relu_plus_one(torch::Tensor x);",
                  cuda_sources=cuda, functions=["relu_plus_one"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_plus_one(x)
'''

TRITON = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_plus_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if SPIN:
        i = 0
        while tl.load(x_ptr + n - 1) == tl.load(x_ptr + n - 1):  # true for ever: a stuck kernel
            i += 1
        x = x + i
    tl.store(y_ptr + offs, tl.maximum(x, 0.0) + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        relu_plus_one[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024, SPIN=__SPIN__)
        return y
"""

CPU_SPINS = """import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
"""

CPU_COMPILES = (ROOT / "tests" / "fixtures" / "candidates" / "cpp_builds_at_first_call.py").read_text()


def candidates(device: str) -> dict[str, str]:
    if device == "cuda":
        return {
            "spins": CUDA_SPINS,
            "compiles": TRITON.replace("__SPIN__", "False"),
            "spins_after_compiling": TRITON.replace("__SPIN__", "True"),
        }
    return {"spins": CPU_SPINS, "compiles": CPU_COMPILES}


def one(problem: Path, name: str, text: str, device: str, floor: float | None, allowance: float | None) -> dict:
    cfg = EvalConfig(device=device, trials=2, shapes="off")  # type: ignore[arg-type]
    cfg.cache_dir = tempfile.mkdtemp(prefix=f"kw-stuck-{name}-")  # a fresh build cache: a cold compile
    if floor is not None:
        cfg.timeouts.call_floor = floor
    if allowance is not None:
        cfg.timeouts.jit_allowance = allowance
    cfg = resolve_config(cfg)
    t0 = time.monotonic()
    r = evaluate(problem, None, cfg, candidate_text=text)
    wall = time.monotonic() - t0
    span = r.stage_times.spans.get("correctness")
    return {
        "candidate": name,
        "status": r.status.value,
        "wall_s": round(wall, 2),
        "correctness_span_s": round(span[1] - span[0], 2) if span else None,
        "correctness_limit_s": r.metadata.get("correctness_limit_s"),
        "first_call_cap_s": r.metadata.get("correctness_first_call_extra_s"),
        "compile_seen": r.metadata.get("compile_seen"),
        "build_s": r.stage_times.build_s,
        "error": (r.error_log.strip().splitlines() or [""])[0][:200],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--floor", type=float, help="StageTimeouts.call_floor (default: the config's)")
    ap.add_argument("--allowance", type=float, help="StageTimeouts.jit_allowance (default: the config's)")
    ap.add_argument("--only", action="append", help="these candidates only (spins, compiles, spins_after_compiling)")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kw-stuck-"))
    problem = folder / "problem.py"
    problem.write_text(PROBLEM if args.device == "cuda" else PROBLEM.replace("4096, 1024", "256, 256"))
    rows = []
    for name, text in candidates(args.device).items():
        if args.only and name not in args.only:
            continue
        row = one(problem, name, text, args.device, args.floor, args.allowance)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "stuck_kernel.json").write_text(json.dumps(rows, indent=1) + "\n")
    # what each candidate is for: a figure from a spinning fixture that returned measures nothing
    expect = {"spins": "timeout", "compiles": "passed", "spins_after_compiling": "timeout"}
    wrong = [r for r in rows if r["status"] != expect[r["candidate"]]]
    for r in wrong:
        want = expect[r["candidate"]]
        print(f"{r['candidate']}: {r['status']}, not {want}: this run's figures do not measure the stop")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
