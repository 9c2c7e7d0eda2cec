"""The honest figures before and after the judge took the clock: one device, one run, side by side.

For each (problem, candidate) pair, `kernelwright eval --json` runs alternately with the engine
at `--old-src` (the runner's own CUDA events, the version before) and at `--new-src` (the
judge's timing windows), `--repeats` times each, in fresh CLI processes, and the median speed-up
of each side is printed with their ratio. Writes a JSON line per evaluation to `--out`.

    python3 benchmarks/clock_side_by_side.py --old-src .old/src --new-src src --device cuda --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {
    "cuda_swish": ("examples/cuda_swish/problem.py", "examples/cuda_swish/candidate.py"),
    "mamba2_y": ("examples/mamba2_ssd/problem_y.py", "examples/mamba2_ssd/candidate_y.py"),
    "mamba2_state": ("examples/mamba2_ssd/problem_state.py", "examples/mamba2_ssd/candidate_state.py"),
    "shapes_cuda": ("tests/fixtures/shapes/problem.py", "tests/fixtures/shapes/cuda_honest.py"),
    "shapes_triton": ("tests/fixtures/shapes/problem.py", "tests/fixtures/shapes/triton_honest.py"),
    "cpu_swish": ("examples/cpu_swish/problem.py", "examples/cpu_swish/candidate.py"),
    # the clock attacks' control: the reference's own computation (about 1x wherever it runs)
    "honest_control": ("tests/fixtures/problems/swish.py", "tests/clock_attacks/honest.py"),
    "suite_swish": ("tests/fixtures/suite/level1/2_swish.py", "tests/fixtures/suite/candidates/2_swish.py"),
    "suite_softmax": (
        "tests/fixtures/suite/level1/4_row_softmax.py",
        "tests/fixtures/suite/candidates/4_row_softmax.py",
    ),
    "suite_matmul": (
        "tests/fixtures/suite/level1/5_small_matmul.py",
        "tests/fixtures/suite/candidates/5_small_matmul.py",
    ),
}


def one(src: str, problem: str, candidate: str, device: str, extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelwright.cli.main",
            "eval",
            problem,
            candidate,
            "--device",
            device,
            "--json",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - t0
    try:
        rec = json.loads(p.stdout)
    except ValueError:
        return {"status": "no_record", "wall_s": wall, "stderr": p.stderr[-500:]}
    flags = (rec.get("metadata", {}).get("guards") or {}).get("flags") or {}
    return {
        "status": rec.get("status"),
        "speedup": rec.get("speedup"),
        "candidate_ms": rec.get("candidate_ms"),
        "reference_ms": rec.get("reference_ms"),
        "flags": sorted(flags),
        "wall_s": round(wall, 2),
        "clock": (rec.get("metadata", {}).get("timing") or {}).get("clock", "runner events"),
        "calls_per_window": (rec.get("metadata", {}).get("timing") or {}).get("calls_per_window"),
        "windows": ((rec.get("metadata", {}).get("timing") or {}).get("windows") or [])[:3],
        "probe_windows": ((rec.get("metadata", {}).get("timing") or {}).get("probe_windows") or [])[-3:],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-src", required=True)
    ap.add_argument("--new-src", default=str(ROOT / "src"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    names = [n for n in PAIRS if not a.only or n in a.only.split(",")]
    out = open(a.out, "a") if a.out else None
    rows = []
    for name in names:
        prob, cand = PAIRS[name]
        got: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(a.repeats):
            for side, src in (("old", a.old_src), ("new", a.new_src)):
                r = one(src, prob, cand, a.device, a.extra)
                r.update(pair=name, side=side)
                got[side].append(r)
                print(json.dumps(r), flush=True)
                if out:
                    out.write(json.dumps(r) + "\n")
                    out.flush()
        med = {s: statistics.median([r["speedup"] for r in got[s] if r.get("speedup")] or [float("nan")]) for s in got}
        rows.append((name, med["old"], med["new"], med["new"] / med["old"] if med["old"] else float("nan")))
    print(f"\n{'pair':<16}{'old x':>10}{'new x':>10}{'new/old':>10}")
    for name, o, n, r in rows:
        print(f"{name:<16}{o:>10.3f}{n:>10.3f}{r:>10.3f}")


if __name__ == "__main__":
    main()
