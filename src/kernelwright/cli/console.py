"""Rendering records for people: a readable summary of one evaluation (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kernelwright.core.record import EvalResult, Status

_STYLE = {
    Status.PASSED: "bold green",
    Status.INCORRECT: "bold yellow",
}


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1e3:.1f} us" if v < 1 else f"{v:.3f} ms")


def render_result(result: EvalResult, console: Console, evidence: bool = False) -> None:
    """The verdict, timings and stages; with `evidence`, also the hardware evidence the Judge reads."""
    style = _STYLE.get(result.status, "bold red")
    head = f"[{style}]{result.status.value}[/]"
    if result.error_stage and result.status is not Status.PASSED:
        head += f" in stage [bold]{result.error_stage.value}[/]"
    head += f"  on {result.device or '?'}"
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    if result.speedup is not None:
        table.add_row("speedup", f"[bold]{result.speedup:.3f}x[/] (reference / candidate, medians, side by side)")
        table.add_row("candidate", _timing_line(result.candidate_ms, result.candidate_timing))
        table.add_row("reference", _timing_line(result.reference_ms, result.reference_timing))
        if result.compile_reference_ms is not None:
            table.add_row("torch.compile", f"{_ms(result.compile_reference_ms)} ({result.speedup_vs_compile:.3f}x)")
    for flag in ("timing_unstable", "degenerate_reference"):  # [verdicts] figures not to be trusted
        if flag in result.flags():
            table.add_row(flag, f"[yellow]{result.flags()[flag]}[/]")
    if result.max_abs_err is not None:
        table.add_row("max_abs_err", f"{result.max_abs_err:.3e}  mean {result.mean_abs_err:.3e}  "
                      f"({len(result.trials)} trials, atol={result.atol}, rtol={result.rtol})")
    st = result.stage_times
    stages = [(k, getattr(st, f"{k}_s")) for k in ("startup", "build", "init", "correctness", "timing", "profile")]
    table.add_row("stages", "  ".join(f"{k} {v:.2f}s" for k, v in stages if v is not None)
                  + (f"  total {st.total_s:.2f}s" if st.total_s is not None else ""))
    table.add_row("sandbox", result.sandbox)
    console.print(Panel(table, title=head, title_align="left", expand=False))
    if evidence and result.status is Status.PASSED:
        from kernelwright.loop.judge_evidence import render_for_judge

        text = render_for_judge(result)
        if text.strip():
            console.print(Panel(Text(text.rstrip()), title="hardware evidence", title_align="left", expand=False))
    if result.status is not Status.PASSED and result.error_log:
        console.print(Panel(Text(result.error_log.rstrip()), title="error log", title_align="left",
                            border_style="red", expand=False))


def _timing_line(median: float | None, stats) -> str:
    if stats is None:
        return _ms(median)
    return (f"{_ms(median)} median  (p10 {_ms(stats.p10_ms)}, p90 {_ms(stats.p90_ms)}; "
            f"{stats.iterations} iters, {stats.warmup} warm-up, {stats.clock}"
            f"{', cache flushed' if stats.l2_flush else ''})")


# ---- the forge loop ---------------------------------------------------------------------------

_VERDICT_STYLE = {"passed": "green", "incorrect": "yellow", "format_error": "magenta"}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


class LoopProgress:
    """Live progress of `kernelwright optimize`: a status line (round, stage, best speedup so far)
    and one printed line per finished round."""

    def __init__(self, console: Console, rounds: int):
        self.console, self.rounds = console, rounds
        self.status = console.status("starting…")

    def __enter__(self) -> "LoopProgress":
        self.status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.status.__exit__(*exc)

    def update(self, p) -> None:  # p: kernelwright.loop.Progress
        best = f"  best {_x(p.best_speedup)}" if p.best_speedup is not None else ""
        if p.stage == "done":
            style = _VERDICT_STYLE.get(p.verdict or "", "red")
            speed = f" {_x(p.speedup)}" if p.speedup is not None else ""
            self.console.print(f"round {p.round + 1}/{self.rounds}: [{style}]{p.verdict}[/]{speed}{best}",
                               highlight=False)
        else:
            self.status.update(f"round {p.round + 1}/{self.rounds}: {p.stage}…{best}")


def _expectation(r: dict) -> str:
    """"1.50x, got 1.10x: missed": the Judge's expected speedup over the candidate it reviewed, and this round's."""
    outcome = r.get("expectation_outcome")
    if not outcome:
        return "-"
    got = r.get("measured_over_baseline")
    return f"{_x(r.get('expected_speedup'))}, got {_x(got)}: {outcome}" if got is not None else outcome


def render_run(summary: dict, run_dir, console: Console) -> None:
    """The end of a run: every round's verdict, the best candidate, tokens and cost."""
    table = Table(title=f"run {run_dir}", title_justify="left")
    for col in ("round", "kind", "verdict", "speedup", "Judge expected", "tokens", "folder"):
        table.add_column(col)
    best_round = summary["best"]["round"] if summary.get("best") else None
    for r in summary["rounds"]:
        style = _VERDICT_STYLE.get(r["verdict"], "red")
        mark = " ★" if r["round"] == best_round else ""
        table.add_row(str(r["round"]), r["kind"], f"[{style}]{r['verdict']}[/]", _x(r["speedup"]) + mark,
                      _expectation(r), str(r["tokens"]), r["dir"] or "-")
    console.print(table)
    best = summary.get("best")
    if best:
        times = (f" ({best['candidate_ms']:.4g} ms vs {best['reference_ms']:.4g} ms on {best['device']})"
                 if best.get("candidate_ms") is not None and best.get("reference_ms") is not None else "")
        console.print(f"best: [bold green]{_x(best['speedup'])}[/] from round {best['round']}{times} "
                      f"→ {run_dir}/{best['file']}", highlight=False)
    else:
        console.print("[yellow]no correct candidate found[/]")
    cost = f"${summary['cost_usd']:.4f}" + (f" (+{summary['unpriced_calls']} calls with no known price)"
                                            if summary["unpriced_calls"] else "")
    console.print(f"stopped: {summary['stop_reason']}; tokens {summary['tokens']['total']}, cost {cost}, "
                  f"{summary['wall_s']:.0f} s", highlight=False)
