"""What every command does with what it was given: one-line errors, the settings, "auto" resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from kernelwright.cli.exit_codes import ExitCode
from kernelwright.core.config import EvalConfig, Settings

err = Console(stderr=True)


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> NoReturn:
    """One line on stderr that names the fix, then exit (2: the tool itself could not run)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(int(code))


def settings(config: Path | None, overrides: dict[str, dict[str, Any]]) -> Settings:
    """Defaults < settings file < the options the user gave (None: not given)."""
    from kernelwright.core.settings_file import SettingsError, load_settings

    given = {section: {k: v for k, v in values.items() if v is not None} for section, values in overrides.items()}
    try:
        return load_settings(config, {s: v for s, v in given.items() if v})
    except SettingsError as exc:
        fail(str(exc))


def resolved(config: EvalConfig) -> EvalConfig:
    """The evaluation's configuration with "auto" made concrete (engine/config_resolution.py); one line on error."""
    from kernelwright.engine import EngineError
    from kernelwright.engine.config_resolution import resolve_config

    try:
        return resolve_config(config)
    except EngineError as exc:
        fail(str(exc))
