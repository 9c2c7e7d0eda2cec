"""The report's plots, drawn with matplotlib (Agg) as SVG text to inline in the page: no files,
no network references (the XML header, DOCTYPE and metadata are stripped)."""

from __future__ import annotations

import io
import math
import re
from typing import Any

from kernelwright.core.record import RoundVerdict

VERDICT_COLORS: dict[str, str] = {  # a colour for every verdict a round or a problem can have
    RoundVerdict.PASSED: "#2e7d32",
    RoundVerdict.INCORRECT: "#f9a825",
    RoundVerdict.COMPILE_ERROR: "#c62828",
    RoundVerdict.RUNTIME_ERROR: "#ad1457",
    RoundVerdict.TIMEOUT: "#6a1b9a",
    RoundVerdict.CRASHED: "#4e342e",
    RoundVerdict.FORMAT_ERROR: "#7b1fa2",
    RoundVerdict.ENGINE_ERROR: "#37474f",
    RoundVerdict.MODEL_ERROR: "#546e7a",
    RoundVerdict.NO_CANDIDATE: "#9e9e9e",
    RoundVerdict.NOT_RUN: "#bdbdbd",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "kernelwright",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _plt().close(fig)
    text = buf.getvalue()
    text = re.sub(r"<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    return text.replace(' xmlns:xlink="http://www.w3.org/1999/xlink"', "")


def speedup_bins(speedups: list[float], n: int = 20) -> list[float]:
    """`n` bins, even on a log scale, from below the slowest kernel (and 0.5x) to above the fastest
    (and 2x): the first and last edges lie outside every value, so rounding in exp/log leaves none out."""
    lo, hi = min(min(speedups), 0.5) / 1.05, max(max(speedups), 2.0) * 1.05
    return [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / n) for i in range(n + 1)]


def speedup_distribution(speedups: list[float]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(3.6, 2.4))
    speedups = [s for s in speedups if s > 0 and math.isfinite(s)]
    if speedups:
        bins = speedup_bins(speedups)
        lo, hi = min(speedups), max(speedups)
        ax.hist(speedups, bins=bins, color="#1565c0", edgecolor="white")
        ax.set_xscale("log")
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ticks = [0.5, 1.0, 2.0]
        for end in (round(lo, 2), round(hi, 2)):  # the ends, where no label is near (they would overlap)
            if all(abs(math.log(end / t)) > 0.35 for t in ticks):
                ticks.append(end)
        ax.set_xticks(sorted(ticks))
    else:
        ax.text(0.5, 0.5, "no correct kernel", ha="center", va="center", transform=ax.transAxes)
    ax.axvline(1.0, color="#555", linestyle="--", linewidth=1)
    ax.set_xlabel("speedup over eager (log scale)")
    ax.set_ylabel("problems")
    ax.set_title("speed-up of correct kernels")
    return _svg(fig)


def fast_p_curve(ps: list[float], values: list[float], title: str = "fast_p: correct and faster than p x") -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(3.6, 2.4))
    ax.step(ps, values, where="post", color="#1565c0")
    for p in (1.0, 1.5, 2.0):
        ax.axvline(p, color="#bbb", linewidth=0.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p")
    ax.set_title(title)
    return _svg(fig)


def verdict_mix(mix: dict[str, int]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(3.6, 2.4))
    names = list(mix)
    ax.barh(names, [mix[n] for n in names], height=0.6, color=[VERDICT_COLORS.get(n, "#777") for n in names])
    ax.set_ylim(len(names) - 0.5 + max(0, 4 - len(names)) * 0.5, -0.5 - max(0, 4 - len(names)) * 0.5)
    ax.set_xlabel("problems")
    ax.set_title("verdict mix (final verdict per problem)")
    return _svg(fig)


def rounds_chart(rounds: list[dict[str, Any]]) -> str:
    """A problem's speed-up round by round; every round marked in its verdict's colour (failed at 0)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(3.6, 1.9))
    xs = [r["round"] for r in rounds]
    ys = [r["speedup"] if r["speedup"] is not None else 0.0 for r in rounds]
    ax.plot(xs, ys, color="#90a4ae", linewidth=1, zorder=1)
    for r, y in zip(rounds, ys, strict=False):
        ax.scatter(
            [r["round"]],
            [y],
            color=VERDICT_COLORS.get(r["verdict"], "#777"),
            s=36 if r["became_best"] else 18,
            marker="*" if r["became_best"] else "o",
            zorder=2,
        )
    ax.axhline(1.0, color="#bbb", linestyle="--", linewidth=0.8)
    ax.set_xticks(xs)
    ax.set_xlabel("round")
    ax.set_ylabel("speedup")
    return _svg(fig)


SERIES_COLORS = ["#1565c0", "#e65100", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#455a64"]


def fast_p_compare(
    ps: list[float], curves: dict[str, list[float]], title: str = "fast_p: correct and faster than p x"
) -> str:
    """fast_p over p for several suites or runs, one line each."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 2.8))
    for i, (label, values) in enumerate(curves.items()):
        ax.step(ps, values, where="post", color=SERIES_COLORS[i % len(SERIES_COLORS)], label=label, linewidth=1.6)
    for p in (1.0, 1.5, 2.0):
        ax.axvline(p, color="#bbb", linewidth=0.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p")
    ax.set_title(title)
    ax.legend(fontsize=8, frameon=False)
    return _svg(fig)


def speedup_compare(problems: list[str], labels: list[str], series: list[list[float | None]]) -> str:
    """Per-problem speed-up of each suite or run as grouped bars (log scale; a failed problem has no bar)."""
    plt = _plt()
    n, k = len(problems), max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(4.8, 0.5 * n * k / 2 + 2.0), 2.8))
    width = 0.8 / k
    for i, (label, values) in enumerate(zip(labels, series, strict=False)):
        xs = [j + (i - (k - 1) / 2) * width for j in range(n)]
        ys = [v if v else float("nan") for v in values]
        ax.bar(xs, ys, width=width, color=SERIES_COLORS[i % len(SERIES_COLORS)], label=label)
    ax.axhline(1.0, color="#555", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    shown = [v for values in series for v in values if v]
    lo, hi = min(shown + [1.0]), max(shown + [1.0])
    ax.set_ylim(lo / 1.3, hi * 1.3)
    ax.set_yticks([t for t in (0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 50, 100) if lo / 1.3 <= t <= hi * 1.3])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(range(n))
    ax.set_xticklabels(problems, rotation=30 if n > 3 else 0, ha="right" if n > 3 else "center", fontsize=8)
    ax.set_ylabel("speedup over eager")
    ax.set_title("speed-up per problem (no bar: no correct kernel)")
    ax.legend(fontsize=8, frameon=False)
    return _svg(fig)
