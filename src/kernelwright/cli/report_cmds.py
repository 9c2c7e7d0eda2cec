"""`kernelwright report` (metrics; an HTML page, JSON and CSV exports) and `kernelwright runs`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kernelwright.cli.console import out_console
from kernelwright.cli.help import STORE_HELP
from kernelwright.core.record import WITHHOLDING_FLAGS
from kernelwright.store.files import write_public

err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _x(v) -> str:
    return "-" if v is None else f"{v:.3f}x"


def render_metrics(m, console: Console, title: str, size_robust: bool = False) -> None:
    """The numbers people ask for first: correctness, fast_p, speed-ups, verdict mix, cost.
    `size_robust`: fast_p counts only kernels that hold at every size the shapes check tried."""
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(style="dim")
    t.add_column()
    t.add_row(
        "problems",
        f"{m.problems}"
        + (f" (+{len(m.degenerate)} degenerate, counted apart: {', '.join(m.degenerate)})" if m.degenerate else ""),
    )
    t.add_row("correct", f"{m.correct} ({m.correctness_rate:.1%})")
    t.add_row(
        "all sizes",
        f"{m.size_robust} of {m.correct} correct kernels hold at every size"
        f" ({m.size_specific} shape_specific, {m.size_unchecked} not checked)",
    )
    if size_robust:
        t.add_row("fast_p", "  ".join(f"fast_{p} {v:.1%}" for p, v in m.fast_p_size_robust.items()))
        t.add_row("", "fast_p counts only kernels that hold at every size")
        t.add_row("fast_p (any size)", "  ".join(f"fast_{p} {v:.1%}" for p, v in m.fast_p.items()))
    else:
        t.add_row("fast_p", "  ".join(f"fast_{p} {v:.1%}" for p, v in m.fast_p.items()))
    t.add_row("speed-up (correct)", f"geomean {_x(m.geomean_speedup)}, mean {_x(m.mean_speedup)}")
    withheld = getattr(m, "speedups_withheld", [])  # (a report's JSON written before the field: none)
    if withheld:
        t.add_row(
            "not trusted",
            f"{len(withheld)} speed-ups withheld ({', '.join(WITHHOLDING_FLAGS)}), counted as untimed: "
            + ", ".join(withheld),
        )
    if m.geomean_speedup_vs_compile is not None:
        t.add_row(
            "over torch.compile", f"geomean {_x(m.geomean_speedup_vs_compile)}, mean {_x(m.mean_speedup_vs_compile)}"
        )
    t.add_row("verdicts", "  ".join(f"{v} {n}" for v, n in m.verdict_mix.items()))
    cost = "-" if m.cost_per_problem is None else f"${m.cost_per_problem:.4f}"
    wall = "-" if m.wall_s_per_problem is None else f"{m.wall_s_per_problem:.1f} s"
    t.add_row("per problem", f"tokens {m.tokens_per_problem:.0f}, cost {cost}, wall {wall}")
    console.print(t)


def report_cmd(
    targets: list[str] = typer.Argument(
        ..., metavar="RUN_OR_SUITE...", help="A suite's name, or a run directory; two or more: side by side."
    ),
    store: Path = typer.Option(None, metavar="FILE", help=STORE_HELP),
    html: Path = typer.Option(None, "--html", metavar="FILE", help="Write one self-contained HTML page here."),
    json_out: Path = typer.Option(
        None,
        "--json",
        metavar="FILE",
        help="Write the report's data as JSON here; - prints it on stdout, and nothing else there.",
    ),
    csv_out: Path = typer.Option(
        None, "--csv", metavar="FILE", help="Write one row per problem as CSV here; - prints it on stdout."
    ),
    fast_p_size_robust: bool = typer.Option(
        False,
        "--fast-p-size-robust",
        help="fast_p (cards, levels, plot; side by side: its rows and curves) counts only kernels that hold"
        " at every size the shapes check tried (not flagged shape_specific, not unchecked); the page says so."
        " The JSON has both either way.",
    ),
) -> None:
    """Metrics of a run or a suite (fast_p, correctness, speed-ups, verdicts), as a page or exports;
    of several, side by side (a table per metric, and plots)."""
    from kernelwright.report import data as report_data
    from kernelwright.store.db import StoreError
    from kernelwright.store.queries import default_store

    store_path = store or default_store()
    to_stdout = str(json_out) == "-" or str(csv_out) == "-"
    if to_stdout and str(json_out) == str(csv_out):
        _fail("--json - and --csv - both print on stdout; write one of them to a file")
    try:
        datas = [_load(t, store_path, "size_robust" if fast_p_size_robust else "all") for t in targets]
    except StoreError as exc:
        _fail(str(exc))
        return
    if len(datas) == 1:
        from kernelwright.suites.metrics import ProblemOutcome, summarize

        data = datas[0]
        fields = set(ProblemOutcome.__dataclass_fields__)
        outcomes = [ProblemOutcome(**{k: v for k, v in p.items() if k in fields}) for p in data["problems"]]
        if not to_stdout:
            render_metrics(
                summarize(outcomes),
                out_console(),
                title=f"{data['kind']} {data['target']}",
                size_robust=fast_p_size_robust,
            )
        from kernelwright.report.html import render

        page = lambda: render(data)  # noqa: E731
        as_json, as_csv = (lambda: report_data.to_json(data)), (lambda: report_data.to_csv(data))
    else:
        from kernelwright.report import side_by_side as compare

        comp = compare.build_comparison(datas, size_robust=fast_p_size_robust)
        if not to_stdout:
            render_comparison(comp, out_console())
        page = lambda: compare.render_html(comp)  # noqa: E731
        as_json, as_csv = (lambda: report_data.to_json(comp)), (lambda: compare.to_csv(comp))
    try:
        if html:
            _export(html, page())
        if json_out:
            _export(json_out, as_json())
        if csv_out:
            _export(csv_out, as_csv())
    except OSError as exc:
        _fail(f"cannot write the report ({exc.strerror}: {exc.filename}); pass a writable path")


def _load(target: str, store_path: Path, fast_p_counts: str = "all") -> dict:
    """One suite's or run's report data; a run directory is (re)indexed first."""
    from kernelwright.report import data as report_data
    from kernelwright.store.db import Store, StoreError
    from kernelwright.store.indexer import index_run
    from kernelwright.store.queries import RunStore

    as_dir = Path(target)
    if as_dir.is_dir() and (as_dir / "run.json").is_file():  # a run directory: (re)index it first
        with Store.open(store_path) as db:
            target = index_run(db, as_dir)
    with RunStore(Store.open(store_path, readonly=True)) as db:
        if db.suite(target) is None and db.run(target) is None:
            raise StoreError(f"no suite or run named {target!r} in {store_path}; `kernelwright runs` lists them")
        return report_data.build(db, target, fast_p_counts)


def render_comparison(comp: dict, console: Console) -> None:
    """Suites or runs side by side: a row per metric, a column per target (the best in bold)."""
    from kernelwright.report.side_by_side import fmt

    t = Table(title="side by side (speed-ups over each problem's reference)", title_justify="left")
    t.add_column("metric", style="dim")
    for label in comp["labels"]:
        t.add_column(label, justify="right")
    for m in comp["metrics"]:
        t.add_row(
            m["metric"],
            *[
                f"[bold]{fmt(v, m['format'])}[/]" if i == m["best"] else fmt(v, m["format"])
                for i, v in enumerate(m["values"])
            ],
        )
    console.print(t)
    if comp.get("fast_p_counts") == "size_robust":
        console.print("fast_p counts only kernels that hold at every size", highlight=False, soft_wrap=True)
    speed = next(x for x in comp["tables"] if x["field"] == "speedup")
    p = Table(title="speed-up per problem", title_justify="left")
    p.add_column("problem")
    for label in comp["labels"]:
        p.add_column(label, justify="right")
    for r in speed["rows"]:
        p.add_row(
            r["problem"],
            *[f"[bold]{fmt(v, 'x')}[/]" if i == r["best"] else fmt(v, "x") for i, v in enumerate(r["values"])],
        )
    console.print(p)


def _export(path: Path, text: str) -> None:
    """`-`: stdout, nothing else there; a file: written whole (0644: a report holds no secret), said on stderr."""
    if str(path) == "-":
        sys.stdout.write(text)
        return
    write_public(path, text)
    err.print(f"wrote {path}", highlight=False, soft_wrap=True)


RUN_FIELDS = (
    "id",
    "suite_id",
    "kind",
    "problem",
    "level",
    "problem_path",
    "run_dir",
    "coder",
    "judge",
    "state",
    "stop_reason",
    "rounds_run",
    "best_round",
    "best_speedup",
    "tokens",
    "cost_usd",
    "wall_s",
    "started",
)


def runs_cmd(
    store: Path = typer.Option(None, metavar="FILE", help=STORE_HELP),
    suite: str = typer.Option(None, metavar="NAME", help="Only this suite's runs."),
    json_out: bool = typer.Option(
        False,
        "--json",
        metavar="",
        help="Print {store, runs: [...], suites: [...]} as JSON on stdout, and nothing else.",
    ),
) -> None:
    """List the runs in the store with their best results (and the suites they belong to)."""
    from kernelwright.store.db import StoreError
    from kernelwright.store.queries import default_store, open_store

    path = store or default_store()
    if store is None and not path.is_file():  # nothing run yet: an empty list, not an error
        rows, suites = [], {}
    else:
        try:
            db = open_store(path)
        except StoreError as exc:
            _fail(str(exc))
            return
        with db:
            rows = db.runs(suite=suite)
            suites = {s["id"]: s for s in db.suites()}
    if json_out:
        sys.stdout.write(
            json.dumps(
                {
                    "store": str(path),
                    "runs": [{k: r.get(k) for k in RUN_FIELDS} for r in rows],
                    "suites": [{k: v for k, v in s.items() if k != "info"} | {"id": k} for k, s in suites.items()],
                },
                indent=2,
            )
            + "\n"
        )
        return
    console = out_console()
    t = Table(title=f"{len(rows)} runs in {path}", title_justify="left")
    for col in ("suite", "problem", "kind", "state", "rounds", "best", "round", "tokens"):
        t.add_column(col, no_wrap=True)
    t.add_column("run directory", overflow="fold", min_width=20)
    for r in rows:
        t.add_row(
            r["suite_id"] or "-",
            (f"{r['level']}/" if r["level"] else "") + r["problem"],
            r["kind"],
            r["state"],
            str(r["rounds_run"]),
            _x(r["best_speedup"]),
            "-" if r["best_round"] is None else str(r["best_round"]),
            str(r["tokens"]),
            r["run_dir"],
        )
    console.print(t)
    if suites and suite is None:
        console.print(
            "suites: " + ", ".join(f"{k} ({v['kind']})" for k, v in suites.items()), highlight=False, soft_wrap=True
        )


def register(app: typer.Typer) -> None:
    from kernelwright.cli.help import PlainCommand

    app.command("report", cls=PlainCommand)(report_cmd)
    app.command("runs", cls=PlainCommand)(runs_cmd)
