"""Rendering records for people (rich): one evaluation, the live progress of a run, a run's end.

Verbosity: 0 (`--quiet`) one line per command and no live progress; 1 (the default) the live
progress line and the summaries; 2 (`--verbose`) also every stage as it starts, with the time
elapsed, and each round's one-line record.
"""

from __future__ import annotations

import re
import time

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kernelwright.core.record import EvalResult, Status

QUIET, NORMAL, VERBOSE = 0, 1, 2

# Off a terminal (a pipe, a file, CI) nothing decides a width, and rich's default (80 columns) cuts
# table cells and wraps paths one character a line: there, tables are sized to their content.
_UNBOUNDED = 100_000


def out_console(stderr: bool = False) -> Console:
    """The console results are printed on: a terminal's own width; off a terminal, as wide as the
    content (no cut columns, no wrapped cells; a line is as long as it needs to be)."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=_UNBOUNDED)


_STYLE = {
    Status.PASSED: "bold green",
    Status.INCORRECT: "bold yellow",
}

# Error text that means "this candidate needs CUDA, and the device it ran on has none" (on a machine
# without CUDA its extension cannot build; with --device cpu on a GPU machine it builds, then refuses
# CPU tensors with the TORCH_CHECK a Coder usually writes).
_NEEDS_CUDA = re.compile(
    r"CUDA_HOME environment variable is not set|Torch not compiled with CUDA enabled|No CUDA GPUs are available|"
    r"Found no NVIDIA driver|no CUDA-capable device is detected|0 active drivers|"
    r"Cannot find a working triton installation|must be a CUDA\b[^\n]*tensor"
)


def device_problem(result: EvalResult) -> str | None:
    """One line when the candidate could not run on the device it was evaluated on (a CUDA
    candidate on a machine or a --device without CUDA), read from the record's error text; else None."""
    if result.status is Status.PASSED or not result.error_log:
        return None
    m = _NEEDS_CUDA.search(result.error_log)
    if not m or (result.device_type or "cpu") == "cuda":
        return None
    return (
        f"this candidate needs CUDA, which {result.device or 'the CPU'} does not have ({m.group(0)}); "
        f"run it with --device cuda on a GPU machine"
    )


def cold_build(result: EvalResult) -> str | None:
    """ "compiled 2 extensions not built on this machine before (58.2s)": a first build of new code,
    which a later run of the same code skips; None when every build came from the cache."""
    tb = result.metadata.get("trusted_build") or {}
    fresh = [b for b in tb.get("builds") or [] if isinstance(b, dict) and b.get("ok") and not b.get("cached")]
    if tb.get("remembered") or not fresh:
        return None
    n = len(fresh)
    return f"compiled {n} extension{'s' if n > 1 else ''} not built on this machine before ({tb.get('wall_s', 0):.1f}s)"


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1e3:.1f} us" if v < 1 else f"{v:.3f} ms")


def _clock(seconds: float) -> str:
    """12.3s, 4m05s, 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def result_line(result: EvalResult) -> str:
    """The evaluation in one line (what --quiet prints)."""
    line = result.summary_line()
    why = device_problem(result)
    if why:
        line = f"{result.status.value}" + (f" [{result.error_stage.value}]" if result.error_stage else "") + f": {why}"
    return line


class EvalProgress:
    """Live progress of one evaluation: the stage and the time elapsed (with --verbose, one printed
    line per stage); nothing at all when quiet."""

    def __init__(self, console: Console, verbosity: int = NORMAL):
        self.console, self.verbosity = console, verbosity
        self.started = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=verbosity == QUIET,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> EvalProgress:
        self.progress.__enter__()
        self.task = self.progress.add_task("evaluating…", total=None)
        return self

    @property
    def _task(self) -> TaskID:
        assert self.task is not None, "the display is used inside its `with` block"
        return self.task

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def stage(self, name: str) -> None:
        name = escape(name)  # a stage may name a candidate's extension: text, never markup
        self.progress.update(self._task, description=f"evaluating: {name}…")
        if self.verbosity >= VERBOSE:
            self.console.print(
                f"  {name}… (at {_clock(time.monotonic() - self.started)})", highlight=False, soft_wrap=True
            )


def render_result(result: EvalResult, console: Console, evidence: bool = False, verbosity: int = NORMAL) -> None:
    """The verdict, timings and stages; with `evidence` (or verbose), also the hardware evidence the
    Judge reads. Quiet: the one line of `result_line`."""
    if verbosity == QUIET:
        console.print(result_line(result), highlight=False, soft_wrap=True, markup=False)
        return
    why = device_problem(result)
    if why:
        console.print(f"[bold red]{escape(why)}[/]", highlight=False, soft_wrap=True)
    evidence = evidence or verbosity >= VERBOSE
    style = _STYLE.get(result.status, "bold red")
    head = f"[{style}]{result.status.value}[/]"
    if result.error_stage and result.status is not Status.PASSED:
        head += f" in stage [bold]{result.error_stage.value}[/]"
    if result.device:  # empty when the evaluation stopped before the device was reached
        head += f"  on {result.device}"
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    if result.speedup is not None:
        table.add_row("speedup", f"[bold]{result.speedup:.3f}x[/] (reference / candidate, medians, side by side)")
        table.add_row("candidate", _timing_line(result.candidate_ms, result.candidate_timing))
        table.add_row("reference", _timing_line(result.reference_ms, result.reference_timing))
        if result.compile_reference_ms is not None:
            table.add_row("torch.compile", f"{_ms(result.compile_reference_ms)} ({result.speedup_vs_compile:.3f}x)")
    drawn = draws_line(result)
    if drawn:
        table.add_row("draws", drawn)
    flags = [(f, result.flags()[f]) for f in ("timing_unstable", "degenerate_reference") if f in result.flags()]
    for flag, _ in flags:  # [verdicts] figures not to be trusted; the advice is printed whole below the panel
        table.add_row(flag, "[yellow]yes[/] (see below)")
    if result.max_abs_err is not None:
        table.add_row("max_abs_err", _errors_line(result))
    st = result.stage_times
    stages = [(k, getattr(st, f"{k}_s")) for k in ("startup", "build", "init", "correctness", "timing", "profile")]
    ran = "  ".join(f"{k} {v:.2f}s" for k, v in stages if v is not None) + (
        f"  total {st.total_s:.2f}s" if st.total_s is not None else ""
    )
    if ran.strip():  # a format_error is caught before any stage: no empty row
        cold = cold_build(result)
        table.add_row("stages", ran.strip() + (f"  (cold: {cold})" if cold else ""))
    if result.sandbox:
        table.add_row("sandbox", result.sandbox)
    console.print(Panel(table, title=head, title_align="left", expand=False))
    for flag, advice in flags:  # soft-wrapped by the terminal: never cut mid-word
        console.print(f"[yellow]{flag}:[/] {escape(str(advice))}", highlight=False, soft_wrap=True)
    if evidence and result.status is Status.PASSED:
        from kernelwright.loop.llm_judge_evidence import render_for_llm_judge

        text = render_for_llm_judge(result)
        if text.strip():
            console.print(Panel(Text(text.rstrip()), title="hardware evidence", title_align="left", expand=False))
    if result.status is not Status.PASSED and result.error_log:
        console.print(
            Panel(
                Text(result.error_log.rstrip()), title="error log", title_align="left", border_style="red", expand=False
            )
        )


def draws_line(result: EvalResult) -> str:
    """Where the evaluation ran as several draws (--draws): each one's speed-up, the record's marked."""
    d = result.metadata.get("draws")
    if not isinstance(d, dict) or not isinstance(d.get("each"), list):
        return ""
    chosen = d.get("chosen")
    shown = []
    for i, e in enumerate(d["each"], 1):
        e = e if isinstance(e, dict) else {}
        fig = f"{e['speedup']:.3f}x" if isinstance(e.get("speedup"), (int, float)) else str(e.get("status", "?"))
        shown.append(f"[bold]{fig}[/]" if i == chosen else escape(fig))
    spread = f", {d['spread']:.1%} apart" if isinstance(d.get("spread"), (int, float)) else ""
    asked = d.get("asked", "?")
    return f"{len(shown)} of {asked}, each in processes of its own: {' '.join(shown)}{spread} (bold: the record's)"


def _errors_line(result: EvalResult) -> str:
    """The candidate's error against the reference. A failed record leads with the first failing
    trial's, the figure its error log states; the largest over the trials follows."""
    limits = f"atol={result.atol}, rtol={result.rtol}"
    first = next((t for t in result.trials if not t.passed and t.max_abs_err is not None), None)
    if result.status is Status.PASSED or first is None:
        return (
            f"{result.max_abs_err:.3e}  mean {result.mean_abs_err:.3e}  (the largest of {len(result.trials)} "
            f"trials, {limits})"
        )
    mean = f"  mean {first.mean_abs_err:.3e}" if first.mean_abs_err is not None else ""
    return (
        f"{first.max_abs_err:.3e}{mean} in trial {first.trial}, the first to fail (as in the error log); "
        f"the largest of {len(result.trials)} trials {result.max_abs_err:.3e}  ({limits})"
    )


def _timing_line(median: float | None, stats) -> str:
    if stats is None:
        return _ms(median)
    return (
        f"{_ms(median)} median  (p10 {_ms(stats.p10_ms)}, p90 {_ms(stats.p90_ms)}; "
        f"{stats.iterations} iters, {stats.warmup} warm-up, {stats.clock}"
        f"{', cache flushed' if stats.l2_flush else ''})"
    )


# ---- the forge loop ---------------------------------------------------------------------------


def judge_defaults_warning(coder: str | None, judge: str | None) -> str | None:
    """The one warning when no Judge is given and the Coder's model (not a replay) reviews its own code."""
    if judge or not coder or coder.startswith("replay:"):
        return None
    return (
        f"warning: no --judge given; the Judge is the Coder's model ({coder}). It must answer in JSON; "
        "a Judge failure is shown on its round's line. Pass --judge MODEL to choose another."
    )


_VERDICT_STYLE = {"passed": "green", "incorrect": "yellow", "format_error": "magenta"}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


class LoopProgress:
    """Live progress of `kernelwright optimize`: one line with the round, its stage, the best
    speedup so far, the time elapsed and (after the first round) an estimate of the time left
    to the round limit; and one printed line per finished round. Rounds are numbered from 0, as in
    the run directory's folders and JSON; "(2 of 5)" counts them against the round limit."""

    def __init__(self, console: Console, rounds: int, verbosity: int = NORMAL):
        self.console, self.rounds, self.verbosity = console, rounds, verbosity
        self.started = time.monotonic()
        self.round_started = self.started
        self.done = 0
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=True,
            disable=verbosity == QUIET,
        )
        self.task: TaskID | None = None
        self.stage = None

    def __enter__(self) -> LoopProgress:
        self.progress.__enter__()
        self.task = self.progress.add_task("starting…", total=self.rounds, eta="")
        return self

    @property
    def _task(self) -> TaskID:
        assert self.task is not None, "the display is used inside its `with` block"
        return self.task

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _label(self, index: int) -> str:
        return f"round {index} ({index + 1} of {self.rounds})"

    def eta(self) -> str:
        """Time left to the round limit at the mean pace so far (a run may stop sooner)."""
        if not self.done or self.done >= self.rounds:
            return ""
        left = (time.monotonic() - self.started) / self.done * (self.rounds - self.done)
        return f"~{_clock(left)} left at most"

    def update(self, p) -> None:  # p: kernelwright.loop.history.Progress
        best = f"  best {_x(p.best_speedup)}" if p.best_speedup is not None else ""
        now = time.monotonic()
        if p.stage == "done":
            self.done += 1
            self.progress.update(self._task, completed=self.done, eta=self.eta())
            if self.verbosity == QUIET:
                return
            style = _VERDICT_STYLE.get(p.verdict or "", "red")
            speed = f" {_x(p.speedup)}" if p.speedup is not None else ""
            withheld = p.result.speedup_withheld_by if p.result is not None and p.speedup is not None else []
            speed += f" [yellow](not trusted: {', '.join(withheld)})[/]" if withheld else ""
            why = device_problem(p.result) if p.result is not None else None
            note = f" ({escape(why)})" if why else ""
            cold = cold_build(p.result) if p.result is not None else None
            cold_note = f"  [dim]cold: {cold}[/]" if cold else ""
            self.console.print(
                f"{self._label(p.round)}: [{style}]{p.verdict}[/]{speed}{note}{best}{_decision(p)}{_judge_failed(p)}"
                f"{cold_note}  [dim]{_clock(now - self.round_started)}[/]",
                highlight=False,
                soft_wrap=True,
            )
            if self.verbosity >= VERBOSE and p.result is not None and not why:
                self.console.print(f"  {p.result.summary_line()}", highlight=False, soft_wrap=True, markup=False)
            self.round_started, self.stage = now, None
            return
        if p.stage == "coder":
            self.round_started = now
        stage = escape(p.stage)  # a stage may name a candidate's extension: text, never markup
        self.progress.update(self._task, description=f"{self._label(p.round)}: {stage}…{best}", eta=self.eta())
        if self.verbosity >= VERBOSE and p.stage != self.stage:
            self.console.print(
                f"  {self._label(p.round)}: {stage}… (at {_clock(now - self.round_started)})",
                highlight=False,
                soft_wrap=True,
            )
        self.stage = p.stage


def _decision(p) -> str:
    """ "  new best: ..." or "  kept round 1: ...": why a correct round did (not) become the best."""
    if not p.decision:
        return ""
    if p.best_round == p.round:
        return f"  [green]new best[/]: {escape(p.decision)}"
    return f"  kept round {p.best_round}: {escape(p.decision)}"


def _judge_failed(p) -> str:
    """ "  Judge failed: ...": the round's Judge gave no usable critique (the next Coder prompt has none)."""
    return f"  [red]Judge failed[/]: {escape(p.judge_error)}" if p.judge_error else ""


def _expectation(r: dict) -> str:
    """ "1.50x, got 1.10x: missed": the Judge's expected speedup over the candidate it reviewed, and this round's."""
    outcome = r.get("expectation_outcome")
    if not outcome:
        return "-"
    got = r.get("measured_over_baseline")
    return f"{_x(r.get('expected_speedup'))} / {_x(got)}: {outcome}" if got is not None else outcome


def render_run(summary: dict, run_dir, console: Console) -> None:
    """The end of a run: every round's verdict, the best candidate, tokens and cost."""
    table = Table(title=f"run {run_dir}", title_justify="left")
    for col in (
        "round",
        "kind",
        "verdict",
        "speed-up vs reference",
        "Judge: expected / got vs reviewed round",
        "tokens",
        "folder",
    ):
        table.add_column(col)
    best_round = summary["best"]["round"] if summary.get("best") else None
    for r in summary["rounds"]:
        style = _VERDICT_STYLE.get(r["verdict"], "red")
        mark = " ★" if r["round"] == best_round else ""
        table.add_row(
            str(r["round"]),
            r["kind"],
            f"[{style}]{r['verdict']}[/]",
            _x(r["speedup"]) + mark,
            _expectation(r),
            str(r["tokens"]),
            r["dir"] or "-",
        )
    console.print(table)
    console.print(
        "[dim]speed-up: the candidate against the reference (the original program); Judge: the speed-up "
        "the Judge expected over the round it reviewed, and the one measured over that round[/]",
        highlight=False,
        soft_wrap=True,
    )
    best = summary.get("best")
    if best:
        times = (
            f" ({best['candidate_ms']:.4g} ms vs {best['reference_ms']:.4g} ms on {best['device']})"
            if best.get("candidate_ms") is not None and best.get("reference_ms") is not None
            else ""
        )
        withheld = best.get("speedup_withheld_by") or []
        untrusted = f" [yellow](not trusted: {', '.join(withheld)})[/]" if withheld else ""
        console.print(
            f"best: [bold green]{_x(best['speedup'])}[/]{untrusted} from round {best['round']}{times}"
            f" → {run_dir}/{best['file']}",
            highlight=False,
        )
    else:
        console.print("[yellow]no correct candidate found[/]")
    cost = f"${summary['cost_usd']:.4f}" + (
        f" (+{summary['unpriced_calls']} calls with no known price)" if summary["unpriced_calls"] else ""
    )
    state = summary.get("state", "finished")
    style = "bold red" if state == "stopped" else "bold"
    console.print(
        f"[{style}]{state}[/]: {escape(str(summary['stop_reason']))}; tokens {summary['tokens']['total']}, "
        f"cost {cost}, {_clock(summary['wall_s'])}",
        highlight=False,
        soft_wrap=True,
    )


def run_line(summary: dict, run_dir) -> str:
    """The run in one line (what --quiet prints)."""
    best = summary.get("best")
    got = (
        f"best {_x(best['speedup'])} from round {best['round']} → {run_dir}/{best['file']}"
        if best
        else f"no correct candidate → {run_dir}"
    )
    return f"{summary.get('state', 'finished')}: {summary['stop_reason']}; {got}"
