"""Suite overhead on the CPU: wall time per problem of `kernelwright suite eval` against the
engine's own correctness and timing work per problem (issue 31's CPU target: at most 1.3x).

Eight KernelBench-format problems with plain-PyTorch candidates (no build), evaluated by one
`kernelwright suite eval --json` (a fresh CLI process, as a user runs it) with each executor
asked for. The work is what the records say: `stage_times.correctness_s + timing_s` of every
evaluation (the judge's reference and oracle included in correctness). The wall is the suite's
own (`wall_s` of its JSON summary: from the first candidate submitted to the last record
written), and the CLI process's too (python start, imports, discovery, store).

    PYTHONPATH=src python3 benchmarks/suite_overhead.py                          # local and serial
    PYTHONPATH=src python3 benchmarks/suite_overhead.py --executors local --repeat 3

Writes benchmarks/results/suite_overhead.{json,md} (or --out DIR) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.3

# name -> (reference forward, candidate forward, input shapes); every candidate is correct
OPS = {
    "relu_plus_one": ("torch.relu(x) + 1.0", "torch.clamp_min(x, 0.0) + 1.0", "[(128, 256)]"),
    "swish": ("x * torch.sigmoid(x)", "torch.nn.functional.silu(x)", "[(128, 256)]"),
    "row_softmax": (
        "torch.softmax(x, dim=1)",
        "torch.exp(x - x.amax(1, keepdim=True)).div_(torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True))",
        "[(128, 256)]",
    ),
    "matmul": ("x @ y", "torch.mm(x, y)", "[(128, 128), (128, 128)]"),
    "layer_norm": (
        "torch.nn.functional.layer_norm(x, x.shape[-1:])",
        "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)",
        "[(128, 256)]",
    ),
    "row_sum": ("x.sum(dim=1)", "torch.sum(x, 1)", "[(128, 256)]"),
    "gelu": ("torch.nn.functional.gelu(x)", "0.5 * x * (1.0 + torch.erf(x / 1.4142135623730951))", "[(128, 256)]"),
    "scale_shift": (
        "x * 2.0 - 0.5",
        "torch.addcmul(torch.full_like(x, -0.5), x, torch.full_like(x, 2.0))",
        "[(128, 256)]",
    ),
}

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, {args}):
        return {ref}


def get_inputs():
    return [torch.randn(*s) for s in {shapes}]


def get_init_inputs():
    return []
"""

CANDIDATE = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, {args}):
        return {cand}
"""


def write_suite(root: Path) -> tuple[Path, Path]:
    probs, cands = root / "level1", root / "candidates"
    probs.mkdir(parents=True)
    cands.mkdir()
    for i, (name, (ref, cand, shapes)) in enumerate(OPS.items(), 1):
        args = "x, y" if shapes.count("(") == 2 else "x"
        (probs / f"{i}_{name}.py").write_text(PROBLEM.format(args=args, ref=ref, shapes=shapes))
        (cands / f"{i}_{name}.py").write_text(CANDIDATE.format(args=args, cand=cand))
    return probs, cands


def run(executor: str, probs: Path, cands: Path, work: Path, trials: int, tag: str, shapes: str | None = None) -> dict:
    env = {**os.environ, "KERNELWRIGHT_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "160"}
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelwright.cli.main",
            "suite",
            "eval",
            str(probs),
            str(cands),
            "--device",
            "cpu",
            "--trials",
            str(trials),
            "--executor",
            executor,
            "--json",
            "--name",
            tag,
            "--out",
            str(work / tag),
            "--store",
            str(work / f"{tag}.db"),
            *(["--shapes", shapes] if shapes else []),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    cli_wall = time.perf_counter() - t0
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    if out.returncode != 0:
        raise SystemExit(f"suite eval ({executor}) failed: {out.stderr[-2000:]}")
    summary = json.loads(out.stdout)
    recs = [json.loads(p.read_text()) for p in sorted((work / tag).glob("level1/*/000_*/eval.json"))]
    n = len(recs)
    work_s = [(r["stage_times"]["correctness_s"] or 0.0) + (r["stage_times"]["timing_s"] or 0.0) for r in recs]
    total = [r["stage_times"]["total_s"] or 0.0 for r in recs]
    return {
        "executor": executor,
        "shapes": shapes or "check",
        "problems": n,
        "verdicts": sorted({r["status"] for r in recs}),
        "suite_wall_s": summary["wall_s"],
        "cli_wall_s": round(cli_wall, 3),
        "wall_per_problem_s": round(summary["wall_s"] / n, 3),
        "cli_wall_per_problem_s": round(cli_wall / n, 3),
        "work_per_problem_s": round(sum(work_s) / n, 3),
        "evaluation_total_per_problem_s": round(sum(total) / n, 3),
        "ratio": round(summary["wall_s"] / sum(work_s), 3),
        "cli_ratio": round(cli_wall / sum(work_s), 3),
        "prestarted_idle_s": [((r["metadata"].get("prestarted") or {}).get("idle_s")) for r in recs],
        # where an evaluation's time goes besides the work (the stages' sums over the problems)
        "stages_sum_s": {
            k: round(sum((r["stage_times"].get(k) or 0.0) for r in recs), 3)
            for k in ("startup_s", "build_s", "init_s", "correctness_s", "timing_s", "profile_s", "total_s")
        },
        "engine_phases_sum_s": _phase_sums(recs),
        "load_avg_1min_after": load,
    }


def _phase_sums(recs: list[dict]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for r in recs:
        for k, v in (r.get("metadata", {}).get("engine_phases_s") or {}).items():
            if isinstance(v, (int, float)):
                sums[k] = round(sums.get(k, 0.0) + v, 3)
    return sums


def table(res: dict) -> str:
    lines = [
        f"Suite overhead, {len(OPS)} torch-only problems, {res['machine']}, {res['date']} (target: ratio <= {TARGET})",
        "",
        "| executor | run | wall s / problem | work s / problem | ratio | CLI wall s / problem | CLI ratio | load avg |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        lines.append(
            f"| {r['executor']} | {r['run']} | {r['wall_per_problem_s']:.2f} | {r['work_per_problem_s']:.2f} | "
            f"{r['ratio']:.2f} | {r['cli_wall_per_problem_s']:.2f} | {r['cli_ratio']:.2f} | {r['load_avg_1min_after']:.1f} |"  # noqa: E501
        )
    lines += [
        "",
        "work = correctness_s + timing_s of each record; wall = the suite's own (its JSON wall_s); "
        "CLI wall = the whole `kernelwright suite eval` process; load avg = the machine's 1-minute load "
        "average after the run (anything above the core count means other work shared the cores).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executors", default="local,serial", help="comma-separated: local, serial")
    ap.add_argument("--repeat", type=int, default=1, help="runs per executor (a fresh store each)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--shapes", default=None, help="check, strict or off (the suite's own default: check)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    res = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}: cpu {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",  # noqa: E501
        "trials": args.trials,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="kw-suite-overhead-") as tmp:
        work = Path(tmp)
        probs, cands = write_suite(work / "suite")
        for executor in args.executors.split(","):
            for i in range(args.repeat):
                r = run(executor.strip(), probs, cands, work, args.trials, f"{executor.strip()}-{i}", args.shapes)
                r["run"] = i + 1
                res["runs"].append(r)
                print(json.dumps(r), flush=True)
        if os.environ.get("KW_KEEP_RECORDS"):  # every record, for a look at where the time went
            shutil.copytree(work, args.out / "work", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.so", "*.o"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite_overhead.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "suite_overhead.md").write_text(table(res) + "\n")
    print(table(res))


if __name__ == "__main__":
    main()
