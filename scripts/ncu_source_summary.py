"""Summarise Nsight Compute's per-instruction source page (`ncu --import R --page source --csv
--print-source sass`): where the warp-stall samples and the excess memory sectors fall.

    python3 scripts/ncu_source_summary.py stalls.csv [--top 40]

Prints the columns, each numeric column's total, the totals by opcode, and the top instructions by
stall samples (with every non-zero numeric column of each), so a device call brings back a few KB
instead of the report. Standard library only (it runs on the device machine).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict


def num(v: str) -> float | None:
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args(argv)
    with open(a.csv, newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(lines))
    hi = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), 0)
    head, body = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
    print(f"{len(body)} rows; columns: {head}")
    numeric = [j for j, h in enumerate(head) if sum(num(r[j]) is not None for r in body) > len(body) // 2]
    src = next((j for j, h in enumerate(head) if h.strip() == "Source"), 1)
    tot = {j: sum(num(r[j]) or 0.0 for r in body) for j in numeric}
    print("\ntotals:")
    for j in numeric:
        print(f"  {head[j]}: {tot[j]:.6g}")
    # the column to rank by: all stall samples, else any sampling column, else the first numeric one
    ranked = sorted(numeric, key=lambda j: ("Sampling (All" not in head[j], "Sampl" not in head[j]))
    stall = ranked[0] if ranked else None
    if stall is None:
        return 0
    by_op = defaultdict(lambda: defaultdict(float))
    for r in body:
        op = (r[src].split() or ["?"])[0]
        if op.startswith("@"):
            op = (r[src].split() + ["?"])[1]
        op = op.split(".")[0]
        for j in numeric:
            by_op[op][j] += num(r[j]) or 0.0
    print(f"\nby opcode (sorted by {head[stall]}):")
    for op, d in sorted(by_op.items(), key=lambda kv: -kv[1][stall])[:30]:
        cols = ", ".join(f"{head[j]}={d[j]:.4g}" for j in numeric if d[j])
        print(f"  {op}: {cols}")
    print(f"\ntop {a.top} instructions by {head[stall]}:")
    for r in sorted(body, key=lambda r: -(num(r[stall]) or 0.0))[: a.top]:
        cols = ", ".join(f"{head[j]}={r[j]}" for j in numeric if num(r[j]))
        print(f"  {r[src][:70]:70s} | {cols}")
    exc = [j for j in numeric if "xcessive" in head[j]]
    for j in exc:
        print(f"\ntop instructions by {head[j]}:")
        for r in sorted(body, key=lambda r: -(num(r[j]) or 0.0))[:12]:
            if num(r[j]):
                print(f"  {r[src][:70]:70s} | {head[j]}={r[j]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
