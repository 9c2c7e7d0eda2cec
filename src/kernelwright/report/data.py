"""A report's data, from the store: metrics, one row per problem, every round with the Judge's
findings, the code and the diff from the round before. The same dict is the JSON export; the
problem rows are the CSV export.

`fast_p_counts` says which kernels the page's fast_p (cards, levels, plot) counts: "all" correct
kernels (KernelBench's fast_p), or "size_robust": only those that hold at every size the shapes
check tried. Both numbers are in the data either way."""

from __future__ import annotations

import csv
import difflib
import io
import json
import re
from datetime import datetime
from typing import Any

from kernelwright.core.record import EvalResult, RoundVerdict, Status
from kernelwright.store.queries import RunStore, result_of
from kernelwright.suites.metrics import ProblemOutcome, fast_p_curve, summarize

CSV_COLUMNS = [
    "level",
    "problem",
    "verdict",
    "correct",
    "size_robust",
    "sizes_failed",
    "speedup",
    "speedup_basis",
    "speedup_as_launched",
    "speedup_withheld_by",
    "speedup_draws",
    "speedup_vs_compile",
    "candidate_ms",
    "reference_ms",
    "reason",
    "best_round",
    "rounds",
    "verdicts",
    "tokens",
    "cost_usd",
    "wall_s",
    "degenerate",
    "run_dir",
]
ENV_KEYS = ("device", "driver", "torch", "cuda", "python", "kernelwright", "commit", "platform")


# a line that says where a build failed: the engine's "main.cpp:10 (candidate line 13): ...", or a
# compiler's own "FILE:LINE:COL: error: ..." (gcc, clang) and "FILE(LINE): error ..." (nvcc)
_BUILD_ERROR_AT = re.compile(r"^\S+:\d+ \(candidate line \d+\): |:\d+:(\d+:)? (fatal )?error: |\(\d+\): error")


def reason(result: EvalResult | None) -> str | None:
    """Why an evaluation failed: the first line of its error log that says something, then the lines
    that locate the error (the numerics' "where: ...", a build's file and line; at most three),
    each cut at 160 characters."""
    if result is None or result.status is Status.PASSED:
        return None
    lines = [" ".join(line.split()) for line in result.error_log.splitlines()]
    head = next((ln for ln in lines if ln and not ln.startswith(("Traceback", "File ", "^"))), None)
    if head is None:
        stage = result.error_stage
        return f"{result.status}" + (f" in stage {stage}" if stage else "")
    where = [ln for ln in lines if ln != head and (ln.startswith("where: ") or _BUILD_ERROR_AT.search(ln))][:3]
    return "\n".join((ln[:157] + "...") if len(ln) > 160 else ln for ln in [head, *where])


def environment(db: RunStore, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the numbers come from: the device, NVIDIA driver, torch, CUDA, Python, kernelwright's
    version and commit, from the runs' run.json and their evaluation records (the first that says)."""
    env: dict[str, Any] = {}
    for run in runs:
        info = run.get("info") or {}
        for k, v in (info.get("environment") or {}).items():
            env.setdefault(k, v)
        if info.get("kernelwright"):
            env.setdefault("kernelwright", info["kernelwright"])
        for e in db.evaluations(run=run["id"]):
            result = result_of(e)
            if result is None:
                continue
            meta = result.metadata
            for key, value in (
                ("device", result.device),
                ("torch", meta.get("torch_version")),
                ("cuda", meta.get("cuda_version")),
                ("python", meta.get("python")),
            ):
                if value:
                    env.setdefault(key, value)
            if "device" in env and "torch" in env:
                break
    return {k: env.get(k) for k in ENV_KEYS}


def per_level(outcomes: list[ProblemOutcome]) -> dict[str, dict[str, Any]]:
    """The metrics of each level (KernelBench reports fast_p per level), when the problems have levels."""
    levels = sorted({o.level for o in outcomes if o.level})
    return {lv: summarize([o for o in outcomes if o.level == lv]).to_dict() for lv in levels}


def fast_p_grid(outcomes: list[ProblemOutcome]) -> list[float]:
    top = max([s for s in (o.counted_speedup for o in outcomes) if s] + [2.0])
    top = min(top * 1.1, 100.0)
    n = 60
    return [round(top * i / n, 4) for i in range(n + 1)]


FAST_P_COUNTS = ("all", "size_robust")


def build(db: RunStore, target: str, fast_p_counts: str = "all") -> dict[str, Any]:
    """The report's data; `fast_p_counts` ("all" or "size_robust"): the kernels the page's fast_p counts."""
    if fast_p_counts not in FAST_P_COUNTS:
        raise ValueError(f"fast_p_counts is one of {', '.join(FAST_P_COUNTS)}, not {fast_p_counts!r}")
    suite = db.suite(target)
    rows = db.problems(target)
    outcomes = [ProblemOutcome(**r) for r in rows]
    counted = [o for o in outcomes if not o.degenerate]
    grid = fast_p_grid(counted)
    problems: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for row in rows:
        rounds = []
        if row["run_id"] is not None:
            prev_code = None
            for r in db.rounds(row["run_id"]):
                code = r.get("code")
                diff = None
                if code is not None and prev_code is not None and code != prev_code:
                    diff = "".join(
                        difflib.unified_diff(
                            prev_code.splitlines(True),
                            code.splitlines(True),
                            f"round {r['idx'] - 1}",
                            f"round {r['idx']}",
                            n=2,
                        )
                    )
                rounds.append(
                    {
                        "round": r["idx"],
                        "kind": r["kind"],
                        "verdict": r["verdict"],
                        "speedup": r["speedup"],
                        "became_best": bool(r["became_best"]),
                        "best_decision": r["best_decision"],
                        "critique": r.get("critique"),
                        "judge_error": r["judge_error"],
                        "code": code,
                        "diff": diff,
                    }
                )
                prev_code = code if code is not None else prev_code
        best = next((r for r in rounds if r["round"] == row["best_round"]), None)
        run = db.run(row["run_id"]) if row["run_id"] else None
        if run is not None:
            runs.append(run)
        error = why = None
        timed: dict[str, Any] = {}
        evals = db.evaluations(run=row["run_id"]) if row["run_id"] is not None else []
        if row["correct"]:
            timed = next((e for e in evals if e["round_idx"] == row["best_round"]), {})
        elif evals:
            last = result_of(evals[-1])
            error = last.error_log.strip()[:4000] if last is not None else None
            why = reason(last)
        elif row["verdict"] == RoundVerdict.NO_CANDIDATE:
            why = "no candidate for this problem"
        problems.append(
            {
                **row,
                "rounds": rounds,
                "best_code": best["code"] if best else None,
                "run_dir": run["run_dir"] if run else None,
                "error_log": error,
                "reason": why,
                "candidate_ms": timed.get("candidate_ms"),
                "reference_ms": timed.get("reference_ms"),
                "key": f"{row['level']}/{row['problem']}" if row["level"] else row["problem"],
            }
        )
    return {
        "target": target,
        "kind": f"{suite['kind']} suite" if suite else "run",
        "generated": datetime.now().isoformat(timespec="seconds"),
        "settings": (suite or {}).get("info") or (db.run(target) or {}).get("info") or {},
        "environment": environment(db, runs),
        "metrics": summarize(outcomes).to_dict(),
        "levels": per_level(counted),
        "fast_p_counts": fast_p_counts,
        "fast_p_curve": {
            "p": grid,
            "fast_p": fast_p_curve(counted, grid),
            "fast_p_size_robust": fast_p_curve(counted, grid, size_robust=True),
        },
        "problems": problems,
    }


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, allow_nan=True) + "\n"


def to_csv(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for p in data["problems"]:
        w.writerow(
            {
                **p,
                "rounds": len(p["rounds"]),
                "verdicts": " ".join(p["verdicts"]),
                "sizes_failed": " ".join(p.get("sizes_failed") or []),
                "speedup_withheld_by": " ".join(p.get("speedup_withheld_by") or []),
                "speedup_draws": " ".join(f"{x:.4g}" for x in p.get("speedup_draws") or []),
            }
        )
    return buf.getvalue()
