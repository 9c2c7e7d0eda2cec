"""Build speed and engine overhead for a one-kernel candidate, side by side with a default build.

    PYTHONPATH=src python3 benchmarks/build_speed.py [--device cuda] [--out results.json]

Steps, in this order, all in one run on one machine:
1. default  : the candidate's own `load_inline` call, run as plain Python in a fresh extensions
              directory with torch's defaults (TORCH_CUDA_ARCH_LIST unset, i.e. torch picks the
              visible GPUs' archs + PTX; ninja's default jobs; no precompiled header). torch's
              default also deletes any precompiled header, so it runs first.
2. pch      : the one-time build of torch's precompiled <torch/extension.h> for default C++ flags
              (once per machine and torch install, shared by every later candidate).
3. cold     : `evaluate()` with an empty build cache (engine settings: this GPU's arch only,
              MAX_JOBS = cores, PCH where the flags allow, lean torch headers for cuda.cu).
4. cached   : `evaluate()` again, same cache, `--repeats` times, each in a fresh child
              (build_s ~ import of the cached .so).
5. warm     : the same, each in a spare child started ahead and ready (`prestart`): what a round
              of the forge loop pays, whose spare starts up while the Judge and the Coder answer.
6. prebuild : `BuildPool` builds the candidate in a CPU-only child into an empty cache; the
              evaluation after it reports its build stage (should be a cache hit).
7. fallback (`--fallback`): a CUDA candidate whose host code needs the full torch headers
              (tests/fixtures/candidates/cuda_needs_full_headers.py), cold: the failed lean attempt
              and the build as written.

Engine overhead of an evaluation = its wall time (the `evaluate()` call, in the parent) minus
the time the device spends in forward calls of the candidate and the reference: for each of
them, median x (correctness trials + timing warm-up + timed iterations + 4 estimate calls).
Everything else (process start, torch import, CUDA init, cache lookup and import, input
generation, comparisons, L2 flushes, synchronisation, the roofline's measurements) is overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kernelwright.core.config import EvalConfig  # noqa: E402
from kernelwright.engine import evaluate, prestart  # noqa: E402
from kernelwright.engine.config_resolution import resolve_config  # noqa: E402
from kernelwright.engine.extensions.prebuild import BuildPool  # noqa: E402


def default_build(candidate: Path) -> float:
    """Seconds for the candidate's load_inline with torch's defaults, in a fresh process and directory."""
    ext_dir = tempfile.mkdtemp(prefix="kw-default-ext-")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["TORCH_EXTENSIONS_DIR"] = ext_dir
    code = (
        "import time, runpy, torch\n"
        "t = time.perf_counter()\n"
        f"runpy.run_path({str(candidate)!r})\n"
        "print('SECONDS', time.perf_counter() - t)\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
        line = [l for l in out.stdout.splitlines() if l.startswith("SECONDS")]
        if out.returncode != 0 or not line:
            raise RuntimeError(f"default build failed: {(out.stderr or out.stdout)[-800:]}")
        return float(line[0].split()[1])
    finally:
        shutil.rmtree(ext_dir, ignore_errors=True)


def pch_build() -> float | None:
    """Seconds to build torch's PCH for default flags (None: PCH unusable here)."""
    code = (
        "import time, sys\n"
        "from pathlib import Path\n"
        "from kernelwright.engine.child.build import pch_usable, _prepare_pch\n"
        "if not pch_usable({}): print('SECONDS none'); sys.exit(0)\n"
        "t = time.perf_counter()\n"
        "ok = _prepare_pch()\n"
        "print('SECONDS', time.perf_counter() - t if ok else 'none')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    line = [l for l in out.stdout.splitlines() if l.startswith("SECONDS")]
    v = line[0].split()[1] if line else "none"
    return None if v == "none" else float(v)


def kernel_work_s(r) -> float:
    """Device time of the candidate's and reference's forwards during the evaluation (see module doc)."""
    total = 0.0
    trials = len(r.trials)
    for t in (r.candidate_timing, r.reference_timing):
        if t is None:
            continue
        total += t.median_ms * (trials + t.warmup + t.iterations + 4) / 1e3
    return total


def one_eval(problem: Path, candidate: Path, cfg: EvalConfig, warm: bool = False) -> dict:
    spare = None
    if warm:
        spare = prestart(cfg)
        if not spare.wait_ready(300):
            raise RuntimeError("the spare child did not start up")
    t0 = time.perf_counter()
    r = evaluate(problem, candidate, cfg, spare=spare)
    wall = time.perf_counter() - t0
    if not r.correct:
        raise RuntimeError(f"evaluation did not pass: {r.summary_line()}")
    b = (r.metadata.get("builds") or [{}])[0]
    work = kernel_work_s(r)
    st = r.stage_times
    return {
        "wall_s": wall,
        "kernel_work_s": work,
        "overhead_s": wall - work,
        "build_stage_s": st.build_s,
        "extension_build_s": b.get("build_s"),
        "cached": b.get("cached"),
        "pch": b.get("pch"),
        "lean_headers": b.get("lean_headers"),
        "prestarted": r.metadata.get("prestarted"),
        "stages": {k: v for k, v in vars(st).items() if v is not None},
        "candidate_ms": r.candidate_ms,
        "reference_ms": r.reference_ms,
        "device": r.device,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--problem", type=Path, default=ROOT / "examples" / "cuda_swish" / "problem.py")
    ap.add_argument("--candidate", type=Path, default=ROOT / "examples" / "cuda_swish" / "candidate.py")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-default", action="store_true", help="skip the default load_inline build")
    ap.add_argument("--fallback", action="store_true", help="also time a cold build that falls back from lean headers")
    args = ap.parse_args()

    import torch

    dev = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    res: dict = {
        "device": name,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "candidate": str(args.candidate.relative_to(ROOT) if args.candidate.is_relative_to(ROOT) else args.candidate),
    }
    print(f"device: {name} ({os.cpu_count()} CPU cores), torch {torch.__version__}", flush=True)

    if not args.skip_default:
        res["default_build_s"] = default_build(args.candidate)
        print(f"default load_inline build (torch defaults, no PCH): {res['default_build_s']:.1f} s", flush=True)
    res["pch_one_time_s"] = pch_build()
    print(f"one-time PCH build: {res['pch_one_time_s']}", flush=True)

    cache = Path(tempfile.mkdtemp(prefix="kw-bench-cache-"))
    try:
        cfg = resolve_config(EvalConfig(device=dev, cache_dir=str(cache)))
        res["cold"] = one_eval(args.problem, args.candidate, cfg)
        print(
            f"cold evaluation: build stage {res['cold']['build_stage_s']:.1f} s (pch={res['cold']['pch']}), "
            f"wall {res['cold']['wall_s']:.1f} s",
            flush=True,
        )
        res["cached"] = [one_eval(args.problem, args.candidate, cfg) for _ in range(args.repeats)]
        for c in res["cached"]:
            print(
                f"cached evaluation (fresh child): build stage {c['build_stage_s']:.2f} s, wall {c['wall_s']:.2f} s, "
                f"kernel work {c['kernel_work_s']:.3f} s, overhead {c['overhead_s']:.2f} s",
                flush=True,
            )
        res["warm"] = [one_eval(args.problem, args.candidate, cfg, warm=True) for _ in range(args.repeats)]
        for c in res["warm"]:
            print(
                f"cached evaluation (prestarted child): wall {c['wall_s']:.2f} s, overhead {c['overhead_s']:.2f} s, "
                f"stages {json.dumps({k: round(v, 2) for k, v in c['stages'].items()})}",
                flush=True,
            )
        prof_cfg = replace(cfg, profile=replace(cfg.profile, roofline=False, measure_peaks=False))
        res["cached_no_roofline"] = one_eval(args.problem, args.candidate, prof_cfg)
        print(
            f"cached evaluation without roofline: overhead {res['cached_no_roofline']['overhead_s']:.2f} s", flush=True
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    cache = Path(tempfile.mkdtemp(prefix="kw-bench-prebuild-"))
    try:
        cfg = resolve_config(EvalConfig(device=dev, cache_dir=str(cache)))
        t0 = time.perf_counter()
        with BuildPool(max_workers=1, config=cfg) as pool:
            pre = pool.submit(args.problem, args.candidate.read_text()).result()
        res["prebuild"] = {
            "ok": pre.ok,
            "wall_s": time.perf_counter() - t0,
            "build_stage_s": pre.build_s,
            "arch_list": pool.arch_list,
            "error": pre.error,
        }
        after = one_eval(args.problem, args.candidate, cfg)
        res["prebuild"]["eval_after"] = after
        print(
            f"prebuild (CPU-only child, arch {pool.arch_list}): {res['prebuild']['wall_s']:.1f} s ok={pre.ok}; "
            f"evaluation after it: build stage {after['build_stage_s']:.2f} s, cached={after['cached']}",
            flush=True,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    if args.fallback:
        cache = Path(tempfile.mkdtemp(prefix="kw-bench-fallback-"))
        try:
            cfg = resolve_config(EvalConfig(device=dev, cache_dir=str(cache)))
            fb = ROOT / "tests" / "fixtures" / "candidates" / "cuda_needs_full_headers.py"
            res["fallback"] = one_eval(ROOT / "tests" / "fixtures" / "problems" / "add_one.py", fb, cfg)
            print(
                f"fallback candidate, cold: build stage {res['fallback']['build_stage_s']:.1f} s, "
                f"lean attempt {res['fallback']['lean_headers']}",
                flush=True,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    cached = res["cached"]

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    summary = {
        "cold_build_s": res["cold"]["build_stage_s"],
        "cached_build_s": med([c["build_stage_s"] for c in cached]),
        "overhead_fresh_child_s": med([c["overhead_s"] for c in cached]),
        "overhead_prestarted_child_s": med([c["overhead_s"] for c in res["warm"]]),
        "default_build_s": res.get("default_build_s"),
    }
    res["summary"] = summary
    print(
        "\n| device | default load_inline build | engine cold build | cached build | overhead / eval, fresh child "
        "| overhead / eval, prestarted child |"
    )
    print("|---|---|---|---|---|---|")
    d = summary["default_build_s"]
    print(
        f"| {name} | {f'{d:.1f} s' if d else 'n/a'} | {summary['cold_build_s']:.1f} s | "
        f"{summary['cached_build_s']:.2f} s | {summary['overhead_fresh_child_s']:.2f} s | "
        f"{summary['overhead_prestarted_child_s']:.2f} s |"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2, default=str))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
