"""Where a suite's wall goes, from its records alone (one eval.json each, as dicts).

Each record's `stage_times` gives the seconds of each stage and, in `spans`, each stage's
[start, end] on the parent's wall clock; `metadata.executor` says which GPU ran it and, for a
prebuilt candidate, how long its build waited for a builder (`prebuild.waited_s`) and how long
its GPU stood idle waiting for it (`gpu_waited_for_build_s`, the serial driver). From those:

- the sum of each stage's seconds over the records, and the start-up that was on the path (the
  `startup` spans: a spare started ahead has done its import before its job comes);
- each GPU's busy share: the share of the suite's wall during which some evaluation placed on that
  GPU was in a stage that uses it (correctness, timing, profile): the union of those spans, so
  two evaluations at work at once on one GPU count once (with `--draws`, every draw's spans);
- the builds' waits on one another, and the GPU's waits on builds;
- the record latency: from an evaluation's last stage to its record on disk (the driver's and the
  store's serial part, with the wait behind other records being written).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

STAGE_SECONDS = ("startup_s", "build_s", "init_s", "correctness_s", "timing_s", "profile_s", "total_s")
GPU_STAGES = ("correctness", "timing", "profile")


def _spans(record: dict[str, Any]) -> dict[str, list[float]]:
    return span_map((record.get("stage_times") or {}).get("spans"))


def span_map(spans: Any) -> dict[str, list[float]]:
    """The well-formed [start, end] spans of a `stage_times.spans` mapping, by stage."""
    spans = spans if isinstance(spans, dict) else {}
    out = {}
    for stage, span in spans.items():
        if isinstance(span, list | tuple) and len(span) == 2 and all(isinstance(t, int | float) for t in span):
            if span[1] >= span[0]:
                out[str(stage)] = [float(span[0]), float(span[1])]
    return out


def _every_span(record: dict[str, Any]) -> list[tuple[str, list[float]]]:
    """(stage, span) of the record's evaluation and of its other draws (`--draws`: each a whole
    evaluation, kept in `metadata.draws.each`; the record's own draw is among them: the unions count it once)."""
    out = list(_spans(record).items())
    draws = (record.get("metadata") or {}).get("draws")
    each = draws.get("each") if isinstance(draws, dict) else None
    for d in each if isinstance(each, list) else []:
        if isinstance(d, dict):
            out += span_map(d.get("spans")).items()
    return out


def _executor(record: dict[str, Any]) -> dict[str, Any]:
    ex = (record.get("metadata") or {}).get("executor")
    return ex if isinstance(ex, dict) else {}


def gpu_of(record: dict[str, Any]) -> str:
    """The GPU a record's evaluation ran on, as its executor placed it ("0" when it says none)."""
    gpu = _executor(record).get("gpu")
    return str(gpu) if gpu not in (None, "") else "0"


def union_s(intervals: list[list[float]], lo: float | None = None, hi: float | None = None) -> float:
    """Seconds covered by the union of [start, end] intervals, clipped to [lo, hi] when given."""
    clipped = []
    for a, b in intervals:
        a = a if lo is None else max(a, lo)
        b = b if hi is None else min(b, hi)
        if b > a:
            clipped.append((a, b))
    total, end = 0.0, float("-inf")
    for a, b in sorted(clipped):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def stage_sums(records: list[dict[str, Any]]) -> dict[str, float]:
    """Each stage's seconds summed over the records."""
    sums = dict.fromkeys(STAGE_SECONDS, 0.0)
    for r in records:
        st = r.get("stage_times") or {}
        for key in STAGE_SECONDS:
            value = st.get(key)
            if isinstance(value, int | float):
                sums[key] += float(value)
    return {k: round(v, 2) for k, v in sums.items()}


def suite_window(records: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The wall-clock window the records span: the first stage's start to the last stage's end."""
    starts = [s[0] for r in records for _, s in _every_span(r)]
    ends = [s[1] for r in records for _, s in _every_span(r)]
    return (min(starts), max(ends)) if starts else None


def gpu_busy(records: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Each GPU's busy seconds and share of [start, end], and the mean share over the GPUs."""
    by_gpu: dict[str, list[list[float]]] = defaultdict(list)
    for r in records:
        gpu = gpu_of(r)
        by_gpu[gpu]  # a GPU whose records never reached a GPU stage is a GPU idle all along
        by_gpu[gpu].extend(span for stage, span in _every_span(r) if stage in GPU_STAGES)
    wall = max(end - start, 0.0)
    per_gpu = {}
    for gpu, spans in sorted(by_gpu.items()):
        busy = union_s(spans, start, end)
        per_gpu[gpu] = {"busy_s": round(busy, 2), "share": round(busy / wall, 3) if wall else None}
    shares = [g["share"] for g in per_gpu.values() if g["share"] is not None]
    return {"per_gpu": per_gpu, "share": round(statistics.mean(shares), 3) if shares else None}


def waits(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The builds' waits for a builder, and the GPUs' waits for a build."""
    waited = []
    gpu_waited = []
    for r in records:
        ex = _executor(r)
        pre = ex.get("prebuild")
        if isinstance(pre, dict) and isinstance(pre.get("waited_s"), int | float):
            waited.append(float(pre["waited_s"]))
        if isinstance(ex.get("gpu_waited_for_build_s"), int | float):
            gpu_waited.append(float(ex["gpu_waited_for_build_s"]))
    return {
        "builds_waited_for_a_builder_s": round(sum(waited), 2) if waited else None,
        "builds_prebuilt": len(waited),
        "gpu_waited_for_builds_s": round(sum(gpu_waited), 2) if gpu_waited else None,
    }


def startup_on_path(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The start-up an evaluation waited for: the wait for a spare still starting (`spare_wait_s`,
    the warm pool's) and its `startup` span, from its job handed over to its runner's first stage.
    `stage_times.startup_s` is the runner's own import time, which a spare
    started ahead (warm_pool.py) spent before the evaluation needed it."""
    waits = []
    for r in records:
        spans = _spans(r)
        spare_wait = (r.get("metadata") or {}).get("spare_wait_s")
        wait = float(spare_wait) if isinstance(spare_wait, int | float) else 0.0
        if "startup" in spans:
            wait += spans["startup"][1] - spans["startup"][0]
        if "startup" in spans or wait:
            waits.append(wait)
    return {
        "sum_s": round(sum(waits), 2) if waits else None,
        "max_s": round(max(waits), 2) if waits else None,
        "over_1s": sum(1 for w in waits if w > 1.0),
    }


def record_latency(records: list[dict[str, Any]]) -> dict[str, Any]:
    """From each evaluation's last stage end to its record written (`_written`: the file's mtime)."""
    gaps = []
    for r in records:
        spans = _spans(r)
        written = r.get("_written")
        if spans and isinstance(written, int | float):
            gaps.append(max(0.0, float(written) - max(s[1] for s in spans.values())))
    return {
        "sum_s": round(sum(gaps), 2) if gaps else None,
        "median_s": round(statistics.median(gaps), 3) if gaps else None,
    }


def account(
    records: list[dict[str, Any]], wall_s: float | None = None, started_at: float | None = None
) -> dict[str, Any]:
    """Where the wall went: `wall_s` (the suite's own) from `started_at` (seconds since the epoch),
    else the window the records span."""
    window = suite_window(records)
    if started_at is not None and wall_s is not None:
        start, end = started_at, started_at + wall_s
    elif window is not None:
        start, end = window
    else:
        start = end = 0.0
    wall = wall_s if wall_s is not None else end - start
    n = len(records)
    return {
        "wall_s": round(wall, 2),
        "problems": n,
        "wall_per_problem_s": round(wall / n, 3) if n and wall else None,
        "stage_sum_s": stage_sums(records),
        "startup_on_path": startup_on_path(records),
        "gpu_busy": gpu_busy(records, start, end) if window is not None else {"per_gpu": {}, "share": None},
        **waits(records),
        "record_latency": record_latency(records),
    }
