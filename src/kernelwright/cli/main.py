"""The command line: `kernelwright eval` and `kernelwright optimize` (the forge loop).

Settings come in three layers: the dataclasses' defaults (`core/config.py`), the settings file
(`kernelwright.toml` or `[tool.kernelwright]` in `pyproject.toml`, `core/settings_file.py`),
and the options given here. An option left out is None and overrides nothing, so the defaults
live in one place. Exit codes: `cli/exit_codes.py`. Bad input is one line on stderr that names
the fix, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

import kernelwright
from kernelwright.cli.entry import fail
from kernelwright.cli.entry import resolved as _resolved
from kernelwright.cli.entry import settings as _settings
from kernelwright.cli.exit_codes import ExitCode
from kernelwright.cli.help import PlainCommand, PlainGroup
from kernelwright.cli.options import (
    ApiKeyEnv,
    Atol,
    BaseUrl,
    Coder,
    Config,
    Device,
    Draws,
    Gpus,
    Judge,
    KernelBench,
    PriceFile,
    Problem,
    Quiet,
    RayAddress,
    RequestTimeout,
    Retries,
    Rtol,
    Seed,
    StoreFile,
    Temperature,
    Trials,
    Verbose,
)
from kernelwright.core.config import EvalConfig, ServeConfig, Settings

_Command, _Group = PlainCommand, PlainGroup  # help without type tags or markup loss (cli/help.py)


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Write custom GPU kernels for PyTorch code, and prove each one correct and fast.",
)

err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        print(f"kernelwright {kernelwright.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        None, "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
    ),
) -> None:
    """kernelwright: custom kernels for PyTorch code, verified and timed in isolation."""


# ---- shared pieces ------------------------------------------------------------------------------


def _verbosity(quiet: bool, verbose: bool) -> int:
    from kernelwright.cli.console import NORMAL, QUIET, VERBOSE

    if quiet and verbose:
        fail("--quiet and --verbose exclude each other; pass one")
    return QUIET if quiet else VERBOSE if verbose else NORMAL


def _problem_file(problem: Path, kernelbench: str | None) -> Path:
    """PROBLEM as a file: itself, or (with --kernelbench) the KernelBench problem it names."""
    from kernelwright.cli.kernelbench import KernelBenchError, parse_id, resolve

    if kernelbench:
        from kernelwright.store.queries import default_store

        try:
            problem = resolve(str(problem), kernelbench, default_store().parent / "kernelbench")
        except KernelBenchError as exc:
            fail(str(exc))
    elif not problem.exists() and parse_id(str(problem)):
        fail(
            f"problem file not found: {problem}; a KernelBench id needs --kernelbench PATH "
            "(a checkout, or ScalingIntelligence/KernelBench)"
        )
    _source_file(problem, "problem")
    return problem


def _source_file(path: Path, what: str) -> None:
    """A problem or candidate path that is not a readable file: one line naming the fix."""
    if path.is_dir():
        fail(f"{what} {path} is a directory; pass the {what}'s .py file")
    if not path.is_file():
        fail(f"{what} file not found: {path}; check the path")


# ---- eval ---------------------------------------------------------------------------------------


@app.command("eval", cls=_Command)
def eval_cmd(
    problem: Problem,
    candidate: Path = typer.Argument(..., metavar="CANDIDATE", help="Candidate file defining ModelNew."),
    device: Device = None,
    trials: int = typer.Option(
        None, metavar="N", help="Correctness trials, each with a fresh seed and fresh inputs (default 5)."
    ),
    atol: Atol = None,
    rtol: Rtol = None,
    seed: Seed = None,
    compare_compile: bool = typer.Option(
        None, "--compare-compile/--no-compare-compile", metavar="", help="Also time torch.compile of the reference."
    ),
    draws: Draws = None,
    sandbox: str = typer.Option(None, metavar="auto|bwrap|none", help="Isolation of the evaluation (default auto)."),
    verdict: str = typer.Option(
        None,
        metavar="calibrated|strict",
        help="calibrated (float64 oracle, docs/VERDICTS.md; the default) or strict (allclose).",
    ),
    shapes: str = typer.Option(
        None,
        metavar="check|strict|off",
        help="Also judge a passed candidate at other sizes of the problem (default check: "
        "a failure there is flagged shape_specific; strict: it fails; off: not checked).",
    ),
    sanitize: bool = typer.Option(
        None,
        "--sanitize/--no-sanitize",
        metavar="",
        help="Run a passed CUDA candidate once under compute-sanitizer memcheck "
        "(memory_error on an out-of-bounds or misaligned access).",
    ),
    profile: bool = typer.Option(
        None,
        "--profile/--no-profile",
        metavar="",
        help="Profile a correct candidate's kernels (ncu where it works, else torch.profiler).",
    ),
    profile_tool: str = typer.Option(None, "--profile-tool", metavar="auto|ncu|torch", help="Profiler (default auto)."),
    json_out: bool = typer.Option(
        False, "--json", metavar="", help="Print the result record as JSON on stdout, and nothing else."
    ),
    kernelbench: KernelBench = None,
    fail_on: str = typer.Option(
        None,
        "--fail-on",
        metavar="VERDICT,...",
        help="Exit 3 when the verdict is one of these (for CI), e.g. incorrect,compile_error; "
        "'failed': any but passed.",
    ),
    use_server: bool = typer.Option(
        True,
        "--server/--no-server",
        metavar="",
        help="Hand the evaluation to a running `kernelwright serve` (warm: no start-up); where none "
        "answers, evaluate here and start one after (serve.autostart, on a GPU by default). "
        "--no-server: here, and start none.",
    ),
    config: Config = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Build, check and time CANDIDATE against PROBLEM in an isolated child process."""
    verbosity = _verbosity(quiet, verbose)
    failing = _verdicts(fail_on)
    problem = _problem_file(problem, kernelbench)
    _source_file(candidate, "candidate")
    settings = _settings(
        config,
        {
            "eval": {
                "device": device,
                "trials": trials,
                "atol": atol,
                "rtol": rtol,
                "seed": seed,
                "sandbox": sandbox,
                "verdict": verdict,
                "shapes": shapes,
                "sanitize": sanitize,
                "timing": {"compare_compile": compare_compile, "draws": draws},
                "profile": {"enabled": profile, "tool": profile_tool},
            }
        },
    )
    if not settings.given("eval.profile.roofline"):  # evidence (roofline, GPU facts) only where asked: --profile
        settings.eval.profile.roofline = settings.eval.profile.enabled
    cfg = _resolved(settings.eval)
    from kernelwright.cli.console import EvalProgress, out_console, render_result
    from kernelwright.engine import EngineError

    served = [False]
    try:
        if json_out:
            result = _evaluate_here_or_served(problem, candidate, cfg, use_server, None, served)
        else:
            with EvalProgress(err, verbosity) as progress:
                result = _evaluate_here_or_served(problem, candidate, cfg, use_server, progress.stage, served)
    except EngineError as exc:
        fail(str(exc))
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        render_result(result, out_console(), evidence=cfg.profile.enabled, verbosity=verbosity)
    if use_server and not served[0]:  # after the result: a person reads the verdict first
        sys.stdout.flush()
        _start_server(cfg, settings.serve, quiet=verbosity < 0)
    if result.status.value in failing:
        raise typer.Exit(int(ExitCode.VERDICT))


def _evaluate_here_or_served(
    problem: Path, candidate: Path, cfg: EvalConfig, use_server: bool, on_stage, served: list[bool]
):
    """The evaluation by a running `kernelwright serve` for the device where one answers, else here.
    `served[0]`: a server answered (or one runs that must not be replaced: another user's, another
    namespace's)."""
    from kernelwright.engine import evaluate, prestart

    if use_server:
        from kernelwright.executors.eval_server import ServerRefused, stop_server, submit

        try:
            result = submit(problem, candidate, cfg, on_stage=on_stage)
        except ServerRefused as exc:
            if exc.stale and stop_server(cfg.device) is not None:  # other code of this user's: replaced after
                err.print("[yellow]note:[/] stopped the server (it ran other kernelwright code); evaluating here")
            else:
                served[0] = True
                err.print(
                    f"[yellow]note:[/] the running server did not take the job ({escape(str(exc))}); evaluating here"
                )
            result = None
        if result is not None:
            served[0] = True
            return result
    # the child starts up (python, torch, CUDA) while this process checks the problem and the device
    spare = prestart(cfg)
    return evaluate(problem, candidate, cfg, spare=spare, on_stage=on_stage)


def _start_server(cfg: EvalConfig, serve: ServeConfig, quiet: bool) -> None:
    """After an evaluation no server took: a server for the device in the background, where
    `serve.autostart` asks for one (`--no-server` never gets here)."""
    if serve.autostart == "never" or (serve.autostart == "cuda" and cfg.device != "cuda"):
        return
    if serve.autostart == "cuda" and os.environ.get("CI"):  # a CI job's step: nothing left behind it
        return
    from kernelwright.executors.eval_server import start_detached

    try:
        log = start_detached(cfg, spares=serve.spares, idle_s=serve.idle_minutes * 60)
    except OSError as exc:  # the evaluation is done and printed: a server that cannot start is only a note
        err.print(f"[yellow]note:[/] no evaluation server started ({escape(str(exc))})")
        return
    if not quiet:
        err.print(
            f"[dim]started `kernelwright serve` for {cfg.device} in the background: the next eval skips its "
            f"start-up; it stops after {serve.idle_minutes:g} idle minutes (now: kernelwright serve --stop; "
            f'never: --no-server or serve.autostart = "never"; log {log})[/]',
            highlight=False,
            soft_wrap=True,
        )


def _verdicts(fail_on: str | None) -> set[str]:
    """`--fail-on incorrect,compile_error`: the verdicts that make `eval` exit 3 ('failed': every one but passed)."""
    from kernelwright.core.record import Status

    if not fail_on:
        return set()
    known = [s.value for s in Status]
    names = {n.strip() for n in fail_on.split(",") if n.strip()}
    if "failed" in names:
        names = (names - {"failed"}) | (set(known) - {"passed"})
    unknown = sorted(names - set(known))
    if unknown:
        fail(
            f"--fail-on {fail_on}: unknown verdict {', '.join(unknown)}; pass some of {', '.join(known)} (or 'failed')"
        )
    return names


# ---- optimize -----------------------------------------------------------------------------------


@app.command("optimize", cls=_Command)
def optimize_cmd(
    problem: Problem,
    coder: Coder = None,
    judge: Judge = None,
    rounds: int = typer.Option(None, metavar="N", help="Round limit (default 10)."),
    backend: str = typer.Option(
        None,
        metavar="cuda|triton|cpp",
        help="Kernel language the Coder writes (default: cuda on a GPU, cpp on the CPU).",
    ),
    device: Device = None,
    out: Path = typer.Option(
        None, metavar="DIR", help="Run directory to write (default: runs/NAME-DATE-TIME); must be new or empty."
    ),
    resume: Path = typer.Option(
        None, "--resume", metavar="RUN", help="Continue this run directory after its last finished round."
    ),
    store: StoreFile = None,
    name: str = typer.Option(
        None,
        "--name",
        metavar="NAME",
        help="The run's name in the store and its folder (default: the problem file's name, "
        "or its folder's for a problem.py).",
    ),
    base_url: BaseUrl = None,
    target_speedup: float = typer.Option(
        None, "--target-speedup", metavar="X", help="Stop once a verified candidate is this much faster."
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", metavar="N", help="Token budget for the whole run."),
    max_cost: float = typer.Option(
        None, "--max-cost", metavar="USD", help="Cost budget in USD (calls with a known price)."
    ),
    max_minutes: float = typer.Option(None, "--max-minutes", metavar="MIN", help="Wall-time budget."),
    api_key_env: ApiKeyEnv = None,
    price_file: PriceFile = None,
    temperature: Temperature = None,
    request_timeout: RequestTimeout = None,
    retries: Retries = None,
    trials: Trials = None,
    draws: Draws = None,
    atol: Atol = None,
    rtol: Rtol = None,
    verdict: str = typer.Option(
        None, metavar="calibrated|strict", help="calibrated (the default) or strict (allclose)."
    ),
    seed: Seed = None,
    profile: bool = typer.Option(
        None,
        "--profile/--no-profile",
        metavar="",
        help="Profile every correct candidate for the Judge (on by default).",
    ),
    profile_tool: str = typer.Option(
        None,
        "--profile-tool",
        metavar="auto|ncu|torch",
        help="auto (ncu where it works, else torch.profiler; the default), ncu or torch.",
    ),
    sandbox: str = typer.Option(None, metavar="auto|bwrap|none", help="Isolation of each evaluation (default auto)."),
    min_improvement: float = typer.Option(
        None,
        "--min-improvement",
        metavar="F",
        help="A new best must be this fraction faster than the old, and clear its timing spread (default 0.02).",
    ),
    json_out: bool = typer.Option(
        False, "--json", metavar="", help="Print the run's summary as JSON on stdout, and nothing else there."
    ),
    candidates: int = typer.Option(
        None,
        "--candidates",
        metavar="K",
        help="Coder answers per round (best-of-k), evaluated across the GPUs (default 1).",
    ),
    executor: str = typer.Option(
        "serial",
        "--executor",
        metavar="serial|local|ray",
        help="Where evaluations run: serial, local (a worker per GPU) or ray.",
    ),
    gpus: Gpus = None,
    ray_address: RayAddress = None,
    kernelbench: KernelBench = None,
    config: Config = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Let a Coder and a Judge write, repair and speed up kernels for PROBLEM, round by round."""
    verbosity = _verbosity(quiet, verbose)
    problem = _problem_file(problem, kernelbench)
    settings = _settings(
        config,
        {
            "eval": {
                "device": device,
                "trials": trials,
                "atol": atol,
                "rtol": rtol,
                "verdict": verdict,
                "seed": seed,
                "sandbox": sandbox,
                "profile": {"tool": profile_tool},
                "timing": {"draws": draws},
            },
            "loop": {
                "rounds": rounds,
                "backend": backend,
                "target_speedup": target_speedup,
                "max_tokens": max_tokens,
                "max_cost_usd": max_cost,
                "max_wall_s": max_minutes * 60 if max_minutes is not None else None,
                "min_improvement": min_improvement,
                "profile": profile,
                "candidates": candidates,
            },
            "model": {
                "coder": coder,
                "judge": judge,
                "base_url": base_url,
                "api_key_env": api_key_env,
                "temperature": temperature,
                "price_file": str(price_file) if price_file else None,
                "retry": {"max_attempts": retries, "request_timeout_s": request_timeout},
            },
        },
    )
    code = run_optimize(
        problem,
        settings,
        out,
        verbosity=verbosity,
        json_out=json_out,
        executor=executor,
        gpus=gpus,
        ray_address=ray_address,
        resume=resume,
        store=store,
        name=name,
    )
    raise typer.Exit(int(code))


def run_optimize(
    problem: Path,
    settings: Settings,
    out: Path | None,
    *,
    verbosity: int,
    json_out: bool,
    executor: str = "serial",
    gpus: str | None = None,
    ray_address: str | None = None,
    resume: Path | None = None,
    store: Path | None = None,
    name: str | None = None,
) -> ExitCode:
    """Set the run up from `settings` (one-line errors, exit 2), run it, say how it ended."""
    from kernelwright.cli.console import QUIET, judge_defaults_warning
    from kernelwright.engine import EngineError
    from kernelwright.executors.evaluator import ExecutorEvaluator
    from kernelwright.executors.factory import make_executor
    from kernelwright.executors.placement import parse_gpus
    from kernelwright.loop.forge import Forge, engine_evaluator
    from kernelwright.models import ModelSetupError, resolve_model
    from kernelwright.models.backend_spec import resolve_coders
    from kernelwright.store.rundir import RunDir, RunDirError, default_run_dir, problem_name, read_summary

    cfg, eval_cfg, model_cfg = settings.loop, settings.eval, settings.loop.model
    if not model_cfg.coder:
        fail(
            "no Coder model given; pass --coder (openai:MODEL, anthropic:MODEL, replay:RUN_DIR) "
            "or set coder under [model] in kernelwright.toml"
        )
    if name is not None and (not name.strip() or "/" in name or "\\" in name or name.startswith(".")):
        fail(f"--name {name!r}: a run's name is one folder name; pass letters, digits, - or _")
    eval_cfg.profile.enabled = cfg.profile  # the raw ncu files of each round go to its folder (engine_evaluator)
    asked_sandbox = eval_cfg.sandbox  # the run records what was asked; its evaluations, what ran
    eval_cfg = _resolved(eval_cfg)  # bwrap asked for and missing: said before any model call
    device = eval_cfg.device
    if not settings.given("loop.backend"):
        cfg.backend = "cpp" if device == "cpu" else "cuda"
    evaluate = None
    try:
        if model_cfg.prompt_dir:  # a typo in a template's name: said now, not after the first round
            from kernelwright.models.prompts import check_prompt_dir

            check_prompt_dir(model_cfg.prompt_dir)
        coders = resolve_coders(model_cfg.coder, model_cfg, cfg.candidates)
        coder_model = coders[0]
        judge_model = resolve_model(model_cfg.judge or model_cfg.coder, "judge", model_cfg)
        gpu_list = parse_gpus(gpus)
        evaluate = (
            engine_evaluator(eval_cfg)
            if executor == "serial" and not gpu_list and cfg.candidates == 1
            else ExecutorEvaluator(make_executor(executor, eval_cfg, gpu_list, ray_address))
        )
        done = []
        run_dir = None
        if resume is not None:
            from kernelwright.cli.resume import reopen

            run_dir, done = reopen(resume, problem)
        run_dir = run_dir or RunDir(
            out or default_run_dir(problem, name=name),
            problem,
            {
                "name": name or problem_name(problem),
                "coder": coder_model.name,
                "judge": judge_model.name,
                "backend": cfg.backend,
                "device": device,
                "round_limit": cfg.rounds,
                "target_speedup": cfg.target_speedup,
                "trials": eval_cfg.trials,
                "atol": eval_cfg.atol,
                "rtol": eval_cfg.rtol,
                "verdict": eval_cfg.verdict,
                "seed": eval_cfg.seed,
                "profile": eval_cfg.profile.tool if cfg.profile else "off",
                "sandbox": asked_sandbox,
                "min_improvement": cfg.min_improvement,
                "spread_factor": cfg.spread_factor,
                "settings_file": settings.source,
                "candidates": cfg.candidates,
                "coders": [m.name for m in coders],
                "executor": executor,
                "gpus": gpus,
            },
        )
    except (ValueError, EngineError, ModelSetupError, RunDirError) as exc:
        if evaluate is not None:
            evaluate.close()  # workers of an executor already started
        fail(str(exc))
    if verbosity > QUIET:
        source = f"  settings {settings.source}" if settings.source else ""
        err.print(
            f"[bold]kernelwright optimize[/] {problem}  coder {coder_model.name}  judge {judge_model.name}  "
            f"backend {cfg.backend}  device {device}{source}  → {run_dir.path}",
            highlight=False,
            soft_wrap=True,
        )
        warning = judge_defaults_warning(model_cfg.coder, model_cfg.judge)
        if warning:
            err.print(f"[yellow]{escape(warning)}[/]", highlight=False, soft_wrap=True)
    from kernelwright.cli.resume import indexed

    recorder = indexed(run_dir, store)
    forge = Forge(problem, coder_model, judge_model, evaluate, cfg, device=device, recorder=recorder, coders=coders)
    if done:
        forge.restore(done, wall_s=float(read_summary(run_dir.path).get("wall_s") or 0.0))
        if verbosity > QUIET:
            best = forge.state.best
            so_far = (
                f"{best.speedup:.3f}x"
                if best is not None and best.speedup is not None
                else ("untimed" if best is not None else "none yet")
            )
            err.print(f"resuming after round {len(done) - 1} (best so far {so_far})", highlight=False)
    return _run_forge(forge, recorder, run_dir.path, rounds=cfg.rounds, verbosity=verbosity, json_out=json_out)


def _run_forge(forge, recorder, run_path: Path, *, rounds: int, verbosity: int, json_out: bool) -> ExitCode:
    """Run the rounds with their progress shown, then the summary: written, and printed as asked."""
    from kernelwright.cli.console import QUIET, LoopProgress, out_console, render_run, run_line
    from kernelwright.engine import EngineError

    try:
        with LoopProgress(err, rounds, verbosity) as progress:
            forge.on_progress = progress.update
            state = forge.run()
    except KeyboardInterrupt:
        err.print(f"interrupted; the rounds so far are in {run_path}", highlight=False)
        return ExitCode.INTERRUPTED
    except EngineError as exc:
        err.print(
            f"[bold red]stopped:[/] {escape(str(exc))} (the rounds so far are in {run_path})",
            highlight=False,
            soft_wrap=True,
        )
        return ExitCode.STOPPED
    summary = recorder.write_summary(state, final=True)
    if json_out:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    elif verbosity == QUIET:
        out_console().print(run_line(summary, run_path), highlight=False, soft_wrap=True, markup=False)
    else:
        render_run(summary, run_path, out_console())
    return ExitCode.OK if summary["state"] == "finished" else ExitCode.STOPPED


# whole suites, the run store's listing and reports: commands in their own modules
from kernelwright.cli import report_cmds, serve_cmds, suite_cmds  # noqa: E402

app.add_typer(suite_cmds.app, name="suite")
report_cmds.register(app)
serve_cmds.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
