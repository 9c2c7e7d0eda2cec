#!/usr/bin/env bash
# (branch probe-shaped-windows) The honest control and cuda_swish on the device clock: per window, the
# runner's middle phase less its own events, against the shaped probe's (plain fills; fills reading the inputs),
# and the speed-up with the reading probe's switch taken off. One device call:
#   . scripts/install_bwrap_deb.sh; bash scripts/dev_switch_experiment.sh   (carry .deb)
OUT=${OUT:-/tmp/o}; export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u +%FT%TZ
for cfg in ""; do
for p in "tests/fixtures/problems/swish.py tests/clock_attacks/honest.py" "examples/cuda_swish/problem.py examples/cuda_swish/candidate.py"; do
echo "== $cfg $p"
timeout 100 python3 -m kernelwright.cli.main eval $p --device cuda --json --no-server $cfg > $OUT/e.json 2>$OUT/e.err
python3 - <<'P'
import json, os, statistics as st
r = json.load(open(os.environ["OUT"] + "/e.json"))
t = (r.get("metadata") or {}).get("timing") or {}
dc = t.get("device_clock") or {}
print(r.get("status"), "speedup", r.get("speedup"), r.get("candidate_ms"), r.get("reference_ms"), t.get("calls_per_window"), t.get("plan"), str(r.get("error_log"))[:200])
sw = dc.get("switch_ms") or 0
cor, ev = [], []
for w in (t.get("windows") or []):
    d = w.get("device_ms") or {}; rs = w.get("runner_says_ms") or {}; sh = w.get("shaped_switch_ms")
    off = d.get("off") or {}
    middle = w["to_computed_ms"] - off.get("copy_in", 0)
    inside = rs.get("device", 0) + rs.get("commit", 0)
    if isinstance(sh, list) and all(isinstance(x, float) for x in sh):
        cor.append(w["reference_ms"] / (w["candidate_ms"] - (sh[1] - sw) / w["calls"]))
        sh = [round(x, 4) for x in sh]
    ev.append(w["reference_ms"] * w["calls"] / rs.get("device", 1))
    print("   calls", w["calls"], "excess", round(middle - inside, 4), "shaped (plain, reading)", sh, "queued", d.get("queued_ms"))
print("  corrected", cor and round(st.median(cor), 3), "runner-events", ev and round(st.median(ev), 3))
P
tail -1 $OUT/e.err
done; done
