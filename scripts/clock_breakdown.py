"""One evaluation's device-clock windows, phase by phase: what each phase took, what came off for it,
and what the runner's own events say (evidence only). `python3 scripts/clock_breakdown.py EVAL.json`
(the JSON of `kernelwright eval --json`)."""

import json
import statistics
import sys

r = json.load(open(sys.argv[1]))
t = (r.get("metadata") or {}).get("timing") or {}
dc = t.get("device_clock") or {}
print(
    r.get("status"),
    "speedup",
    r.get("speedup"),
    "candidate_ms",
    r.get("candidate_ms"),
    "reference_ms",
    r.get("reference_ms"),
)
print(
    "  plan",
    t.get("plan"),
    "anchor",
    dc.get("anchor"),
    "stage switch_ms",
    dc.get("switch_ms"),
    "contended",
    dc.get("contended"),
)
print("  the probe's empty windows (ms):", dc.get("switch_windows_ms"))
guards = (r.get("metadata") or {}).get("guards") or {}
print("  launch:", t.get("launch"), "flags:", guards.get("flags"))
by_events = []
for w in t.get("windows") or []:
    d, rs = w.get("device_ms") or {}, w.get("runner_says_ms") or {}
    off, cal = d.get("off") or {}, d.get("measured") or {}
    inside = rs.get("device", 0.0) + rs.get("commit", 0.0)
    print(
        f"  calls {w['calls']}: copy_in {d.get('copy_in')} (off {off.get('copy_in')}, calibrated {cal.get('copy_in')})"
        f" | middle {d.get('runner')} less the runner's events {round(d.get('runner', 0) - inside, 4)}"
        f" (commit by its events {rs.get('commit')}, off for commit+switch {off.get('commit_and_switch')})"
        f" | snapshot {d.get('snapshot')} (off {off.get('snapshot')}) judge queued {d.get('judge_queued')}"
        f" | candidate {w['candidate_ms']} reference {w['reference_ms']}"
    )
    if rs.get("device"):
        by_events.append(w["reference_ms"] * w["calls"] / rs["device"])
if by_events:
    print("  speed-up by the runner's own events (evidence only):", round(statistics.median(by_events), 3))
