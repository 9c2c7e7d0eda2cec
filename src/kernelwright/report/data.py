"""A report's data, from the store: metrics, one row per problem, every round with the Judge's
findings, the code and the diff from the round before. The same dict is the JSON export; the
problem rows are the CSV export."""

from __future__ import annotations

import csv
import difflib
import io
import json
from datetime import datetime
from typing import Any

from kernelwright.store.api import RunStore
from kernelwright.suites.metrics import ProblemOutcome, fast_p_curve, summarize

CSV_COLUMNS = ["level", "problem", "verdict", "correct", "speedup", "speedup_vs_compile", "best_round", "rounds",
               "verdicts", "tokens", "cost_usd", "wall_s", "degenerate", "run_dir"]


def fast_p_grid(outcomes: list[ProblemOutcome]) -> list[float]:
    top = max([o.speedup for o in outcomes if o.correct and o.speedup] + [2.0])
    top = min(top * 1.1, 100.0)
    n = 60
    return [round(top * i / n, 4) for i in range(n + 1)]


def build(db: RunStore, target: str) -> dict[str, Any]:
    suite = db.suite(target)
    rows = db.problems(target)
    outcomes = [ProblemOutcome(**r) for r in rows]
    counted = [o for o in outcomes if not o.degenerate]
    grid = fast_p_grid(counted)
    problems = []
    for row in rows:
        rounds = []
        if row["run_id"] is not None:
            prev_code = None
            for r in db.rounds(row["run_id"]):
                code = r.get("code")
                diff = None
                if code is not None and prev_code is not None and code != prev_code:
                    diff = "".join(difflib.unified_diff(prev_code.splitlines(True), code.splitlines(True),
                                                        f"round {r['idx'] - 1}", f"round {r['idx']}", n=2))
                rounds.append({"round": r["idx"], "kind": r["kind"], "verdict": r["verdict"], "speedup": r["speedup"],
                               "became_best": bool(r["became_best"]), "best_decision": r["best_decision"],
                               "critique": r.get("critique"), "judge_error": r["judge_error"],
                               "code": code, "diff": diff})
                prev_code = code if code is not None else prev_code
        best = next((r for r in rounds if r["round"] == row["best_round"]), None)
        run = db.run(row["run_id"]) if row["run_id"] else None
        error = None
        if not row["correct"] and row["run_id"] is not None:
            evals = db.evaluations(run=row["run_id"])
            if evals:
                error = (evals[-1]["record"].get("error_log") or "").strip()[:4000]
        problems.append({**row, "rounds": rounds, "best_code": best["code"] if best else None,
                         "run_dir": run["run_dir"] if run else None, "error_log": error,
                         "key": f"{row['level']}/{row['problem']}" if row["level"] else row["problem"]})
    return {
        "target": target,
        "kind": f"{suite['kind']} suite" if suite else "run",
        "generated": datetime.now().isoformat(timespec="seconds"),
        "settings": (suite or {}).get("info") or (db.run(target) or {}).get("info") or {},
        "metrics": summarize(outcomes).to_dict(),
        "fast_p_curve": {"p": grid, "fast_p": fast_p_curve(counted, grid)},
        "problems": problems,
    }


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, allow_nan=True) + "\n"


def to_csv(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for p in data["problems"]:
        w.writerow({**p, "rounds": len(p["rounds"]), "verdicts": " ".join(p["verdicts"])})
    return buf.getvalue()
