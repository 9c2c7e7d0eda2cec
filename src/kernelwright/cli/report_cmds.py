"""`kernelwright report` (metrics; an HTML page, JSON and CSV exports) and `kernelwright runs`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _x(v) -> str:
    return "-" if v is None else f"{v:.3f}x"


def render_metrics(m, console: Console, title: str) -> None:
    """The numbers people ask for first: correctness, fast_p, speed-ups, verdict mix, cost."""
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(style="dim")
    t.add_column()
    t.add_row("problems", f"{m.problems}" + (f" (+{len(m.degenerate)} degenerate, counted apart: {', '.join(m.degenerate)})"
                                             if m.degenerate else ""))
    t.add_row("correct", f"{m.correct} ({m.correctness_rate:.1%})")
    t.add_row("fast_p", "  ".join(f"fast_{p} {v:.1%}" for p, v in m.fast_p.items()))
    t.add_row("speed-up (correct)", f"geomean {_x(m.geomean_speedup)}, mean {_x(m.mean_speedup)}")
    if m.geomean_speedup_vs_compile is not None:
        t.add_row("over torch.compile", f"geomean {_x(m.geomean_speedup_vs_compile)}, mean {_x(m.mean_speedup_vs_compile)}")
    t.add_row("verdicts", "  ".join(f"{v} {n}" for v, n in m.verdict_mix.items()))
    cost = "-" if m.cost_per_problem is None else f"${m.cost_per_problem:.4f}"
    wall = "-" if m.wall_s_per_problem is None else f"{m.wall_s_per_problem:.1f} s"
    t.add_row("per problem", f"tokens {m.tokens_per_problem:.0f}, cost {cost}, wall {wall}")
    console.print(t)


def report_cmd(
    target: str = typer.Argument(..., metavar="RUN_OR_SUITE", help="A suite's name, or a run directory."),
    store: Path = typer.Option(None, help="Run store (default: runs/kernelwright.db)."),
    html: Path = typer.Option(None, "--html", help="Write one self-contained HTML page here."),
    json_out: Path = typer.Option(None, "--json", help="Write the report's data as JSON here."),
    csv_out: Path = typer.Option(None, "--csv", help="Write one row per problem as CSV here."),
) -> None:
    """Metrics of a run or a suite (fast_p, correctness, speed-ups, verdicts), as a page or exports."""
    from kernelwright.report import data as report_data
    from kernelwright.store.api import DEFAULT_STORE, RunStore
    from kernelwright.store.db import Store, StoreError
    from kernelwright.store.indexer import index_run
    from kernelwright.suites.metrics import ProblemOutcome, summarize

    store_path = store or DEFAULT_STORE
    try:
        as_dir = Path(target)
        if as_dir.is_dir() and (as_dir / "run.json").is_file():  # a run directory: (re)index it first
            with Store.open(store_path) as db:
                target = index_run(db, as_dir)
        db = RunStore(Store.open(store_path, readonly=True))
        with db:
            if db.suite(target) is None and db.run(target) is None:
                raise StoreError(f"no suite or run named {target!r} in {store_path}; `kernelwright runs` lists them")
            data = report_data.build(db, target)
            outcomes = [ProblemOutcome(**r) for r in db.problems(target)]
    except StoreError as exc:
        _fail(str(exc))
        return
    render_metrics(summarize(outcomes), Console(), title=f"{data['kind']} {target}")
    try:
        if html:
            from kernelwright.report.html import render

            html.write_text(render(data))
            err.print(f"wrote {html}", highlight=False)
        if json_out:
            json_out.write_text(report_data.to_json(data))
            err.print(f"wrote {json_out}", highlight=False)
        if csv_out:
            csv_out.write_text(report_data.to_csv(data))
            err.print(f"wrote {csv_out}", highlight=False)
    except OSError as exc:
        _fail(f"cannot write the report ({exc.strerror}: {exc.filename}); pass a writable path")


def runs_cmd(
    store: Path = typer.Option(None, help="Run store (default: runs/kernelwright.db)."),
    suite: str = typer.Option(None, help="Only this suite's runs."),
) -> None:
    """List the runs in the store with their best results (and the suites they belong to)."""
    from kernelwright.store.api import DEFAULT_STORE, open_store
    from kernelwright.store.db import StoreError

    try:
        db = open_store(store or DEFAULT_STORE)
    except StoreError as exc:
        _fail(str(exc))
        return
    with db:
        rows = db.runs(suite=suite)
        suites = {s["id"]: s for s in db.suites()}
    t = Table(title=f"{len(rows)} runs in {store or DEFAULT_STORE}", title_justify="left")
    for col in ("suite", "problem", "kind", "state", "rounds", "best", "round", "tokens"):
        t.add_column(col, no_wrap=col in ("problem", "best"))
    t.add_column("run directory", overflow="fold")
    for r in rows:
        t.add_row(r["suite_id"] or "-", (f"{r['level']}/" if r["level"] else "") + r["problem"], r["kind"], r["state"],
                  str(r["rounds_run"]), _x(r["best_speedup"]), "-" if r["best_round"] is None else str(r["best_round"]),
                  str(r["tokens"]), r["run_dir"])
    Console().print(t)
    if suites and suite is None:
        Console().print("suites: " + ", ".join(f"{k} ({v['kind']})" for k, v in suites.items()), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("runs")(runs_cmd)
