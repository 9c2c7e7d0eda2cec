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
    """Defaults < settings file < the options the user gave (None: not given, at any depth; a
    section or table left with nothing given is left out)."""
    from kernelwright.core.settings_file import SettingsError, load_settings

    try:
        return load_settings(config, _given(overrides))
    except SettingsError as exc:
        fail(str(exc))


def _given(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        value = _given(value) if isinstance(value, dict) else value
        if value is not None and value != {}:
            out[key] = value
    return out


def resolved(config: EvalConfig) -> EvalConfig:
    """The evaluation's configuration with "auto" made concrete (engine/config_resolution.py); one line on error."""
    from kernelwright.engine import EngineError
    from kernelwright.engine.config_resolution import resolve_config

    try:
        return resolve_config(config)
    except EngineError as exc:
        fail(str(exc))
