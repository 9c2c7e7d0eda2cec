#!/usr/bin/env bash
# One device call: where a window's time goes at several memory budgets (the window's size), for
# the pairs in $KW_ANATOMY (problem:candidate,...). Each eval is a fresh CLI process; the judge's
# phases and the runner's own account (evidence) are printed window by window.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src KERNELWRIGHT_SERVE_AUTOSTART=never
OUT=${OUT:-/tmp/kw-device-out}; mkdir -p "$OUT"
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; git log -1 --format=%h 2>/dev/null
PAIRS=${KW_ANATOMY:-examples/cuda_swish/problem.py:examples/cuda_swish/candidate.py}
for budget in ${KW_BUDGETS:-0 16000}; do
  printf '[eval.timing]\nwindow_budget_mb = %s\n' "$budget" > "$OUT/budget_$budget.toml"
  for pair in ${PAIRS//,/ }; do
    prob=${pair%%:*}; cand=${pair##*:}
    for rep in $(seq ${KW_REPEATS:-1}); do
      timeout ${KW_EVAL_LIMIT:-200} python3 -m kernelwright.cli.main eval "$prob" "$cand" --device cuda --json --shapes off \
        --no-profile --config "$OUT/budget_$budget.toml" > "$OUT/eval_${budget}_$(basename $cand .py)_$rep.json" 2> "$OUT/eval_${budget}_$rep.err"
      python3 - "$OUT/eval_${budget}_$(basename $cand .py)_$rep.json" "$budget" <<'P'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no record", sys.argv[1], e); sys.exit()
t = (r.get("metadata") or {}).get("timing") or {}
print(f"budget {sys.argv[2]} MB {sys.argv[1].split('/')[-1]}: {r.get('status')} {r.get('speedup') and round(r['speedup'], 3)}x cand {r.get('candidate_ms')} ref {r.get('reference_ms')} sets {t.get('calls_per_window')} plan {t.get('plan')}")
for w in t.get("windows") or []:
    rs = w.get("runner_says_ms") or {}
    n = w.get("calls") or 1
    dev = rs.get("device")
    print("   ", {k: w.get(k) for k in ("calls", "candidate_ms", "wall_ms", "to_computed_ms", "after_ms", "copies_ms", "open_ms")},
          "runner", rs, "| judge/device per call", dev and round(w["candidate_ms"] / (dev / n), 3))
P
    done
  done
done
