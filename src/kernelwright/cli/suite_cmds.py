"""`kernelwright suite eval` and `kernelwright suite optimize`: whole suites, recorded in the store.

Exit codes: 0 when every problem ran (whatever the verdicts); 1 when the engine could not run
some problems (each named on stderr); 2 when the suite could not be set up (one line naming the fix).

Settings come in three layers, as for `kernelwright eval`: the defaults (`core/config.py`), the
settings file (`--config`, else the nearest kernelwright.toml), then the options given here.
Where evaluations run: `--executor local` (the default for `suite eval`: one worker per GPU of
this machine, every candidate's build started at once on a CPU pool, warm runners waiting on each
GPU), `serial` (one evaluation at a time in this process's engine) or `ray` (a Ray cluster);
`--gpus 0,1` picks GPUs. `--json` prints the suite's summary as JSON on stdout and nothing else
there; `--quiet` prints one line at the end.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kernelwright.cli.console import judge_defaults_warning
from kernelwright.cli.entry import fail
from kernelwright.cli.entry import settings as _settings
from kernelwright.cli.exit_codes import ExitCode
from kernelwright.cli.help import PlainGroup
from kernelwright.cli.options import Config, Draws, Gpus, Quiet, RayAddress, StoreFile, SuiteOut, SuiteSandbox, Trials
from kernelwright.core.config import EvalConfig

app = typer.Typer(
    cls=PlainGroup,
    no_args_is_help=True,
    help="Evaluate or optimise whole suites (KernelBench levels, folders of problems).",
)
err = Console(stderr=True)

_VERDICT_STYLE = {"passed": "green", "incorrect": "yellow", "format_error": "magenta"}


class RichSuiteProgress:
    """Live progress: a bar with counts, elapsed and remaining time, the current problem and stage,
    and the verdict mix so far; one printed line per finished problem."""

    def __init__(self, console: Console):
        self.console = console
        self.mix: Counter = Counter()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[mix]}"),
            TextColumn("[dim]{task.fields[pipe]}"),
            console=console,
            transient=True,
        )
        self.task: TaskID | None = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def _mix(self) -> str:
        return "  ".join(f"[{_VERDICT_STYLE.get(v, 'red')}]{v} {n}[/]" for v, n in self.mix.most_common())

    def start(self, total: int, already_done: int) -> None:
        if already_done:
            self.console.print(
                f"{already_done} of {total} problems finished before: skipped", highlight=False, soft_wrap=True
            )
        self.task = self.progress.add_task("starting", total=total - already_done, mix="", pipe="")

    @property
    def _task(self) -> TaskID:
        assert self.task is not None, "problems are shown after `start`"
        return self.task

    def stage(self, problem, text: str) -> None:
        self.progress.update(self._task, description=escape(f"{problem.key}: {text}"))  # text, never markup

    def done(self, problem, verdict: str, speedup: float | None) -> None:
        self.mix[verdict] += 1
        speed = f" {speedup:.3f}x" if speedup is not None else ""
        self.console.print(
            f"{problem.key}: [{_VERDICT_STYLE.get(verdict, 'red')}]{verdict}[/]{speed}", highlight=False, soft_wrap=True
        )
        self.progress.update(self._task, advance=1, mix=self._mix())

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=True)

    def pipeline(self, pipe) -> None:
        """The pipeline's counts and the GPUs' busy share (`suites.pipeline.Pipeline`)."""
        if self.task is not None:
            self.progress.update(self.task, pipe=pipe.line())


def default_name(kind: str, problems: list[str], candidates: str | None = None) -> str:
    """A stable name for the same arguments, so that a rerun finds (and skips) what is finished."""
    basis = "\n".join(
        [kind, *sorted(str(Path(p).resolve()) for p in problems), str(Path(candidates).resolve()) if candidates else ""]
    )
    head = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(problems[0].rstrip("/")).name or "suite")[:40]
    return f"{kind}-{head}-{hashlib.sha256(basis.encode()).hexdigest()[:8]}"


def _store_path(store: Path | None) -> Path:
    from kernelwright.store.queries import DEFAULT_STORE

    return store or DEFAULT_STORE


def _out_dir(db, out: Path | None, name: str) -> Path:
    """--out, else where the store says the suite's run directories are (a rerun from any working
    directory resumes them), else runs/suites/NAME here."""
    from kernelwright.suites.driver import suite_dir

    return out or suite_dir(db, name) or Path("runs") / "suites" / name


def _close(ex, interrupted: bool) -> None:
    """Close the executor; after Ctrl-C, at once (a second Ctrl-C meanwhile is not a traceback)."""
    import signal

    if not interrupted:
        ex.close()
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ex.close(cancel=True)


def _interrupted(store_obj, name: str, console: Console, t0: float) -> None:
    """Ctrl-C: what the store holds, how to go on, exit 130. The process ends here (`os._exit`):
    a prebuild still compiling would otherwise hold it until it finished (its children end with
    it: they are killed when their parent dies)."""
    import os
    import sys

    from kernelwright.store.queries import RunStore

    done = len(RunStore(store_obj).problems(name))
    Console(stderr=True).print(
        f"interrupted after {time.monotonic() - t0:.0f} s: {done} problem(s) of suite {name} are in the store; "
        "run the same command again to go on (what is finished is skipped)",
        highlight=False,
        soft_wrap=True,
    )
    try:
        store_obj.close()
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(ExitCode.INTERRUPTED))


def _finish(
    outcome,
    store_obj,
    name: str,
    console: Console,
    t0: float,
    *,
    json_out: bool = False,
    quiet: bool = False,
    extra: dict | None = None,
) -> None:
    import json
    import sys

    from kernelwright.cli.report_cmds import render_metrics
    from kernelwright.store.queries import RunStore
    from kernelwright.suites.metrics import ProblemOutcome, summarize

    rows = RunStore(store_obj).problems(name)
    metrics = summarize([ProblemOutcome(**r) for r in rows])
    wall = time.monotonic() - t0
    line = (
        f"ran {len(outcome.ran)}, skipped {len(outcome.skipped)} finished before, "
        f"{len(outcome.failed)} could not run; {wall:.0f} s. Report: kernelwright report {name} --html report.html"
    )
    if json_out:
        sys.stdout.write(
            json.dumps(
                {
                    "suite": name,
                    "ran": outcome.ran,
                    "skipped": outcome.skipped,
                    "failed": outcome.failed,
                    "notes": outcome.notes,
                    "wall_s": round(wall, 3),
                    "bottleneck": outcome.bottleneck or None,
                    **(extra or {}),
                    "metrics": metrics.to_dict(),
                    "problems": rows,
                },
                default=str,
            )
            + "\n"
        )
    elif quiet:
        mix = ", ".join(f"{v} {n}" for v, n in sorted(metrics.verdict_mix.items(), key=lambda kv: -kv[1]))
        console.print(
            f"suite {name}: {metrics.correct}/{metrics.problems} correct ({mix}); {line}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        render_metrics(metrics, Console(), title=f"suite {name}")
        console.print(line, highlight=False, soft_wrap=True)
    if outcome.bottleneck and not json_out:
        console.print(f"[yellow]{escape(outcome.bottleneck)}[/]", highlight=False, soft_wrap=True)
    for note in outcome.notes:
        err.print(f"[red]not run:[/] {note}", highlight=False, soft_wrap=True)
    if outcome.failed:
        raise typer.Exit(1)


def _executor(kind: str, config: EvalConfig, gpus: str | None, ray_address: str | None, build_workers: int | None):
    """`--executor` and `--gpus` to an executor; a bad option is one line, exit 2."""
    from kernelwright.engine import EngineError
    from kernelwright.executors.factory import make_executor
    from kernelwright.executors.placement import parse_gpus

    try:
        return make_executor(kind, config, parse_gpus(gpus), ray_address, build_workers=build_workers)
    except (ValueError, EngineError) as exc:
        fail(str(exc))


def _console(json_out: bool, quiet: bool) -> Console:
    """Where the progress goes: stderr, or nowhere with --json/--quiet."""
    import io

    return Console(file=io.StringIO(), stderr=False) if (json_out or quiet) else Console(stderr=True)


@dataclass
class _Suite:
    """A suite set up to run: its name, the executor its evaluations run on, the store that
    records it and the folder of its run directories."""

    name: str
    executor: Any
    db: Any
    out_dir: Path
    store_path: Path


def _open_suite(
    kind: str,
    name: str,
    problem_args: list[str],
    *,
    store: Path | None,
    out: Path | None,
    executor: Any,
    candidates: str | None = None,
    info: dict[str, Any],
) -> _Suite:
    """Open the store and register the suite in it (a rerun: checked to be the same suite); on a
    failure the executor is closed and the error is one line, exit 2."""
    from kernelwright.store.db import Store, StoreError
    from kernelwright.suites.discovery import SuiteError
    from kernelwright.suites.driver import register_suite

    store_path = _store_path(store)
    db = None
    try:
        db = Store.open(store_path)
        out_dir = _out_dir(db, out, name)
        register_suite(db, name, kind, problem_args, out_dir, candidates=candidates, info=info)
    except (SuiteError, StoreError, ValueError) as exc:
        executor.close()
        if db is not None:
            db.close()
        fail(str(exc))
    return _Suite(name, executor, db, out_dir, store_path)


def _run_suite(
    suite: _Suite,
    run: Callable[[RichSuiteProgress], Any],
    console: Console,
    *,
    json_out: bool,
    quiet: bool,
    extra: dict,
) -> None:
    """`run(progress)` under live progress, the executor closed after it; Ctrl-C: what the store
    holds and exit 130; else the suite's summary (exit 1 when some problems could not run)."""
    t0 = time.monotonic()
    try:
        interrupted = False
        try:
            with RichSuiteProgress(console) as progress:
                outcome = run(progress)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _close(suite.executor, interrupted)
        if interrupted:
            _interrupted(suite.db, suite.name, console, t0)
        _finish(
            outcome,
            suite.db,
            suite.name,
            Console(stderr=True) if quiet else console,
            t0,
            json_out=json_out,
            quiet=quiet,
            extra=extra,
        )
    finally:
        suite.db.close()


@app.command("eval")
def suite_eval(
    paths: list[str] = typer.Argument(
        ...,
        metavar="PROBLEMS... CANDIDATES",
        help="Problem folders, files or globs (KernelBench/level1 as it is), then the candidates: a folder "
        "(one file per problem, by name, or KernelBench's runs/ layout), a JSON mapping, or JSON/JSONL {problem, code} records.",  # noqa: E501
    ),
    only: list[str] = typer.Option(
        None, "--only", help="Run only these problems: a name, a glob, a level (level2) or an id; repeatable."
    ),
    skip: list[str] = typer.Option(None, "--skip", help="Leave these problems out (same forms as --only); repeatable."),
    name: str = typer.Option(
        None, help="The suite's name in the store (default: from the arguments; a rerun skips what is finished)."
    ),
    out: SuiteOut = None,
    store: StoreFile = None,
    device: str = typer.Option(None, help="cuda, cpu, or auto (cuda when a GPU is visible; the default)."),
    trials: Trials = None,
    atol: float = typer.Option(None, help="Absolute tolerance (default 1e-3)."),
    rtol: float = typer.Option(None, help="Relative tolerance (default 1e-3)."),
    verdict: str = typer.Option(None, help="calibrated or strict (docs/VERDICTS.md; default calibrated)."),
    shapes: str = typer.Option(
        None,
        metavar="check|strict|off",
        help="Also judge a passed candidate at other sizes of its problem (default check: a failure there "
        "is flagged shape_specific; strict: it fails; off: not checked).",
    ),
    compare_compile: bool = typer.Option(
        None, "--compare-compile/--no-compare-compile", help="Also time torch.compile of each reference."
    ),
    draws: Draws = None,
    profile: bool = typer.Option(
        None,
        "--profile/--no-profile",
        help="Profile each correct candidate's kernels, with its roofline (kept in its eval.json; off by default).",
    ),
    sandbox: SuiteSandbox = None,
    executor: str = typer.Option(
        "local",
        "--executor",
        metavar="local|serial|ray",
        help="local (a worker per GPU, builds ahead on a CPU pool; the default), serial or ray.",
    ),
    gpus: Gpus = None,
    ray_address: RayAddress = None,
    build_workers: int = typer.Option(
        None,
        "--build-workers",
        help="Candidates built ahead on the CPU at once (0: no prebuild; default: sized to the machine's free cores).",
    ),
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print the suite's summary (metrics, every problem) as JSON on stdout, and nothing else there.",
    ),
    quiet: Quiet = False,
    config: Config = None,
) -> None:
    """Evaluate existing candidates for every problem of a suite, with no model at all."""
    from kernelwright.suites.driver import run_eval_suite

    if len(paths) < 2:
        fail("suite eval needs PROBLEMS and CANDIDATES; e.g. kernelwright suite eval KernelBench/level1 my_kernels/")
    problem_args, cand_arg = paths[:-1], paths[-1]
    settings = _settings(
        config,
        {
            "eval": {
                "device": device,
                "trials": trials,
                "atol": atol,
                "rtol": rtol,
                "sandbox": sandbox,
                "verdict": verdict,
                "shapes": shapes,
                "timing": {"compare_compile": compare_compile, "draws": draws},
                "profile": {"enabled": profile},
            }
        },
    )
    cfg = settings.eval
    if not settings.given("eval.profile.roofline"):  # evidence only where asked (--profile)
        cfg.profile.roofline = cfg.profile.enabled
    problems, pairs, missing, cfg = _eval_pairs(problem_args, cand_arg, only, skip, cfg)
    name = name or default_name("eval", problem_args, cand_arg)
    if build_workers is None and executor == "serial":
        import os

        build_workers = max(1, min(4, (os.cpu_count() or 1) // 4))
    ex = _executor(executor, cfg, gpus, ray_address, build_workers)  # a bad option: one line, before any write
    info = {
        "device": cfg.device,
        "trials": cfg.trials,
        "atol": cfg.atol,
        "rtol": cfg.rtol,
        "verdict": cfg.verdict,
        "draws": cfg.timing.draws,
        "executor": executor,
        "missing": [{"problem": p.name, "level": p.level} for p in missing],
    }
    suite = _open_suite("eval", name, problem_args, store=store, out=out, executor=ex, candidates=cand_arg, info=info)
    console = _console(json_out, quiet)
    console.print(
        f"[bold]suite eval[/] {name}: {len(pairs)} candidates for {len(problems)} problems"
        + (f" ({len(missing)} with no candidate)" if missing else "")
        + f" on {cfg.device}, executor {executor} → {suite.out_dir}, store {suite.store_path}",
        highlight=False,
        soft_wrap=True,
    )
    _run_suite(
        suite,
        lambda progress: run_eval_suite(
            pairs,
            name=name,
            out_dir=suite.out_dir,
            store=suite.db,
            config=cfg,
            executor=ex,
            build_workers=build_workers or 0,
            progress=progress,
        ),
        console,
        json_out=json_out,
        quiet=quiet,
        extra={"executor": executor, "missing": [p.key for p in missing]},
    )


def _eval_pairs(problem_args: list[str], cand_arg: str, only, skip, cfg: EvalConfig):
    """The problems, the (problem, candidate) pairs, the problems with no candidate, and the
    configuration with "auto" resolved; a suite that cannot be set up is one line, exit 2."""
    from kernelwright.engine import EngineError
    from kernelwright.engine.config_resolution import resolve_config
    from kernelwright.suites import discovery

    try:
        problems = discovery.discover(problem_args, only, skip)
        pairs, missing = discovery.match(problems, discovery.load_candidates(cand_arg))
        if not pairs:
            raise discovery.SuiteError(
                f"no candidate in {cand_arg} matches any of the {len(problems)} problems; "
                "name candidate files like the problems (19_ReLU.py) or pass a mapping file"
            )
        return problems, pairs, missing, resolve_config(cfg)
    except (discovery.SuiteError, EngineError, ValueError) as exc:
        fail(str(exc))


@app.command("optimize")
def suite_optimize(
    problems_args: list[str] = typer.Argument(
        ..., metavar="PROBLEMS...", help="Problem folders, files or globs (KernelBench/level1 as it is)."
    ),
    coder: str = typer.Option(
        None, help="Coder model (as for `kernelwright optimize`; or model.coder in the settings file)."
    ),
    judge: str = typer.Option(None, help="Judge model (default: the Coder's model)."),
    rounds: int = typer.Option(None, help="Round limit per problem (default 10)."),
    only: list[str] = typer.Option(
        None, "--only", help="Run only these problems: a name, a glob, a level or an id; repeatable."
    ),
    skip: list[str] = typer.Option(None, "--skip", help="Leave these problems out; repeatable."),
    name: str = typer.Option(
        None, help="The suite's name in the store (default: from the arguments; a rerun continues it)."
    ),
    out: SuiteOut = None,
    store: StoreFile = None,
    backend: str = typer.Option(None, help="cuda, triton or cpp (default: cuda on a GPU, cpp on the CPU)."),
    device: str = typer.Option(None, help="cuda, cpu, or auto (the default)."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="Env var that holds the API key."),
    price_file: Path = typer.Option(None, "--price-file", help="JSON or TOML price table."),
    target_speedup: float = typer.Option(
        None, "--target-speedup", help="Stop a problem once this speedup is verified."
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Token budget per problem."),
    max_cost: float = typer.Option(None, "--max-cost", help="Cost budget per problem, USD."),
    trials: Trials = None,
    draws: Draws = None,
    profile: bool = typer.Option(
        None, "--profile/--no-profile", help="Profile correct candidates for the Judge (on by default)."
    ),
    sandbox: SuiteSandbox = None,
    retries: int = typer.Option(None, help="Attempts per model call (default 5)."),
    request_timeout: float = typer.Option(
        None, "--request-timeout", help="Seconds one model request may take (default 600)."
    ),
    executor: str = typer.Option(
        "serial",
        "--executor",
        metavar="serial|local|ray",
        help="serial (the default), local (a worker per GPU of this machine) or ray.",
    ),
    gpus: Gpus = None,
    ray_address: RayAddress = None,
    parallel: int = typer.Option(
        None, "--parallel", help="Problems optimised at once (default: one per GPU worker of the executor)."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print the suite's summary as JSON on stdout, and nothing else there."
    ),
    quiet: Quiet = False,
    config: Config = None,
) -> None:
    """Run the forge loop (Coder, engine, Judge) on every problem of a suite."""
    from kernelwright.suites.driver import run_optimize_suite

    settings = _settings(
        config,
        {
            "eval": {"device": device, "trials": trials, "sandbox": sandbox, "timing": {"draws": draws}},
            "loop": {
                "rounds": rounds,
                "backend": backend,
                "target_speedup": target_speedup,
                "max_tokens": max_tokens,
                "max_cost_usd": max_cost,
                "profile": profile,
            },
            "model": {
                "coder": coder,
                "judge": judge,
                "base_url": base_url,
                "api_key_env": api_key_env,
                "price_file": str(price_file) if price_file else None,
                "retry": {"max_attempts": retries, "request_timeout_s": request_timeout},
            },
        },
    )
    if parallel is not None and parallel < 1:
        fail(f"--parallel must be at least 1 (got {parallel})")
    cfg, model_cfg, asked_sandbox = settings.loop, settings.loop.model, settings.eval.sandbox
    problems, eval_cfg, coder_model, judge_model = _optimize_setup(problems_args, only, skip, settings)
    name = name or default_name("optimize", problems_args)
    ex = _executor(executor, eval_cfg, gpus, ray_address, None)  # a bad option: one line, before any write
    run_info = {
        "coder": coder_model.name,
        "judge": judge_model.name,
        "backend": cfg.backend,
        "device": eval_cfg.device,
        "round_limit": cfg.rounds,
        "trials": eval_cfg.trials,
        "profile": "auto" if cfg.profile else "off",
        "sandbox": asked_sandbox,  # the suite records what was asked; its evaluations, what ran
        "executor": executor,
    }
    suite = _open_suite("optimize", name, problems_args, store=store, out=out, executor=ex, info=run_info)
    console = _console(json_out, quiet)
    parallel = parallel or len(getattr(ex, "_slots", [])) or 1
    console.print(
        f"[bold]suite optimize[/] {name}: {len(problems)} problems, coder {coder_model.name}, judge "
        f"{judge_model.name}, {cfg.rounds} rounds each, on {eval_cfg.device}, executor {executor} "
        f"({parallel} at once) → {suite.out_dir}, store {suite.store_path}",
        highlight=False,
        soft_wrap=True,
    )
    warning = judge_defaults_warning(model_cfg.coder, model_cfg.judge)
    if warning:
        console.print(f"[yellow]{escape(warning)}[/]", highlight=False, soft_wrap=True)
    _run_suite(
        suite,
        lambda progress: run_optimize_suite(
            problems,
            name=name,
            out_dir=suite.out_dir,
            store=suite.db,
            eval_config=eval_cfg,
            loop_config=cfg,
            coder=coder_model,
            judge=judge_model,
            device=eval_cfg.device,
            run_info=run_info,
            progress=progress,
            executor=ex,
            parallel=parallel,
        ),
        console,
        json_out=json_out,
        quiet=quiet,
        extra={"executor": executor},
    )


def _optimize_setup(problems_args: list[str], only, skip, settings):
    """The problems, the evaluation's configuration with "auto" resolved, the Coder and the Judge;
    the loop's settings checked (its backend chosen for the device where none was given). A suite
    that cannot be set up is one line, exit 2."""
    from kernelwright.engine import EngineError
    from kernelwright.engine.config_resolution import resolve_config
    from kernelwright.models import ModelSetupError, resolve_model
    from kernelwright.suites import discovery

    cfg, eval_cfg, model_cfg = settings.loop, settings.eval, settings.loop.model
    try:
        if not model_cfg.coder:
            raise ValueError(
                "no Coder model given; pass --coder (openai:MODEL, anthropic:MODEL, replay:RUN_DIR) "
                "or set coder under [model] in kernelwright.toml"
            )
        problems = discovery.discover(problems_args, only, skip)
        eval_cfg.profile.enabled = cfg.profile  # the Judge's evidence (the roofline stays on, as its default)
        eval_cfg = resolve_config(eval_cfg)
        if not settings.given("loop.backend"):
            cfg.backend = "cpp" if eval_cfg.device == "cpu" else "cuda"
        cfg.validate()
        coder_model = resolve_model(model_cfg.coder, "coder", model_cfg)
        judge_model = resolve_model(model_cfg.judge or model_cfg.coder, "judge", model_cfg)
    except (discovery.SuiteError, EngineError, ModelSetupError, ValueError) as exc:
        fail(str(exc))
    return problems, eval_cfg, coder_model, judge_model
