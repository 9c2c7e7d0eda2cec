"""Suite runs made with `--draws N` set against runs made with one draw, on the same pairs.

Reads the kernelwright rows `timer_agreement.py kernelwright` writes (kw-NAME.jsonl: one record a pair, with
`draws` where the run had more than one) and, where given, each run's suite summary (suite-NAME.json,
benchmarks/corpus_suite.py). Writes a markdown page:
  - each run's record of each pair, its draws in the order they ran, how far apart they were, each draw's seconds;
  - run to run: max/min - 1 of a pair's recorded speed-ups over the runs with draws, beside the same pairs'
    over the runs with one draw (trusted in every run: core/record.py; at least two runs a side);
  - what a problem cost: the suite's wall over the problems it recorded, and its GPU's busy share;
  - the waits between one draw's end and the next one's start (their stage spans): the later draws' children
    starting up where none was ready;
  - within each run, how far apart a pair's draws lay, and each stage's seconds by the draw's place (first,
    second, ...): a stage that is slower in some places than in others ran beside something those did not
    (a spare starting up, say).

    python3 benchmarks/draws_runs.py --draws DIR/kw-b20.jsonl --draws DIR/kw-b21.jsonl \
        --single DIR/kw-b16.jsonl --single DIR/kw-b17.jsonl --suite DIR/suite-b20.json --out draws.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.timer_agreement import _trusted  # noqa: E402
from kernelwright.suites.accounting import span_map  # noqa: E402


def load(path: Path) -> dict[str, dict]:
    """A run's rows by pair (the last row of a pair stands)."""
    return {(r := json.loads(line))["pair"]: r for line in path.read_text().splitlines() if line.strip()}


def run_name(path: Path) -> str:
    return path.stem.removeprefix("kw-").removeprefix("suite-")


def spread(values: list[float]) -> float | None:
    return max(values) / min(values) - 1 if len(values) >= 2 else None


def run_to_run(runs: dict[str, dict[str, dict]], pair: str) -> float | None:
    """max/min - 1 of the pair's speed-ups over the runs where it was trusted; None unless it was
    trusted in every run that recorded it, and in two or more."""
    rows = [run[pair] for run in runs.values() if pair in run]
    if len(rows) < 2 or not all(_trusted(r) for r in rows):
        return None
    return spread([float(r["speedup"]) for r in rows])


def waits(run: dict[str, dict]) -> tuple[list[float], list[float]]:
    """Seconds from a draw's end to the next one's start over a run's pairs (each draw's stage spans:
    [start, end] on the wall clock): those after the first draw, and those between the later ones."""
    first: list[float] = []
    later: list[float] = []
    for r in run.values():
        each = [span_map(e.get("spans")) for e in (r.get("draws") or {}).get("each") or []]
        edges = [(min(v[0] for v in sp.values()), max(v[1] for v in sp.values())) for sp in each if sp]
        gaps = [b[0] - a[1] for a, b in zip(edges, edges[1:], strict=False)]
        first += gaps[:1]
        later += gaps[1:]
    return first, later


STAGES = ("build", "correctness", "timing")


def by_place(run: dict[str, dict]) -> tuple[list[float], dict[str, list[list[float]]]]:
    """A run's pairs whose every draw passed: how far apart each pair's draws lay (max/min - 1), and each
    stage's seconds (`STAGES`, from its span) by the draw's place, one list a place."""
    apart: list[float] = []
    seconds: dict[str, list[list[float]]] = {stage: [] for stage in STAGES}
    for r in run.values():
        each = (r.get("draws") or {}).get("each") or []
        if len(each) < 2 or any(e.get("status") != "passed" or not e.get("speedup") for e in each):
            continue
        apart.append(spread([float(e["speedup"]) for e in each]) or 0.0)
        for place, e in enumerate(each):
            spans = span_map(e.get("spans"))
            for stage in STAGES:
                if stage in spans:
                    lists = seconds[stage]
                    lists.extend([] for _ in range(place + 1 - len(lists)))
                    lists[place].append(spans[stage][1] - spans[stage][0])
    return apart, seconds


def _medians(lists: list[list[float]]) -> str:
    return " ".join(f"{statistics.median(v):.2f}" if v else "-" for v in lists)


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = sorted(values)
    return {
        "n": len(v),
        "median": round(statistics.median(v), 4),
        "p90": round(v[min(len(v) - 1, math.ceil(0.9 * len(v)) - 1)], 4),
        "max": round(v[-1], 4),
    }


def _waits(w: list[float]) -> dict:
    return {"n": len(w), "median": round(statistics.median(w), 2), "max": round(max(w), 2)} if w else {"n": 0}


def _waits_cell(w: list[float]) -> str:
    return f"{len(w)}, {statistics.median(w):.2f}, {max(w):.2f}" if w else "0"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def page(
    draws: dict[str, dict[str, dict]], single: dict[str, dict[str, dict]], suites: dict[str, dict]
) -> tuple[str, dict]:
    pairs = sorted({p for run in draws.values() for p in run})
    lines = [
        "# Runs with draws against runs with one",
        "",
        "Each run's record (the median draw's speed-up), its draws in the order they ran, how far apart they were"
        " (max/min - 1), and each draw's seconds.",
        "",
        "| pair | run | verdict | record | draws | apart | seconds a draw | flags |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        for name, run in draws.items():
            if pair not in run:
                continue
            r = run[pair]
            each = (r.get("draws") or {}).get("each") or []
            speedups = [float(e["speedup"]) for e in each if e.get("speedup")]
            record = f"{r['speedup']:.3f}" if r.get("speedup") else ""
            cells = [
                pair,
                name,
                r["status"],
                record,
                " ".join(f"{s:.3f}" for s in speedups),
                _pct(spread(speedups)),
                " ".join(f"{e.get('total_s') or 0:.1f}" for e in each),
                ", ".join(r.get("flags") or []),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    rows = []
    for pair in pairs:
        with_draws, with_one = run_to_run(draws, pair), run_to_run(single, pair)
        if with_draws is not None:
            rows.append((pair, with_draws, with_one))
    both = [r for r in rows if r[2] is not None]
    result = {
        "with_draws": summary([r[1] for r in rows]),
        "same_pairs_with_draws": summary([r[1] for r in both]),
        "same_pairs_one_draw": summary([r[2] for r in both]),
        "cost": {},
    }
    lines += [
        "",
        "## Run to run",
        "",
        f"max/min - 1 of a pair's record over the runs with draws ({', '.join(draws)}) and over those with one"
        f" ({', '.join(single) or 'none given'}); pairs trusted in every run that recorded them, in two or more.",
        "",
        "| pair | runs with draws | runs with one draw |",
        "|---|---|---|",
        *(f"| {p} | {_pct(d)} | {_pct(o)} |" for p, d, o in rows),
        "",
        "| over | n | median | p90 | largest |",
        "|---|---|---|---|---|",
    ]
    for label, key in (
        ("every pair, runs with draws", "with_draws"),
        ("pairs in both, runs with draws", "same_pairs_with_draws"),
        ("pairs in both, runs with one draw", "same_pairs_one_draw"),
    ):
        s = result[key]
        if s["n"]:
            lines.append(f"| {label} | {s['n']} | {s['median']:.1%} | {s['p90']:.1%} | {s['max']:.1%} |")
    lines += [
        "",
        "## Waits between draws",
        "",
        "From a draw's end to the next one's start: after the first draw (the later draws' children start up where none"
        " was ready), and between the later draws.",
        "",
        "| run | after the first: n, median, largest (s) | between the later: n, median, largest (s) |",
        "|---|---|---|",
    ]
    result["waits_s"] = {}
    for name, run in draws.items():
        first, later = waits(run)
        if first:
            result["waits_s"][name] = {"after_first": _waits(first), "between_later": _waits(later)}
            lines.append(f"| {name} | {_waits_cell(first)} | {_waits_cell(later)} |")
    lines += [
        "",
        "## Draws within a run",
        "",
        "Pairs whose every draw passed: how far apart their draws lay (max/min - 1), and each stage's median seconds"
        " by the draw's place (first, second, ...).",
        "",
        "| run | pairs | apart: median, p90 | " + " | ".join(f"{stage} (s)" for stage in STAGES) + " |",
        "|---|---|---|" + "---|" * len(STAGES),
    ]
    result["within"] = {}
    for name, run in draws.items():
        apart, seconds = by_place(run)
        if not apart:
            continue
        s = summary(apart)
        result["within"][name] = {
            "apart": s,
            "seconds_by_place": {
                stage: [round(statistics.median(v), 3) if v else None for v in seconds[stage]] for stage in STAGES
            },
        }
        lines.append(
            f"| {name} | {s['n']} | {s['median']:.1%}, {s['p90']:.1%} | "
            + " | ".join(_medians(seconds[stage]) for stage in STAGES)
            + " |"
        )
    if suites:
        lines += ["", "## Cost", "", "| run | problems | wall a problem (s) | GPU busy |", "|---|---|---|---|"]
        for name, s in suites.items():
            acc = s.get("accounting") or {}
            result["cost"][name] = {
                "problems": acc.get("problems"),
                "wall_per_problem_s": acc.get("wall_per_problem_s"),
            }
            lines.append(
                f"| {name} | {acc.get('problems')} | {acc.get('wall_per_problem_s')} | {s.get('gpu_busy_share')} |"
            )
    return "\n".join(lines) + "\n", result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=Path, action="append", required=True, help="a kw-NAME.jsonl of a run with draws")
    ap.add_argument("--single", type=Path, action="append", default=[], help="a kw-NAME.jsonl of a run with one draw")
    ap.add_argument("--suite", type=Path, action="append", default=[], help="a run's suite-NAME.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--header", default="", help="a line above the page: how the runs were made")
    args = ap.parse_args()
    for path in [*args.draws, *args.single, *args.suite]:
        if not path.is_file():
            print(
                f"draws_runs: no file {path}: give the rows timer_agreement.py wrote (kw-NAME.jsonl)", file=sys.stderr
            )
            return 2
    text, result = page(
        {run_name(p): load(p) for p in args.draws},
        {run_name(p): load(p) for p in args.single},
        {run_name(p): json.loads(p.read_text()) for p in args.suite},
    )
    args.out.write_text((f"<!-- {args.header} -->\n" if args.header else "") + text)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
