#!/usr/bin/env bash
# One short device call: the device clock's own gpu tests, then the honest control and cuda_swish on
# the current code (fresh CLI processes; records in $OUT). The side by side against the old clock:
# `bash scripts/device_checks.sh clock`.
OUT=${OUT:-/tmp/kw-device-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u +%FT%TZ
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 2 tests/test_device_clock.py 2>&1 | tail -3
for p in "tests/fixtures/problems/swish.py tests/clock_attacks/honest.py" "examples/cuda_swish/problem.py examples/cuda_swish/candidate.py"; do
timeout 80 python3 -m kernelwright.cli.main eval $p --device cuda --json > $OUT/e.json 2>$OUT/e.err
python3 - <<'P'
import json, os
r = json.load(open(os.environ["OUT"] + "/e.json"))
t = (r.get("metadata") or {}).get("timing") or {}
print(r.get("status"), r.get("speedup"), r.get("candidate_ms"), r.get("reference_ms"), str(r.get("error_log"))[:300])
print("  ", str({k: v for k, v in t.items() if k not in ("windows", "probe_windows")})[:900])
for w in (t.get("windows") or [])[:3]:
    d = w.get("device_ms") or {}
    print("  ", w["calls"], w["reference_ms"], w["candidate_ms"], d.get("runner"), d.get("off"), w.get("runner_says_ms"))
P
tail -2 $OUT/e.err
done
