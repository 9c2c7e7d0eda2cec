"""Where an evaluation's own time goes (everything but the candidate's kernels), function by function.

    PYTHONPATH=src python3 benchmarks/overhead_anatomy.py [--device cuda] [--cache DIR] [--out DIR]

1. Start-up pieces in a fresh interpreter: python, `import torch`, CUDA init, the first CUDA
   context, `torch.utils.cpp_extension`, `triton`, the first `torch.profiler` session.
2. Evaluations of the example in prestarted spares (runner and judge up, waiting), after a first
   evaluation that fills the build cache: the engine's phases as the record gives them
   (`metadata["engine_phases_s"]`) and the runner's stage times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

STARTUP = r"""
import time, json
t0 = time.perf_counter(); r = {}
import torch; r['import torch'] = time.perf_counter() - t0
dev = DEVICE
if dev == 'cuda':
    t = time.perf_counter(); torch.cuda.is_available(); torch.cuda.get_device_capability(0)
    r['cuda available + capability'] = time.perf_counter() - t
    t = time.perf_counter(); torch.empty(1, device='cuda'); torch.cuda.synchronize()
    r['first CUDA tensor (context)'] = time.perf_counter() - t
t = time.perf_counter(); import torch.utils.cpp_extension
r['import torch.utils.cpp_extension'] = time.perf_counter() - t
try:
    t = time.perf_counter(); import triton; r['import triton'] = time.perf_counter() - t
except ImportError:
    pass
x = torch.randn(8, 8, device=dev)
t = time.perf_counter()
with torch.profiler.profile() as p:
    (x * 2).sum().item()
r['first torch.profiler session'] = time.perf_counter() - t
t = time.perf_counter(); torch.manual_seed(0); y = torch.randn(8192, 4096)
r['randn 8192x4096 on the CPU'] = time.perf_counter() - t
t = time.perf_counter(); y = y.to(dev); r['copy it to the device'] = time.perf_counter() - t
if dev == 'cuda':
    t = time.perf_counter(); torch.manual_seed(0); z = torch.randn(8192, 4096, device=dev); torch.cuda.synchronize()
    r['randn 8192x4096 on the GPU'] = time.perf_counter() - t
print('RESULT', json.dumps(r))
"""


def startup_pieces(device: str) -> dict:
    import time

    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "pass"], capture_output=True)
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", STARTUP.replace("DEVICE", repr(device))], capture_output=True, text=True
    )
    total = time.perf_counter() - t0
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    if not line:
        raise SystemExit(out.stderr[-2000:])
    return {"bare python": bare, **json.loads(line[0][7:]), "whole script": total}


def prestarted_evals(
    problem: Path, candidate: Path, device: str, cache: Path, repeats: int, handoff: bool = True
) -> dict:
    """Evaluations in prestarted spares after one that fills the build cache: the engine's phases
    (parent: trusted build or its memory, hand-over, the runner's stages, the judge's verdict after
    the runner ended, stopping) and the runner's stage times, per evaluation."""
    import time

    from build_speed import kernel_work_s

    from kernelwright.core.config import EvalConfig
    from kernelwright.engine import evaluate, prestart
    from kernelwright.engine.config_resolution import resolve_config

    cfg = resolve_config(EvalConfig(device=device, cache_dir=str(cache), device_handoff=handoff))
    first = evaluate(problem, candidate, cfg)  # fills the build cache (its own children)
    if not first.correct:
        raise SystemExit(f"the example did not pass: {first.summary_line()}")
    runs = []
    for _ in range(repeats):
        spare = prestart(cfg)
        if not spare.wait_ready(300):
            raise SystemExit("the spare did not start up")
        t0 = time.perf_counter()
        r = evaluate(problem, candidate, cfg, spare=spare)
        wall = time.perf_counter() - t0
        runs.append(
            {
                "wall_s": wall,
                "overhead_s": wall - kernel_work_s(r),
                "status": r.status.value,
                "device_handoff_off": r.metadata.get("device_handoff_off"),
                "engine_phases_s": r.metadata.get("engine_phases_s"),
                "stage_times": {k: v for k, v in vars(r.stage_times).items() if v is not None},
                "trusted_build": r.metadata.get("trusted_build", {}).get("wall_s"),
                "remembered": r.metadata.get("trusted_build", {}).get("remembered", False),
                "runner_phases_s": r.metadata.get("runner_phases_s"),
                "judge_busy_s": r.metadata.get("judge_busy_s"),
            }
        )
    return {"first_eval_phases_s": first.metadata.get("engine_phases_s"), "prestarted": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--problem", type=Path, default=None, help="default: the device's swish example")
    ap.add_argument("--candidate", type=Path, default=None, help="default: the device's swish example")
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--files",
        action="store_true",
        help="CUDA outputs through files in host memory (EvalConfig.device_handoff off), "
        "not the default device hand-off",
    )
    ap.add_argument("--skip-pieces", action="store_true", help="skip the fresh interpreter's start-up pieces")
    args = ap.parse_args()
    example = ROOT / "examples" / ("cuda_swish" if args.device == "cuda" else "cpu_swish")
    args.problem = args.problem or example / "problem.py"
    args.candidate = args.candidate or example / "candidate.py"
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    pieces = {} if args.skip_pieces else startup_pieces(args.device)
    if pieces:
        print("start-up pieces (fresh interpreter):")
    for k, v in pieces.items():
        print(f"  {v:7.3f} s  {k}")
    cache = args.cache or Path(tempfile.mkdtemp(prefix="kw-overhead-cache-"))
    ev = prestarted_evals(args.problem, args.candidate, args.device, cache, args.repeats, handoff=not args.files)
    print(f"outputs: {'device hand-off where the driver allows' if not args.files else 'through files'}")
    print("\nfirst evaluation (fresh children, empty cache), engine phases:", json.dumps(ev["first_eval_phases_s"]))
    for i, run in enumerate(ev["prestarted"]):
        print(
            f"prestarted #{i + 1}: wall {run['wall_s']:.3f} s, overhead {run['overhead_s']:.3f} s, {run['status']}, "
            f"phases {json.dumps(run['engine_phases_s'])}"
            + (f", hand-off off: {run['device_handoff_off']}" if run["device_handoff_off"] else "")
        )
        print(f"    runner stages {json.dumps(run['stage_times'])}")
        print(f"    runner phases {json.dumps(run['runner_phases_s'])}")
        print(f"    judge busy    {json.dumps(run['judge_busy_s'])}")
    if args.out:
        (args.out / "overhead_anatomy.json").write_text(json.dumps({"startup": pieces, **ev}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
