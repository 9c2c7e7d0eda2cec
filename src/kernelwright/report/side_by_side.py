"""Two or more suites or runs side by side (`kernelwright report A B ...`): what people publish.

One row per metric across the targets (correctness, fast_p, speed-ups, cost), then a table per
per-problem metric (speed-up, verdict, kernel time) with a column per target, and plots (fast_p
curves on one axis, per-problem speed-ups as grouped bars). Every target's environment is named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kernelwright.report.data import fast_p_grid
from kernelwright.suites.metrics import ProblemOutcome, fast_p_curve

_OUTCOME_FIELDS = {f.name for f in dataclasses.fields(ProblemOutcome)}

# (label, key in metrics, format, higher is better)
SUMMARY = [
    ("problems", "problems", "int", None),
    ("correct", "correct", "int", True),
    ("correctness rate", "correctness_rate", "pct", True),
    ("correct at all sizes", "size_robust", "int", True),
]
TAIL = [
    ("geomean speed-up (correct)", "geomean_speedup", "x", True),
    ("mean speed-up (correct)", "mean_speedup", "x", True),
    ("geomean over torch.compile", "geomean_speedup_vs_compile", "x", True),
    ("tokens per problem", "tokens_per_problem", "int", False),
    ("cost per problem (USD)", "cost_per_problem", "usd", False),
    ("wall time per problem (s)", "wall_s_per_problem", "s", False),
]
PER_PROBLEM = [
    ("speed-up over the reference", "speedup", "x"),
    ("verdict", "verdict", "text"),
    ("candidate time (ms, the best correct kernel)", "candidate_ms", "ms"),
    ("reference time (ms, timed beside it)", "reference_ms", "ms"),
    ("rounds", "rounds", "int"),
]


def label_of(target: str, kind: str) -> str:
    """A short column label: a suite's name, or a run directory's folder name."""
    return Path(target).name if kind == "run" and ("/" in target or Path(target).is_absolute()) else target


def _labels(datas: list[dict[str, Any]]) -> list[str]:
    labels: list[str] = []
    for d in datas:
        label = label_of(d["target"], d["kind"])
        if label in labels:
            label = f"{label} ({len(labels) + 1})"
        labels.append(label)
    return labels


def _best(values: list[Any], higher: bool | None, kind: str = "x") -> int | None:
    """The index of the best value, when one is better as shown (a tie at the shown precision is none)."""
    nums = [(v, i) for i, v in enumerate(values) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if higher is None or len(nums) < 2:
        return None
    best = (max if higher else min)(nums)
    if sum(fmt(v, kind) == fmt(best[0], kind) for v, _ in nums) > 1:
        return None
    return best[1]


def build_comparison(datas: list[dict[str, Any]], size_robust: bool = False) -> dict[str, Any]:
    """The comparison of several reports' data (`report.data.build`), as one dict (the JSON export).
    `size_robust`: the fast_p rows and curves count only kernels that hold at every size tried."""
    labels = _labels(datas)
    ms = [d["metrics"] for d in datas]
    rows: list[tuple[str, Any, str, bool | None]] = [(lab, key, fmt, hi) for lab, key, fmt, hi in SUMMARY]
    if size_robust:
        rows += [(f"fast_{p} (all sizes)", ("fast_p_size_robust", p), "pct", True) for p in ms[0]["fast_p"]]
    else:
        rows += [(f"fast_{p}", ("fast_p", p), "pct", True) for p in ms[0]["fast_p"]]
    rows += TAIL
    metrics = []
    for name, key, fmt, higher in rows:
        values = [m[key[0]].get(key[1]) if isinstance(key, tuple) else m.get(key) for m in ms]
        metrics.append({"metric": name, "format": fmt, "values": values, "best": _best(values, higher, fmt)})
    keys: list[str] = []
    for d in datas:
        keys += [p["key"] for p in d["problems"] if p["key"] not in keys]
    by_key = [{p["key"]: p for p in d["problems"]} for d in datas]
    tables = []
    for name, field, fmt in PER_PROBLEM:
        body = []
        for k in keys:
            cells = [
                (len(t[k]["rounds"]) if field == "rounds" else t[k].get(field)) if k in t else None for t in by_key
            ]
            body.append(
                {
                    "problem": k,
                    "values": cells,
                    "best": _best(
                        cells, True if field == "speedup" else False if field == "candidate_ms" else None, fmt
                    ),
                }
            )
        tables.append({"metric": name, "field": field, "format": fmt, "rows": body})
    outcomes = [
        [ProblemOutcome(**{k: v for k, v in p.items() if k in _OUTCOME_FIELDS}) for p in d["problems"]] for d in datas
    ]
    counted = [[o for o in os_ if not o.degenerate] for os_ in outcomes]
    grid = fast_p_grid([o for os_ in counted for o in os_])
    return {
        "kind": "comparison",
        "targets": [
            {
                "label": lab,
                "target": d["target"],
                "kind": d["kind"],
                "environment": d.get("environment") or {},
                "settings": {
                    k: v
                    for k, v in (d.get("settings") or {}).items()
                    if k in ("coder", "judge", "device", "backend", "round_limit", "trials", "verdict")
                },
            }
            for lab, d in zip(labels, datas, strict=False)
        ],
        "labels": labels,
        "metrics": metrics,
        "tables": tables,
        "fast_p_counts": "size_robust" if size_robust else "all",
        "fast_p_curves": {
            "p": grid,
            "fast_p": {lab: fast_p_curve(c, grid, size_robust) for lab, c in zip(labels, counted, strict=False)},
        },
        "reports": datas,
    }


def fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "x":
        return f"{value:.3f}x"
    if kind == "int":
        return f"{value:.0f}"
    if kind == "usd":
        return f"${value:.4f}"
    if kind == "s":
        return f"{value:.1f}"
    if kind == "ms":
        return f"{value:.4g}"
    return str(value)


def to_csv(comp: dict[str, Any]) -> str:
    """One row per problem, a column per target and per-problem metric (speedup[A], verdict[A], ...)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    labels = comp["labels"]
    w.writerow(["problem"] + [f"{t['field']}[{lab}]" for t in comp["tables"] for lab in labels])
    for i, row in enumerate(comp["tables"][0]["rows"]):
        w.writerow(
            [row["problem"]] + [v if v is not None else "" for t in comp["tables"] for v in t["rows"][i]["values"]]
        )
    return buf.getvalue()


def render_html(comp: dict[str, Any]) -> str:
    from kernelwright.report import plots
    from kernelwright.report.html import SIZE_ROBUST_TITLE, environment

    env = environment()
    speed = next(t for t in comp["tables"] if t["field"] == "speedup")
    title = {"title": SIZE_ROBUST_TITLE} if comp.get("fast_p_counts") == "size_robust" else {}
    figures = {
        "fast_p": plots.fast_p_compare(comp["fast_p_curves"]["p"], comp["fast_p_curves"]["fast_p"], **title),
        "speedups": plots.speedup_compare(
            [r["problem"] for r in speed["rows"]],
            comp["labels"],
            [[r["values"][i] for r in speed["rows"]] for i in range(len(comp["labels"]))],
        ),
    }
    return env.get_template("compare.html.j2").render(c=comp, figures=figures, fmt=fmt, colors=plots.VERDICT_COLORS)
