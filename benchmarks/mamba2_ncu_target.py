"""One call of a forced Mamba-2 tensor-core path, for Nsight Compute to capture (no timing here).

    ncu --kernel-name regex:ssd_tc --launch-skip 1 --launch-count 1 --section SpeedOfLight ... \
        python3 -m benchmarks.mamba2_ncu_target --shape l2048 --dtype fp32 --path 5

Runs the forced path twice (the first launch warms the module; ncu skips it) on the benchmark's
own inputs (`benchmarks/mamba2_ssd.py`: same shapes, same A), and prints the normwise error of the
second call against float64 so a profile is never of a kernel that computed nonsense.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from benchmarks import mamba2_ssd as bench  # the benchmark's shapes, inputs, oracle and loader


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="l2048", choices=sorted({**bench.SHAPES, **bench.SLOW}))
    ap.add_argument("--dtype", default="fp32", choices=sorted(bench.DTYPES))
    ap.add_argument("--path", type=int, default=2, help="tensor-core path to force (2, 5 or 6)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU; run it on the device machine", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    shape = {**bench.SHAPES, **bench.SLOW}[a.shape]
    prob = bench.load(bench.EXAMPLE / "problem_y.py", "m2_problem_y")
    cand = bench.load(bench.EXAMPLE / "candidate_y.py", "m2_candidate_y")
    dtype = bench.DTYPES[a.dtype]
    X, A, B, C = bench.make_inputs(shape, slow=a.shape.endswith("slow"))
    Xd, Bd, Cd = X.to(dtype), B.to(dtype), C.to(dtype)
    for _ in range(2):
        out = cand.ssd_ext.ssd_fused_cfg(Xd, A, Bd, Cd, None, False, 0, a.path, 0)
    torch.cuda.synchronize()
    err = bench.normwise(out, bench.oracle(prob, Xd, A, Bd, Cd, shape[-1]))
    print(f"{a.shape} {a.dtype} path {a.path}: normwise error {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
