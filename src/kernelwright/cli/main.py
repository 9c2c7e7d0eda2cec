"""The command line: `kernelwright eval` and `kernelwright optimize` (the forge loop).

Exit codes: 0 when the evaluation ran, whatever the verdict; 2 when the tool itself could not
run (a missing file, a problem not in the format, no GPU for --device cuda), with one line on
stderr that names the fix, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from kernelwright.core.config import EvalConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Write custom GPU kernels for PyTorch code, and prove each one correct and fast.",
)

err = Console(stderr=True)


def fail(message: str) -> None:
    """One line on stderr that names the fix, then exit 2: the tool itself could not run."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)


@app.callback()
def _root() -> None:
    """kernelwright: custom kernels for PyTorch code, verified and timed in isolation."""


@app.command("eval")
def eval_cmd(
    problem: Path = typer.Argument(..., help="Reference problem (KernelBench format: Model, get_inputs, get_init_inputs)."),
    candidate: Path = typer.Argument(..., help="Candidate file defining ModelNew."),
    device: str = typer.Option("auto", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    trials: int = typer.Option(5, help="Correctness trials, each with a fresh seed and fresh inputs."),
    atol: float = typer.Option(1e-3, help="Absolute tolerance."),
    rtol: float = typer.Option(1e-3, help="Relative tolerance."),
    seed: int = typer.Option(42, help="Base seed for construction and inputs."),
    compare_compile: bool = typer.Option(False, "--compare-compile", help="Also time torch.compile of the reference."),
    sandbox: str = typer.Option("auto", help="auto, bwrap or none."),
    verdict: str = typer.Option("calibrated", help="calibrated (float64 oracle, docs/VERDICTS.md) or strict (allclose against the reference)."),
    profile: bool = typer.Option(False, "--profile/--no-profile", help="Profile a correct candidate's kernels (ncu where it works, else torch.profiler)."),
    profile_tool: str = typer.Option("auto", "--profile-tool", help="auto, ncu or torch."),
    json_out: bool = typer.Option(False, "--json", help="Print the result record as JSON on stdout, and nothing else."),
) -> None:
    """Build, check and time CANDIDATE against PROBLEM in an isolated child process."""
    from kernelwright.engine import EngineError, evaluate, prestart
    from kernelwright.cli.console import render_result

    config = EvalConfig(device=device, trials=trials, atol=atol, rtol=rtol, seed=seed, sandbox=sandbox,  # type: ignore[arg-type]
                        verdict=verdict)  # type: ignore[arg-type]
    config.timing.compare_compile = compare_compile
    config.profile.enabled = profile
    config.profile.tool = profile_tool  # type: ignore[assignment]
    try:
        # the child starts up (python, torch, CUDA) while this process checks the problem and the device
        spare = prestart(config)
        if json_out:
            result = evaluate(problem, candidate, config, spare=spare)
        else:
            with err.status("evaluating…") as status:
                result = evaluate(problem, candidate, config, spare=spare,
                                  on_stage=lambda s: status.update(f"evaluating: {s}…"))
    except EngineError as exc:
        fail(str(exc))
        return
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        render_result(result, Console(), evidence=profile)


@app.command("optimize")
def optimize_cmd(
    problem: Path = typer.Argument(..., help="Reference problem (KernelBench format: Model, get_inputs, get_init_inputs)."),
    coder: str = typer.Option(..., help="Coder model: openai:MODEL, anthropic:MODEL, replay:RUN_DIR, or a bare name served at --base-url."),
    judge: str = typer.Option(None, help="Judge model (same forms as --coder; default: the Coder's model)."),
    rounds: int = typer.Option(10, help="Round limit."),
    backend: str = typer.Option(None, help="Kernel language the Coder writes: cuda, triton or cpp (default: cuda on a GPU, cpp on the CPU)."),
    device: str = typer.Option("auto", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    out: Path = typer.Option(None, help="Run directory to write (default: runs/PROBLEM-DATE-TIME); must be new or empty."),
    resume: Path = typer.Option(None, "--resume", help="Continue this run directory after its last finished round."),
    store: Path = typer.Option(None, help="Run store that indexes the run (default: runs/kernelwright.db)."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (vLLM, SGLang, Ollama, a proxy)."),
    target_speedup: float = typer.Option(None, "--target-speedup", help="Stop once a verified candidate is this much faster."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Token budget for the whole run."),
    max_cost: float = typer.Option(None, "--max-cost", help="Cost budget in USD (calls with a known price)."),
    max_minutes: float = typer.Option(None, "--max-minutes", help="Wall-time budget."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="Env var that holds the API key (default: OPENAI_API_KEY / ANTHROPIC_API_KEY)."),
    price_file: Path = typer.Option(None, "--price-file", help="JSON or TOML price table that extends the built-in one."),
    temperature: float = typer.Option(None, help="Sampling temperature (default: the provider's)."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="Seconds one model request may take."),
    retries: int = typer.Option(5, help="Attempts per model call (rate limits, server errors, time-outs)."),
    trials: int = typer.Option(5, help="Correctness trials per candidate."),
    profile: bool = typer.Option(True, "--profile/--no-profile",
                                 help="Profile every correct candidate for the Judge (ncu where it works, else torch.profiler)."),
    profile_tool: str = typer.Option("auto", "--profile-tool", help="auto (ncu where it works, else torch.profiler), ncu or torch."),
    sandbox: str = typer.Option("auto", help="Isolation of each evaluation: auto, bwrap or none."),
    min_improvement: float = typer.Option(0.02, "--min-improvement",
                                          help="A new best must be this fraction faster than the old, and clear its timing spread."),
) -> None:
    """Let a Coder and a Judge write, repair and speed up kernels for PROBLEM, round by round."""
    from kernelwright.core.config import LoopConfig, ModelConfig, ProfileConfig, RetryPolicy
    from kernelwright.engine import EngineError
    from kernelwright.engine import sandbox as sandbox_mod
    from kernelwright.engine.evaluation import check_device
    from kernelwright.loop.forge import Forge, engine_evaluator
    from kernelwright.models import ModelSetupError, resolve_model
    from kernelwright.cli.console import LoopProgress, render_run
    from kernelwright.store.rundir import RunDir, RunDirError, default_run_dir, read_summary

    if not problem.is_file():
        fail(f"problem file not found: {problem}; check the path")
    try:
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        check_device(device)
        model_cfg = ModelConfig(base_url=base_url, api_key_env=api_key_env, temperature=temperature,
                                price_file=str(price_file) if price_file else None,
                                retry=RetryPolicy(max_attempts=retries, request_timeout_s=request_timeout))
        cfg = LoopConfig(rounds=rounds, backend=backend or ("cpp" if device == "cpu" else "cuda"),  # type: ignore[arg-type]
                         target_speedup=target_speedup, max_tokens=max_tokens, max_cost_usd=max_cost,
                         max_wall_s=max_minutes * 60 if max_minutes else None, model=model_cfg,
                         min_improvement=min_improvement)
        cfg.validate()
        # the raw ncu files of each round go to its folder in the run directory (engine_evaluator)
        eval_cfg = EvalConfig(device=device, trials=trials, sandbox=sandbox,  # type: ignore[arg-type]
                              profile=ProfileConfig(enabled=profile, tool=profile_tool))  # type: ignore[arg-type]
        eval_cfg.validate()
        sandbox_mod.resolve(eval_cfg.sandbox)  # bwrap asked for and missing: say so before any model call
        coder_model = resolve_model(coder, "coder", model_cfg)
        judge_model = resolve_model(judge or coder, "judge", model_cfg)
        if resume is not None:
            from kernelwright.cli.resume import reopen

            run_dir, done = reopen(resume, problem)
        else:
            run_dir, done = None, []
        run_dir = run_dir or RunDir(out or default_run_dir(problem), problem, {
            "coder": coder_model.name, "judge": judge_model.name, "backend": cfg.backend, "device": device,
            "round_limit": cfg.rounds, "target_speedup": cfg.target_speedup, "trials": trials,
            "profile": profile_tool if profile else "off", "sandbox": sandbox, "min_improvement": cfg.min_improvement,
            "spread_factor": cfg.spread_factor})
    except (ValueError, EngineError, ModelSetupError, RunDirError, sandbox_mod.SandboxUnavailable) as exc:
        fail(str(exc))
        return
    console = Console(stderr=True)
    console.print(f"[bold]kernelwright optimize[/] {problem}  coder {coder_model.name}  judge {judge_model.name}  "
                  f"backend {cfg.backend}  device {device}  → {run_dir.path}", highlight=False)
    from kernelwright.cli.resume import indexed

    recorder = indexed(run_dir, store)
    forge = Forge(problem, coder_model, judge_model, engine_evaluator(eval_cfg), cfg, device=device, recorder=recorder)
    if done:
        forge.restore(done, wall_s=float(read_summary(run_dir.path).get("wall_s") or 0.0))
        console.print(f"resuming after round {len(done) - 1} (best so far "
                      f"{forge.state.best.speedup if forge.state.best else None})", highlight=False)
    try:
        with LoopProgress(console, cfg.rounds) as progress:
            forge.on_progress = progress.update
            state = forge.run()
    except EngineError as exc:
        fail(f"{exc} (rounds so far are in {run_dir.path})")
        return
    render_run(recorder.write_summary(state, final=True), run_dir.path, Console())


# whole suites, the run store's listing and reports (issue 15): commands in their own modules
from kernelwright.cli import report_cmds, suite_cmds  # noqa: E402

app.add_typer(suite_cmds.app, name="suite")
report_cmds.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
