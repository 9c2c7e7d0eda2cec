"""Where an evaluation's own time goes (everything but the candidate's kernels), function by function.

    PYTHONPATH=src python3 benchmarks/overhead_anatomy.py [--device cuda] [--cache DIR] [--out DIR]

1. Start-up pieces in a fresh interpreter: python, `import torch`, CUDA init, the first CUDA
   context, `torch.utils.cpp_extension`, `triton`, the first `torch.profiler` session.
2. One evaluation of the example run in this process (the child's `Evaluation`, no pipe) under
   cProfile, after a first evaluation that fills the build cache: the stage times and the
   functions with the most cumulative time. (Trusted example code only: the engine never runs a
   candidate in the caller's process; this is a measurement of the engine's own code.)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

STARTUP = r"""
import time, json
t0 = time.perf_counter(); r = {}
import torch; r['import torch'] = time.perf_counter() - t0
dev = DEVICE
if dev == 'cuda':
    t = time.perf_counter(); torch.cuda.is_available(); torch.cuda.get_device_capability(0); r['cuda available + capability'] = time.perf_counter() - t
    t = time.perf_counter(); torch.empty(1, device='cuda'); torch.cuda.synchronize(); r['first CUDA tensor (context)'] = time.perf_counter() - t
t = time.perf_counter(); import torch.utils.cpp_extension; r['import torch.utils.cpp_extension'] = time.perf_counter() - t
try:
    t = time.perf_counter(); import triton; r['import triton'] = time.perf_counter() - t
except ImportError:
    pass
x = torch.randn(8, 8, device=dev)
t = time.perf_counter()
with torch.profiler.profile() as p:
    (x * 2).sum().item()
r['first torch.profiler session'] = time.perf_counter() - t
t = time.perf_counter(); torch.manual_seed(0); y = torch.randn(8192, 4096); r['randn 8192x4096 on the CPU'] = time.perf_counter() - t
t = time.perf_counter(); y = y.to(dev); r['copy it to the device'] = time.perf_counter() - t
if dev == 'cuda':
    t = time.perf_counter(); torch.manual_seed(0); z = torch.randn(8192, 4096, device=dev); torch.cuda.synchronize(); r['randn 8192x4096 on the GPU'] = time.perf_counter() - t
print('RESULT', json.dumps(r))
"""


def startup_pieces(device: str) -> dict:
    import time

    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "pass"], capture_output=True)
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", STARTUP.replace("DEVICE", repr(device))], capture_output=True, text=True)
    total = time.perf_counter() - t0
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    if not line:
        raise SystemExit(out.stderr[-2000:])
    return {"bare python": bare, **json.loads(line[0][7:]), "whole script": total}


def in_process_eval(problem: Path, candidate: Path, device: str, cache: Path, outdir: Path | None) -> dict:
    from kernelwright.core.config import EvalConfig
    from kernelwright.engine import evaluate
    from kernelwright.engine.child.channel import Channel
    from kernelwright.engine.child.main import Evaluation

    cfg = EvalConfig(device=device, cache_dir=str(cache))
    first = evaluate(problem, candidate, cfg)  # fills the build cache (its own child)
    if not first.correct:
        raise SystemExit(f"the example did not pass: {first.summary_line()}")
    work = Path(tempfile.mkdtemp(prefix="kw-overhead-"))
    (work / "problem.py").write_text(problem.read_text())
    (work / "candidate.py").write_text(candidate.read_text())
    os.environ.setdefault("TMPDIR", str(work))
    job = {"problem_path": str(work / "problem.py"), "candidate_path": str(work / "candidate.py"),
           "config": replace(cfg, profile=replace(cfg.profile, enabled=False)).to_dict()}
    prof = cProfile.Profile()
    prof.enable()
    rec = Evaluation(job, Channel(None)).run()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(60)
    if outdir:
        prof.dump_stats(str(outdir / "overhead.prof"))
    return {"status": rec["status"], "stage_times": rec["stage_times"], "cprofile_top": s.getvalue(),
            "first_eval_stage_times": {k: v for k, v in vars(first.stage_times).items() if v is not None}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--problem", type=Path, default=ROOT / "examples" / "cuda_swish" / "problem.py")
    ap.add_argument("--candidate", type=Path, default=ROOT / "examples" / "cuda_swish" / "candidate.py")
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    pieces = startup_pieces(args.device)
    print("start-up pieces (fresh interpreter):")
    for k, v in pieces.items():
        print(f"  {v:7.3f} s  {k}")
    cache = args.cache or Path(tempfile.mkdtemp(prefix="kw-overhead-cache-"))
    ev = in_process_eval(args.problem, args.candidate, args.device, cache, args.out)
    print("\nstage times of the in-process evaluation:", json.dumps(ev["stage_times"], indent=1))
    print("stage times of the first (child) evaluation:", json.dumps(ev["first_eval_stage_times"], indent=1))
    print(ev["cprofile_top"])
    if args.out:
        (args.out / "overhead_anatomy.json").write_text(json.dumps({"startup": pieces, **ev}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
