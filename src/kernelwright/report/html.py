"""The HTML report: one self-contained page (inline CSS, JS and SVG plots; no network references)."""

from __future__ import annotations

from typing import Any

import jinja2

from kernelwright.core.record import WITHHOLDING_FLAGS
from kernelwright.report import plots

SIZE_ROBUST_TITLE = "fast_p, all sizes: faster than p x"


def environment() -> jinja2.Environment:
    """The reports' templates (report/templates/), escaped, strict about missing names."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("kernelwright.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(data: dict[str, Any]) -> str:
    env = environment()
    m = data["metrics"]
    robust = data.get("fast_p_counts") == "size_robust"
    curve = data["fast_p_curve"]
    speedups = [  # the distribution of the figures fast_p counts: none degenerate, none withheld
        p["speedup"]
        for p in data["problems"]
        if p["correct"] and p["speedup"] and not p["degenerate"] and not p.get("speedup_withheld_by")
    ]
    figures = {
        "distribution": plots.speedup_distribution(speedups),
        "fast_p": plots.fast_p_curve(curve["p"], curve["fast_p_size_robust"], SIZE_ROBUST_TITLE)
        if robust
        else plots.fast_p_curve(curve["p"], curve["fast_p"]),
        "verdicts": plots.verdict_mix(m["verdict_mix"]),
    }
    charts = {p["key"]: plots.rounds_chart(p["rounds"]) for p in data["problems"] if len(p["rounds"]) > 1}
    return env.get_template("report.html.j2").render(
        data=data,
        m=m,
        robust=robust,
        figures=figures,
        charts=charts,
        colors=plots.VERDICT_COLORS,
        withholding=WITHHOLDING_FLAGS,
        has_levels=any(p["level"] for p in data["problems"]),  # a folder suite has none: no empty column
    )
