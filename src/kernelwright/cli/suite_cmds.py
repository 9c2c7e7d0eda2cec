"""`kernelwright suite eval` and `kernelwright suite optimize`: whole suites, recorded in the store.

Exit codes: 0 when every problem ran (whatever the verdicts); 1 when the engine could not run
some problems (each named on stderr); 2 when the suite could not be set up (one line naming the fix).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn

from kernelwright.core.config import EvalConfig

app = typer.Typer(no_args_is_help=True, help="Evaluate or optimise whole suites (KernelBench levels, folders of problems).")
err = Console(stderr=True)

_VERDICT_STYLE = {"passed": "green", "incorrect": "yellow", "format_error": "magenta"}


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


class RichSuiteProgress:
    """Live progress: a bar with counts, elapsed and remaining time, the current problem and stage,
    and the verdict mix so far; one printed line per finished problem."""

    def __init__(self, console: Console):
        self.console = console
        self.mix: Counter = Counter()
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[mix]}"), console=console, transient=True)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def _mix(self) -> str:
        return "  ".join(f"[{_VERDICT_STYLE.get(v, 'red')}]{v} {n}[/]" for v, n in self.mix.most_common())

    def start(self, total: int, already_done: int) -> None:
        if already_done:
            self.console.print(f"{already_done} of {total} problems finished before: skipped", highlight=False, soft_wrap=True)
        self.task = self.progress.add_task("starting", total=total - already_done, mix="")

    def stage(self, problem, text: str) -> None:
        self.progress.update(self.task, description=f"{problem.key}: {text}")

    def done(self, problem, verdict: str, speedup: float | None) -> None:
        self.mix[verdict] += 1
        speed = f" {speedup:.3f}x" if speedup is not None else ""
        self.console.print(f"{problem.key}: [{_VERDICT_STYLE.get(verdict, 'red')}]{verdict}[/]{speed}", highlight=False, soft_wrap=True)
        self.progress.update(self.task, advance=1, mix=self._mix())

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/]", highlight=False, soft_wrap=True)


def default_name(kind: str, problems: list[str], candidates: str | None = None) -> str:
    """A stable name for the same arguments, so that a rerun finds (and skips) what is finished."""
    basis = "\n".join([kind, *sorted(str(Path(p).resolve()) for p in problems), str(Path(candidates).resolve()) if candidates else ""])
    head = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(problems[0].rstrip("/")).name or "suite")[:40]
    return f"{kind}-{head}-{hashlib.sha256(basis.encode()).hexdigest()[:8]}"


def _store_and_out(store: Path | None, out: Path | None, name: str):
    from kernelwright.store.api import DEFAULT_STORE

    return (store or DEFAULT_STORE), (out or Path("runs") / "suites" / name)


def _finish(outcome, store_obj, name: str, console: Console, t0: float) -> None:
    from kernelwright.cli.report_cmds import render_metrics
    from kernelwright.store.api import RunStore
    from kernelwright.suites.metrics import ProblemOutcome, summarize

    rows = RunStore(store_obj).problems(name)
    render_metrics(summarize([ProblemOutcome(**r) for r in rows]), Console(), title=f"suite {name}")
    console.print(f"ran {len(outcome.ran)}, skipped {len(outcome.skipped)} finished before, "
                  f"{len(outcome.failed)} could not run; {time.monotonic() - t0:.0f} s. "
                  f"Report: kernelwright report {name} --html report.html", highlight=False, soft_wrap=True)
    for note in outcome.notes:
        err.print(f"[red]not run:[/] {note}", highlight=False, soft_wrap=True)
    if outcome.failed:
        raise typer.Exit(1)


@app.command("eval")
def suite_eval(
    paths: list[str] = typer.Argument(..., metavar="PROBLEMS... CANDIDATES",
                                      help="Problem folders, files or globs (KernelBench/level1 as it is), then the candidates: a folder "
                                           "(one file per problem, by name, or KernelBench's runs/ layout), a JSON mapping, or JSON/JSONL {problem, code} records."),
    only: list[str] = typer.Option(None, "--only", help="Run only these problems: a name, a glob, a level (level2) or an id; repeatable."),
    skip: list[str] = typer.Option(None, "--skip", help="Leave these problems out (same forms as --only); repeatable."),
    name: str = typer.Option(None, help="The suite's name in the store (default: from the arguments; a rerun skips what is finished)."),
    out: Path = typer.Option(None, help="Folder for the run directories (default: runs/suites/NAME)."),
    store: Path = typer.Option(None, help="Run store (default: runs/kernelwright.db)."),
    device: str = typer.Option("auto", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    trials: int = typer.Option(5, help="Correctness trials per candidate."),
    atol: float = typer.Option(1e-3, help="Absolute tolerance."),
    rtol: float = typer.Option(1e-3, help="Relative tolerance."),
    verdict: str = typer.Option("calibrated", help="calibrated or strict (docs/VERDICTS.md)."),
    compare_compile: bool = typer.Option(False, "--compare-compile", help="Also time torch.compile of each reference."),
    profile: bool = typer.Option(False, "--profile/--no-profile", help="Profile each correct candidate's kernels (kept in its eval.json)."),
    sandbox: str = typer.Option("auto", help="auto, bwrap or none."),
    build_workers: int = typer.Option(None, "--build-workers", help="Candidates built ahead on the CPU at once (0: no prebuild; default: a quarter of the cores, 1 to 4)."),
) -> None:
    """Evaluate existing candidates for every problem of a suite, with no model at all."""
    from kernelwright.engine import EngineError
    from kernelwright.engine.evaluation import check_device
    from kernelwright.store.db import Store, StoreError
    from kernelwright.suites import discovery
    from kernelwright.suites.runner import register_suite, run_eval_suite

    if len(paths) < 2:
        _fail("suite eval needs PROBLEMS and CANDIDATES; e.g. kernelwright suite eval KernelBench/level1 my_kernels/")
    problem_args, cand_arg = paths[:-1], paths[-1]
    try:
        problems = discovery.discover(problem_args, only, skip)
        pairs, missing = discovery.match(problems, discovery.load_candidates(cand_arg))
        if not pairs:
            raise discovery.SuiteError(f"no candidate in {cand_arg} matches any of the {len(problems)} problems; "
                                       "name candidate files like the problems (19_ReLU.py) or pass a mapping file")
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        check_device(device)
        config = EvalConfig(device=device, trials=trials, atol=atol, rtol=rtol, sandbox=sandbox,  # type: ignore[arg-type]
                            verdict=verdict)  # type: ignore[arg-type]
        config.timing.compare_compile = compare_compile
        config.profile.enabled = profile
        config.validate()
        name = name or default_name("eval", problem_args, cand_arg)
        if build_workers is None:
            import os

            build_workers = max(1, min(4, (os.cpu_count() or 1) // 4))
        store_path, out_dir = _store_and_out(store, out, name)
        db = Store.open(store_path)
        register_suite(db, name, "eval", problem_args, out_dir, candidates=cand_arg, info={
            "device": device, "trials": trials, "atol": atol, "rtol": rtol, "verdict": verdict,
            "missing": [{"problem": p.name, "level": p.level} for p in missing]})
    except (discovery.SuiteError, EngineError, StoreError, ValueError) as exc:
        _fail(str(exc))
        return
    console = Console(stderr=True)
    console.print(f"[bold]suite eval[/] {name}: {len(pairs)} candidates for {len(problems)} problems"
                  + (f" ({len(missing)} with no candidate)" if missing else "") + f" on {device} → {out_dir}, store {store_path}",
                  highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    try:
        with RichSuiteProgress(console) as progress:
            outcome = run_eval_suite(pairs, name=name, out_dir=out_dir, store=db, config=config,
                                     build_workers=build_workers, progress=progress)
        _finish(outcome, db, name, console, t0)
    finally:
        db.close()


@app.command("optimize")
def suite_optimize(
    problems_args: list[str] = typer.Argument(..., metavar="PROBLEMS...", help="Problem folders, files or globs (KernelBench/level1 as it is)."),
    coder: str = typer.Option(..., help="Coder model (as for `kernelwright optimize`)."),
    judge: str = typer.Option(None, help="Judge model (default: the Coder's model)."),
    rounds: int = typer.Option(10, help="Round limit per problem."),
    only: list[str] = typer.Option(None, "--only", help="Run only these problems: a name, a glob, a level or an id; repeatable."),
    skip: list[str] = typer.Option(None, "--skip", help="Leave these problems out; repeatable."),
    name: str = typer.Option(None, help="The suite's name in the store (default: from the arguments; a rerun continues it)."),
    out: Path = typer.Option(None, help="Folder for the run directories (default: runs/suites/NAME)."),
    store: Path = typer.Option(None, help="Run store (default: runs/kernelwright.db)."),
    backend: str = typer.Option(None, help="cuda, triton or cpp (default: cuda on a GPU, cpp on the CPU)."),
    device: str = typer.Option("auto", help="cuda, cpu, or auto."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="Env var that holds the API key."),
    price_file: Path = typer.Option(None, "--price-file", help="JSON or TOML price table."),
    target_speedup: float = typer.Option(None, "--target-speedup", help="Stop a problem once this speedup is verified."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Token budget per problem."),
    max_cost: float = typer.Option(None, "--max-cost", help="Cost budget per problem, USD."),
    trials: int = typer.Option(5, help="Correctness trials per candidate."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="Profile correct candidates for the Judge."),
    sandbox: str = typer.Option("auto", help="auto, bwrap or none."),
    retries: int = typer.Option(5, help="Attempts per model call."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="Seconds one model request may take."),
) -> None:
    """Run the forge loop (Coder, engine, Judge) on every problem of a suite."""
    from kernelwright.core.config import LoopConfig, ModelConfig, ProfileConfig, RetryPolicy
    from kernelwright.engine import EngineError
    from kernelwright.engine.isolation import sandbox as sandbox_mod
    from kernelwright.engine.evaluation import check_device
    from kernelwright.models import ModelSetupError, resolve_model
    from kernelwright.store.db import Store, StoreError
    from kernelwright.suites import discovery
    from kernelwright.suites.runner import register_suite, run_optimize_suite

    try:
        problems = discovery.discover(problems_args, only, skip)
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        check_device(device)
        model_cfg = ModelConfig(base_url=base_url, api_key_env=api_key_env, price_file=str(price_file) if price_file else None,
                                retry=RetryPolicy(max_attempts=retries, request_timeout_s=request_timeout))
        cfg = LoopConfig(rounds=rounds, backend=backend or ("cpp" if device == "cpu" else "cuda"),  # type: ignore[arg-type]
                         target_speedup=target_speedup, max_tokens=max_tokens, max_cost_usd=max_cost, model=model_cfg)
        cfg.validate()
        eval_cfg = EvalConfig(device=device, trials=trials, sandbox=sandbox,  # type: ignore[arg-type]
                              profile=ProfileConfig(enabled=profile))
        eval_cfg.validate()
        sandbox_mod.resolve(eval_cfg.sandbox)
        coder_model = resolve_model(coder, "coder", model_cfg)
        judge_model = resolve_model(judge or coder, "judge", model_cfg)
        name = name or default_name("optimize", problems_args)
        store_path, out_dir = _store_and_out(store, out, name)
        db = Store.open(store_path)
        run_info = {"coder": coder_model.name, "judge": judge_model.name, "backend": cfg.backend, "device": device,
                    "round_limit": rounds, "trials": trials, "profile": "auto" if profile else "off", "sandbox": sandbox}
        register_suite(db, name, "optimize", problems_args, out_dir, info=run_info)
    except (discovery.SuiteError, EngineError, StoreError, ModelSetupError, ValueError,
            sandbox_mod.SandboxUnavailable) as exc:
        _fail(str(exc))
        return
    console = Console(stderr=True)
    console.print(f"[bold]suite optimize[/] {name}: {len(problems)} problems, coder {coder_model.name}, judge "
                  f"{judge_model.name}, {rounds} rounds each, on {device} → {out_dir}, store {store_path}", highlight=False, soft_wrap=True)
    t0 = time.monotonic()
    try:
        with RichSuiteProgress(console) as progress:
            outcome = run_optimize_suite(problems, name=name, out_dir=out_dir, store=db, eval_config=eval_cfg,
                                         loop_config=cfg, coder=coder_model, judge=judge_model, device=device,
                                         run_info=run_info, progress=progress)
        _finish(outcome, db, name, console, t0)
    finally:
        db.close()
