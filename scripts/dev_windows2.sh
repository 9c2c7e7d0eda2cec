#!/usr/bin/env bash
# One device call: memory placement (benchmarks/window_memory.py), then cuda_swish with a larger
# window memory budget, and the version before the judge's clock ($1: its src).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kw-device-out}; mkdir -p "$OUT"
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
timeout 120 python3 benchmarks/window_memory.py --sets 24 --mb 128 2>&1 | tail -12
printf '[eval.timing]\nwindow_budget_mb = %s\n' "${KW_BUDGET:-40000}" > /tmp/kw_budget.toml
ev() { PYTHONPATH=$2 timeout 200 python3 -m kernelwright.cli.main eval examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --device cuda --json $3 > "$OUT/$1.json" 2>"$OUT/$1.err"; }
ev big1 $PWD/src "--config /tmp/kw_budget.toml"; ev big2 $PWD/src "--config /tmp/kw_budget.toml"
ev old1 $PWD/.old/src ""; ev old2 $PWD/.old/src ""
python3 - <<'P'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "no record", open(f[:-5] + ".err").read()[-300:]); continue
    t = d["metadata"].get("timing") or {}
    print(os.path.basename(f), d["status"], round(d["speedup"] or 0, 3), d["candidate_ms"], d["reference_ms"], "calls/window", t.get("calls_per_window"))
    for w in t.get("windows", []): print("   ", {k: w.get(k) for k in ("calls", "candidate_ms", "to_computed_ms", "after_ms", "copies_ms", "open_ms", "runner_says_ms")})
P
