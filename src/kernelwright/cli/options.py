"""Options that several commands share, each declared once as a typed alias (`typing.Annotated`):
a command names the alias and its default (`gpus: Gpus = None`). An option whose help differs from
one command to another is declared in its command. Where an option's help goes: `help.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kernelwright.cli.help import STORE_HELP

Config = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        dir_okay=False,
        help="Settings file (default: the nearest kernelwright.toml, or pyproject.toml with "
        "[tool.kernelwright], from the current directory up).",
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="One line at the end; no live progress.")]
Verbose = Annotated[
    bool, typer.Option("--verbose", "-v", metavar="", help="Also every stage as it starts, with the time elapsed.")
]
KernelBench = Annotated[
    str | None,
    typer.Option(
        "--kernelbench",
        metavar="PATH_OR_DATASET",
        help="Take PROBLEM as a KernelBench id (level1/19) from a local checkout, a data file, "
        "or the Hugging Face dataset (ScalingIntelligence/KernelBench; needs datasets).",
    ),
]
Problem = Annotated[
    Path,
    typer.Argument(
        metavar="PROBLEM", help="Reference problem (KernelBench format: Model, get_inputs, get_init_inputs)."
    ),
]
StoreFile = Annotated[Path | None, typer.Option("--store", metavar="FILE", help=STORE_HELP)]

# ---- the evaluation (`eval`, `optimize`) -------------------------------------------------------------

Device = Annotated[
    str | None, typer.Option(metavar="cuda|cpu|auto", help="Device (default auto: cuda when a GPU is visible).")
]
Atol = Annotated[float | None, typer.Option(metavar="A", help="Absolute tolerance (default 1e-3).")]
Rtol = Annotated[float | None, typer.Option(metavar="R", help="Relative tolerance (default 1e-3).")]
Seed = Annotated[int | None, typer.Option(metavar="N", help="Base seed for construction and inputs (default 42).")]
Trials = Annotated[int | None, typer.Option(metavar="N", help="Correctness trials per candidate (default 5).")]
Draws = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Whole evaluations of a passed candidate, each in processes of its own; its speed-up is the "
        "median draw's (default 1; a side's time moves a few percent from one process to the next).",
    ),
]

# ---- the Coder and the Judge (`optimize`) ------------------------------------------------------------

Coder = Annotated[
    str | None,
    typer.Option(
        metavar="MODEL",
        help="Coder model: openai:MODEL, anthropic:MODEL, replay:RUN_DIR, or a bare name served "
        "at --base-url (or model.coder in the settings file).",
    ),
]
Judge = Annotated[
    str | None, typer.Option(metavar="MODEL", help="Judge model (same forms as --coder; default: the Coder's model).")
]
BaseUrl = Annotated[
    str | None,
    typer.Option("--base-url", metavar="URL", help="OpenAI-compatible endpoint (vLLM, SGLang, Ollama, a proxy)."),
]
ApiKeyEnv = Annotated[
    str | None,
    typer.Option(
        "--api-key-env",
        metavar="NAME",
        help="Env var that holds the API key (default: OPENAI_API_KEY / ANTHROPIC_API_KEY).",
    ),
]
PriceFile = Annotated[
    Path | None,
    typer.Option("--price-file", metavar="FILE", help="JSON or TOML price table that extends the built-in one."),
]
Temperature = Annotated[float | None, typer.Option(metavar="T", help="Sampling temperature (default: the provider's).")]
RequestTimeout = Annotated[
    float | None,
    typer.Option("--request-timeout", metavar="S", help="Seconds one model request may take (default 600)."),
]
Retries = Annotated[
    int | None,
    typer.Option(metavar="N", help="Attempts per model call: rate limits, server errors, time-outs (default 5)."),
]

# ---- where evaluations run (`optimize`, `suite eval`, `suite optimize`) -------------------------------

Gpus = Annotated[
    str | None, typer.Option("--gpus", metavar="0,1,...", help="GPUs to use (default: every visible GPU).")
]
RayAddress = Annotated[
    str | None, typer.Option("--ray-address", metavar="ADDR", help="Ray cluster to join (default: a local Ray).")
]

# ---- whole suites (`suite eval`, `suite optimize`) -----------------------------------------------------

SuiteOut = Annotated[
    Path | None,
    typer.Option(
        help="Folder for the run directories (default: where the store says this suite's are, else runs/suites/NAME).",
    ),
]
SuiteSandbox = Annotated[str | None, typer.Option(help="auto, bwrap or none.")]
