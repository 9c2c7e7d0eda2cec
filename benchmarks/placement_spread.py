"""How far where the driver places a side's memory moves its `do_bench` figure, on an outside corpus,
and whether kernelwright's speed-up lies within the independent timer's own spread.

A plain process's `do_bench` figure is one draw of address layout: in a fresh process, 64 MiB of
address space reserved before the model is built (no memory behind it) moved level1/77's candidate
from 1.30 to 1.42 ms, and the same allocations in another order moved level2/61's reference from 0.287
to 0.340 ms (benchmarks/first_call_draws.py, docs/PERFORMANCE.md). Where the layout moves a side,
no harness's figure is the kernel's speed, and one harness agreeing with another says only that
they lay memory out alike.

Each side of the pairs of `timer_agreement.py independent` is timed again, by `do_bench` alone, once
for each of PLACEMENTS, each in a process of its own (forked from one that imported torch, as the
independent timers' sides are: a candidate's second instance in one process is not the same kernel
where it keeps state), with that placement's hold taken before anything of the side's:

- `plain`: none (the plain draw again, on this machine and in this run: a small problem's `do_bench`
  figure moves between runs: level2/22's reference read 0.092 and 0.272 ms on two H200 machines);
- `shift_2mb`, `shift_64mb`: that much device memory taken through the caching allocator, kept;
- `va_64mb`: only 64 MiB of address space reserved (cuMemAddressReserve), kept; no memory behind it.

`report` joins them with kernelwright's records (kw-NAME.jsonl) on the pairs of independent.jsonl
(whose `do_bench` stands in as the plain draw where this run has none): per side the spread over the
draws (max/min - 1); per pair the independent speed-up
as the median of the reference's draws over the median of the candidate's, and its range (the
quickest reference draw over the slowest candidate draw, and the other way); kernelwright's speed-up
against that median, and whether it lies within the range (widened by IN_RANGE_SLACK).

    python3 benchmarks/placement_spread.py run CORPUS --pairs-from DIR/independent.jsonl --out DIR --gpus 2 \\
        --build-jobs 16   # or: bash scripts/device_checks.sh placements (carry .corpus .agree)
    python3 benchmarks/placement_spread.py report DIR --name b13 --name b14

`run` appends a JSON line per pair and placement to DIR/placements.jsonl (a later run goes on where
an earlier one stopped); `report` writes DIR/placements.md and DIR/placements.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root, for `benchmarks.timer_agreement`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import timer_agreement as ta
from benchmarks.timer_agreement import PLACEMENTS

IN_RANGE_SLACK = 0.03  # a speed-up this close to the independent range's ends counts as within it
SENSITIVE = 0.05  # a side whose draws spread more than this is moved by where its memory lies


def run(
    chosen: list[tuple[str, Path, Path]],
    out: Path,
    device: str,
    timeout: float,
    gpus: int,
    limit_s: float,
    build_jobs: int = 0,
) -> None:
    """On each GPU its share of the pairs (every draw of a pair on one GPU), pair by pair and placement
    by placement: the reference, then the candidate, each in a process of its own. Candidates that
    build an extension are built first (`build_jobs` at a time, as `timer_agreement.py independent`
    builds them, into KW_EXT_ROOT; 0: found built there); those whose build fails are not timed.
    Stops sending work at `limit_s`; rows land as they come."""
    t0 = time.monotonic()
    ext_root = Path(os.environ.get("KW_EXT_ROOT", "/tmp/kw-agreement-ext"))
    devs: list[str | None] = [str(g) for g in range(gpus)] if gpus > 1 else [None]
    if build_jobs:
        skip = ta.prebuild(chosen, ext_root, devs, build_jobs, limit_s * 0.45)
        chosen = [c for c in chosen if c[0] not in skip]
    dest = out / "placements.jsonl"
    done = set()
    if dest.exists():
        done = {(r["pair"], r["placement"]) for x in dest.read_text().splitlines() if (r := json.loads(x))}
    todo = [(c, p) for c in chosen for p in PLACEMENTS if (c[0], p) not in done]

    def row_of(server: ta.SideServer, gpu: str | None, item: tuple) -> dict:
        (stem, problem, cand), placement = item
        row: dict = {"pair": stem, "placement": placement, "gpu": gpu}
        for side, cls, source, ext in (
            ("reference", "Model", problem, ext_root / "_references"),
            ("candidate", "ModelNew", cand, Path(ta._ext_dir(ext_root, cand))),
        ):
            row[side] = server.run(ta.side_job(cls, device, problem, source, ext, timeout, placement=placement))[0]
        return row

    ta.over_gpus(devs, todo, row_of, dest, t0 + limit_s, group=lambda item: item[0][0])  # a pair on one GPU


def plain_draw(ind_row: dict, placed: list[dict], side: str) -> float | None:
    """A side's plain draw: this run's, else independent.jsonl's."""
    ms = [r.get(side, {}).get("do_bench_ms") for r in placed if r["placement"] == "plain"]
    ms += [ind_row.get(side, {}).get("do_bench_ms")]
    return next((float(x) for x in ms if x), None)


def draws(ind_row: dict, placed: list[dict], side: str) -> list[float]:
    """A side's `do_bench` draws: the plain one (`plain_draw`), then each other placement's."""
    ms = [plain_draw(ind_row, placed, side)]
    ms += [r.get(side, {}).get("do_bench_ms") for r in placed if r["placement"] != "plain"]
    return [float(x) for x in ms if x]


def pair_figures(ind_row: dict, placed: list[dict]) -> dict | None:
    """The independent speed-up over the draws (median over median) and its range; None without
    two draws of each side."""
    ref, cand = draws(ind_row, placed, "reference"), draws(ind_row, placed, "candidate")
    if len(ref) < 2 or len(cand) < 2:
        return None
    return {
        "speedup": statistics.median(ref) / statistics.median(cand),
        "range": [min(ref) / max(cand), max(ref) / min(cand)],
        "spread": {"reference": max(ref) / min(ref) - 1, "candidate": max(cand) / min(cand) - 1},
        "draws": {"reference": len(ref), "candidate": len(cand)},
    }


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def report(out: Path, names: list[str]) -> dict:
    ind = {r["pair"]: r for x in (out / "independent.jsonl").read_text().splitlines() if (r := json.loads(x))}
    placed: dict[str, list[dict]] = {}
    for x in (out / "placements.jsonl").read_text().splitlines():
        r = json.loads(x)
        placed.setdefault(r["pair"], []).append(r)
    runs: dict[str, dict] = {}
    for name in names:
        for x in (out / f"kw-{name}.jsonl").read_text().splitlines():
            k = json.loads(x)
            if k["status"] == "passed" and k["pair"] in ind:
                runs.setdefault(k["pair"], {})[name] = k
    rows, moved = [], []
    for pair in sorted(set(runs) & set(placed)):
        fig = pair_figures(ind[pair], placed[pair])
        sp = [x for k in runs[pair].values() if (x := ta._recorded(k))]
        if fig is None or not sp:
            continue
        kw = statistics.median(sp)
        lo, hi = fig["range"]
        row = {
            "pair": pair,
            "kw": kw,
            "plain": _over(
                plain_draw(ind[pair], placed[pair], "reference"), plain_draw(ind[pair], placed[pair], "candidate")
            ),
            **fig,
            "within_range": lo * (1 - IN_RANGE_SLACK) <= kw <= hi * (1 + IN_RANGE_SLACK),
            "trusted": all(ta._trusted(k) for k in runs[pair].values()),
            "small": (ind[pair].get("reference", {}).get("do_bench_ms") or 0.0) < ta.SMALL_MS,
            "flags": sorted({f for k in runs[pair].values() for f in k["flags"]}),
        }
        rows.append(row)
        moved += [(pair, s, v) for s, v in fig["spread"].items() if v > SENSITIVE]
    groups = {
        "trusted": [r for r in rows if r["trusted"]],
        f"trusted, reference {ta.SMALL_MS} ms or more": [r for r in rows if r["trusted"] and not r["small"]],
    }
    result: dict = {"pairs": rows, "moved_sides": [{"pair": p, "side": s, "spread": v} for p, s, v in moved]}
    lines = ["# Placement spread", ""]
    lines += [
        f"Each side's `do_bench` over {len(PLACEMENTS)} placements ({', '.join(PLACEMENTS)}), each in a"
        " process of its own. kernelwright's speed-up (the median of its runs) against the plain draw's and"
        f" against the draws' median; `in range`: within the draws' range, widened by {IN_RANGE_SLACK:.0%}.",
        "",
        "| pairs | against | n | geomean | median abs dev | within 5% | within 10% | beyond 25% | range | in range |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    result["groups"] = {}
    for label, rs in groups.items():
        for against, key in (("plain do_bench", "plain"), ("median of the draws", "speedup")):
            d = ta._dist([r["kw"] / r[key] for r in rs if r[key]])
            inside = sum(r["within_range"] for r in rs)
            result["groups"][f"{label}:{key}"] = {**d, "in_range": inside}
            if d["n"]:
                lines.append(
                    f"| {label} | {against} | {d['n']} | {d['geomean']} | {d['median_abs_dev']:.1%} |"
                    f" {d['within_5pct']} | {d['within_10pct']} | {d['beyond_25pct']} |"
                    f" {d['range'][0]}-{d['range'][1]} | {inside} |"
                )
    lines += ["", f"Sides whose draws spread over {SENSITIVE:.0%}: {len(moved)} of {2 * len(rows)}", ""]
    lines += ["| pair | kw | plain | median of draws | range | ref spread | cand spread | in range | flags |"]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        plain = f"{r['plain']:.3f}" if r["plain"] else "-"
        lines.append(
            f"| {r['pair']} | {r['kw']:.3f} | {plain} | {r['speedup']:.3f} | {r['range'][0]:.3f}-{r['range'][1]:.3f}"
            f" | {r['spread']['reference']:.1%} | {r['spread']['candidate']:.1%} |"
            f" {'yes' if r['within_range'] else 'no'} | {','.join(r['flags'])} |"
        )
    (out / "placements.md").write_text("\n".join(lines) + "\n")
    (out / "placements.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="time each side of the pairs under each placement")
    r.add_argument("corpus", type=Path)
    r.add_argument("--pairs-from", type=Path, required=True, help="the pairs with both sides in this independent.jsonl")
    r.add_argument("--levels", default="1,2")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--gpus", type=int, default=1)
    r.add_argument("--timeout", type=float, default=90.0)
    r.add_argument("--limit-s", type=float, default=480.0)
    r.add_argument("--build-jobs", type=int, default=0, help="build the extensions first, this many at once")
    p = sub.add_parser("report", help="join the draws with independent.jsonl and kernelwright's runs")
    p.add_argument("out", type=Path)
    p.add_argument("--name", action="append", default=[])
    args = ap.parse_args()
    if args.cmd == "report":
        missing = [f for f in ("independent.jsonl", "placements.jsonl") if not (args.out / f).exists()]
        missing += [f"kw-{n}.jsonl" for n in args.name if not (args.out / f"kw-{n}.jsonl").exists()]
        if missing or not args.name:
            print(f"placement_spread: {args.out} lacks {', '.join(missing) or 'a --name NAME'}", file=sys.stderr)
            return 2
        report(args.out, args.name)
        return 0
    if not args.device.startswith("cuda"):
        print(f"placement_spread: --device {args.device}: the placements are a GPU's; run it on one", file=sys.stderr)
        return 2
    if not args.pairs_from.exists():
        print(f"placement_spread: no {args.pairs_from}: run timer_agreement.py independent first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    levels = [v for v in args.levels.split(",") if v]
    chosen = [c for c in ta.pairs(args.corpus.resolve(), levels, None, False) if c[0] in ta._timed(args.pairs_from)]
    print(f"{len(chosen)} pairs, {len(PLACEMENTS)} placements", flush=True)
    run(chosen, args.out, args.device, args.timeout, args.gpus, args.limit_s, args.build_jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
