"""Cold builds of a corpus' custom-kernel candidates, one by one or a few at once: where each build's time goes.

    PYTHONPATH=src python3 -m benchmarks.cold_builds CORPUS --levels 1,2 [--workers 1] [--limit N] [--out DIR]

CORPUS is a folder unpacked by `benchmarks/corpus_suite.py unpack` (problems/levelN, candidates/levelN).
Every candidate whose text calls `load_inline` or `cpp_extension.load` is built by the engine's
prebuild (`engine/extensions/prebuild.py`: a CPU-only child imports the candidate, the build calls it makes
are recorded, the trusted builder compiles them), into one build cache that starts empty, `--workers`
at a time, in the corpus' order. The prebuild's wall is what one candidate's cold build costs off the
GPU's path (the child's start and torch's import included).

Each candidate's row: wall, ok, and per build call: its seconds, whether the precheck failed it before
any compiler ran, whether the lean-header attempt was used or failed first (and how long it took), and
the compiler's first error line. The summary: median / p90 wall over all candidates, over those whose
build reached a compiler (a precheck failure is a few seconds and would flatter the median), and over
those that built.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.corpus_suite import _pct
from kernelwright.core.config import EvalConfig
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.engine.extensions.prebuild import BuildPool

BUILDS = re.compile(r"\bload_inline\b|cpp_extension\.load\b|\bload\(")


def _stats(values: list[float]) -> dict:
    return {
        "n": len(values),
        "median": round(statistics.median(values), 2) if values else None,
        "p90": round(p, 2) if (p := _pct(values, 0.9)) is not None else None,
        "max": round(max(values), 2) if values else None,
    }


def _row(name: str, pre) -> dict:
    builds = []
    for b in pre.builds or []:
        if not isinstance(b, dict):
            continue
        lean = b.get("lean_headers") or {}
        builds.append(
            {
                "name": b.get("name"),
                "ok": b.get("ok"),
                "call_s": b.get("call_s"),
                "build_s": b.get("build_s"),
                "precheck": bool(b.get("precheck")),
                "lean": lean.get("used"),
                "lean_tried_s": lean.get("tried_s"),
                "lean_reason": (lean.get("reason") or "")[:160],
                "pch": b.get("pch"),
                "error": (b.get("error") or "")[:160],
            }
        )
    return {
        "candidate": name,
        "ok": pre.ok,
        "wall_s": round(pre.wall_s, 2),
        "error": (pre.error or "")[:200],
        "builds": builds,
        # a compiler ran: some build call was not failed by the precheck alone
        "compiled": any(not b["precheck"] for b in builds),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--levels", default="1,2")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="at most this many candidates (0: all)")
    ap.add_argument("--time-limit", type=float, default=0.0, help="submit no new build after this many seconds")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    args = ap.parse_args()

    pairs = []
    for level in args.levels.split(","):
        cands = args.corpus / "candidates" / f"level{level}"
        for path in sorted(cands.glob("*.py")):
            problem = args.corpus / "problems" / f"level{level}" / path.name
            if problem.exists() and BUILDS.search(path.read_text()):
                pairs.append((f"level{level}/{path.stem}", problem, path.read_text()))
    if args.limit:
        pairs = pairs[: args.limit]
    cache = tempfile.mkdtemp(prefix="kw-cold-builds-")
    config = resolve_config(EvalConfig(cache_dir=cache))
    rows: list[dict] = []
    t0 = time.monotonic()
    with BuildPool(max_workers=args.workers, config=config) as pool:
        futures = []
        for name, problem, text in pairs:
            futures.append((name, pool.submit(problem, text)))
        for name, fut in futures:
            if args.time_limit and time.monotonic() - t0 > args.time_limit:
                fut.cancel()
                continue
            row = _row(name, fut.result())
            rows.append(row)
            print(json.dumps(row), flush=True)
    wall = [r["wall_s"] for r in rows]
    summary = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "workers": args.workers,
        "candidates": len(rows),
        "all": _stats(wall),
        "reached_a_compiler": _stats([r["wall_s"] for r in rows if r["compiled"]]),
        "built": _stats([r["wall_s"] for r in rows if r["ok"] and r["compiled"]]),
        "failed_in_precheck": sum(1 for r in rows if r["builds"] and not r["compiled"]),
        "lean_failed_first": sum(1 for r in rows if any(b["lean"] is False for b in r["builds"])),
        "total_s": round(time.monotonic() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cold_builds.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
