"""The command line: `kernelwright eval` (and the commands built on it).

Exit codes: 0 when the evaluation ran, whatever the verdict; 2 when the tool itself could not
run (a missing file, a problem not in the format, no GPU for --device cuda), with one line on
stderr that names the fix, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from kernelwright.config import EvalConfig

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
    json_out: bool = typer.Option(False, "--json", help="Print the result record as JSON on stdout, and nothing else."),
) -> None:
    """Build, check and time CANDIDATE against PROBLEM in an isolated child process."""
    from kernelwright.engine import EngineError, evaluate
    from kernelwright.report import render_result

    config = EvalConfig(device=device, trials=trials, atol=atol, rtol=rtol, seed=seed, sandbox=sandbox,  # type: ignore[arg-type]
                        verdict=verdict)  # type: ignore[arg-type]
    config.timing.compare_compile = compare_compile
    try:
        if json_out:
            result = evaluate(problem, candidate, config)
        else:
            with err.status("evaluating…") as status:
                result = evaluate(problem, candidate, config,
                                  on_stage=lambda s: status.update(f"evaluating: {s}…"))
    except EngineError as exc:
        fail(str(exc))
        return
    if json_out:
        sys.stdout.write(result.to_json() + "\n")
    else:
        render_result(result, Console())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
