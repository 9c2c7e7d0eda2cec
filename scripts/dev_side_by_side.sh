#!/usr/bin/env bash
# One device call: the honest speed-ups before (.old/src) and after (src), side by side, in fresh
# CLI processes; $KW_PAIRS names the pairs (benchmarks/clock_side_by_side.py), $KW_REPEATS the repeats,
# $KW_EXTRA more `kernelwright eval` arguments for both sides (`--config FILE`: other timing settings).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kw-device-out}; mkdir -p "$OUT"
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
timeout ${KW_LIMIT:-500} python3 benchmarks/clock_side_by_side.py --old-src $PWD/.old/src --new-src $PWD/src --device cuda \
  --repeats ${KW_REPEATS:-2} --only ${KW_PAIRS:-cuda_swish,shapes_cuda,shapes_triton} --out "$OUT/side_by_side.jsonl" \
  ${KW_EXTRA:+-- $KW_EXTRA} > "$OUT/side.log" 2>&1
tail -8 "$OUT/side.log"
python3 - <<'P'
import json, os
for line in open(os.environ["OUT"] + "/side_by_side.jsonl"):
    r = json.loads(line)
    print(r["pair"], r["side"], r["status"], r.get("speedup") and round(r["speedup"], 3), r.get("candidate_ms"), r.get("reference_ms"), r.get("flags"), r.get("wall_s"), r.get("calls_per_window"))
    for w in r.get("windows") or []: print("    ", {k: w.get(k) for k in ("calls", "reference_ms", "candidate_ms", "to_computed_ms", "after_ms", "copies_ms", "open_ms", "probe_fixed_ms", "runner_says_ms", "device_ms")})
    for w in r.get("probe_windows") or []: print("     probe", w)
P
