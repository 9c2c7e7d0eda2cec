"""Rendering records for people: a readable summary of one evaluation (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kernelwright.result import EvalResult, Status

_STYLE = {
    Status.PASSED: "bold green",
    Status.INCORRECT: "bold yellow",
}


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1e3:.1f} us" if v < 1 else f"{v:.3f} ms")


def render_result(result: EvalResult, console: Console) -> None:
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
    if result.max_abs_err is not None:
        table.add_row("max_abs_err", f"{result.max_abs_err:.3e}  mean {result.mean_abs_err:.3e}  "
                      f"({len(result.trials)} trials, atol={result.atol}, rtol={result.rtol})")
    st = result.stage_times
    stages = [(k, getattr(st, f"{k}_s")) for k in ("startup", "build", "init", "correctness", "timing", "profile")]
    table.add_row("stages", "  ".join(f"{k} {v:.2f}s" for k, v in stages if v is not None)
                  + (f"  total {st.total_s:.2f}s" if st.total_s is not None else ""))
    table.add_row("sandbox", result.sandbox)
    console.print(Panel(table, title=head, title_align="left", expand=False))
    if result.status is not Status.PASSED and result.error_log:
        console.print(Panel(Text(result.error_log.rstrip()), title="error log", title_align="left",
                            border_style="red", expand=False))


def _timing_line(median: float | None, stats) -> str:
    if stats is None:
        return _ms(median)
    return (f"{_ms(median)} median  (p10 {_ms(stats.p10_ms)}, p90 {_ms(stats.p90_ms)}; "
            f"{stats.iterations} iters, {stats.warmup} warm-up, {stats.clock}"
            f"{', cache flushed' if stats.l2_flush else ''})")
