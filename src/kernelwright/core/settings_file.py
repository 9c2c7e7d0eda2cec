"""The settings file: what a team shares (models, base URL, tolerances, budgets, prices), read into
the one typed configuration (`core.config.Settings`). Standard library only (`tomllib`).

    # kernelwright.toml                      # or pyproject.toml, same keys under [tool.kernelwright.*]
    [model]                                  # -> LoopConfig.model (ModelConfig)
    coder = "openai:gpt-5"
    base_url = "http://gpu-box:8000/v1"
    [model.retry]                            # -> RetryPolicy
    max_attempts = 3
    [model.prices]                           # model -> USD per million tokens, over the built-in table
    "qwen2.5-coder:32b" = {input = 0, output = 0}
    [loop]                                   # -> LoopConfig
    rounds = 6
    max_cost_usd = 5.0
    [eval]                                   # -> EvalConfig (and its tables: [eval.timeouts], [eval.numerics], ...)
    atol = 1e-2
    rtol = 1e-2
    [serve]                                  # -> ServeConfig (the server `kernelwright eval` starts)
    autostart = "never"

Where: `--config FILE`, else the nearest `kernelwright.toml` in the current directory or one of
its parents, else the nearest `pyproject.toml` there that has a `[tool.kernelwright]` table
(a `kernelwright.toml` wins over a `pyproject.toml` in the same directory). Layers: the
dataclasses' defaults, then the file, then the command line (only the options actually given).
An unknown key or a value of the wrong type is a one-line `SettingsError` naming the key and
the file. Relative paths in the file (`model.price_file`, `eval.cache_dir`) are read from the
file's directory.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

from kernelwright.core.config import Settings
from kernelwright.core.config import coerce as coerce_field

FILE_NAME = "kernelwright.toml"
PYPROJECT = "pyproject.toml"
# file section -> attribute path inside Settings
SECTIONS: dict[str, tuple[str, ...]] = {
    "eval": ("eval",),
    "loop": ("loop",),
    "model": ("loop", "model"),
    "serve": ("serve",),
}
PATH_KEYS = {("model", "price_file"), ("model", "prompt_dir"), ("eval", "cache_dir")}


class SettingsError(ValueError):
    """The settings file cannot be used. One line naming the key (or the file) and the fix."""


def find_settings_file(start: Path | None = None) -> Path | None:
    """The nearest kernelwright.toml, or pyproject.toml with [tool.kernelwright], from `start` upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / FILE_NAME
        if own.is_file():
            return own
        py = folder / PYPROJECT
        if py.is_file() and "kernelwright" in _read_toml(py).get("tool", {}):
            return py
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}); fix the file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read settings file {path} ({exc}); check the path") from None


def read_settings_file(path: Path) -> dict[str, Any]:
    """The kernelwright table of `path` (the whole file, or pyproject's [tool.kernelwright])."""
    if not path.is_file():
        raise SettingsError(f"settings file not found: {path}; check the path given to --config")
    data = _read_toml(path)
    if path.name == PYPROJECT:
        data = data.get("tool", {}).get("kernelwright")
        if not isinstance(data, dict):
            raise SettingsError(f"{path} has no [tool.kernelwright] table; add one or pass a kernelwright.toml")
    return data


def load_settings(
    config_file: Path | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    start: Path | None = None,
    search: bool = True,
) -> Settings:
    """Defaults, then the settings file (`config_file`, or the one found from `start`), then `overrides`
    (the command line: {section: {key: value}}, same sections as the file). Validated."""
    settings = Settings()
    path = config_file or (find_settings_file(start) if search else None)
    if path is not None:
        label = f"{path}" + (" [tool.kernelwright]" if path.name == PYPROJECT else "")
        apply_table(settings, read_settings_file(path), label, base_dir=path.resolve().parent)
        settings.source = str(path)
    if overrides:
        # typed already by the command line's parser; its values are checked by validate(), whose
        # messages name the options (--sandbox ...), not the file's keys
        apply_table(settings, overrides, "the command line", coerce=False)
    try:
        settings.validate()
    except ValueError as exc:
        where = f" (settings from {settings.source})" if settings.source else ""
        raise SettingsError(f"{exc}{where}") from None
    return settings


def apply_table(
    settings: Settings, table: dict[str, Any], label: str, base_dir: Path | None = None, coerce: bool = True
) -> None:
    for section, values in table.items():
        if section not in SECTIONS:
            raise SettingsError(f"{label}: unknown section [{section}]; known: {', '.join(f'[{s}]' for s in SECTIONS)}")
        if not isinstance(values, dict):
            raise SettingsError(f"{label}: '{section}' must be a table ([{section}]), not a value")
        target: Any = settings
        for attr in SECTIONS[section]:
            target = getattr(target, attr)
        if base_dir is not None:
            values = {
                k: (str((base_dir / v).expanduser()) if (section, k) in PATH_KEYS and isinstance(v, str) else v)
                for k, v in values.items()
            }
        _apply(target, values, section, label, coerce)
        settings.explicit |= _keys(section, values)
        if section == "model" and "prices" in values:
            _check_prices(values["prices"], label)


def _check_prices(prices: dict[str, Any], label: str) -> None:
    for model, price in prices.items():
        if not (
            isinstance(price, dict)
            and set(price) == {"input", "output"}
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in price.values())
        ):
            raise SettingsError(
                f"{label}: 'model.prices.{model}' must be {{input = USD/Mtok, output = USD/Mtok}} (got {price!r})"
            )


def _keys(prefix: str, values: dict[str, Any]) -> set[str]:
    """Every key a table sets, nested tables too: {"eval.profile", "eval.profile.roofline", ...}."""
    out = set()
    for k, v in values.items():
        out.add(f"{prefix}.{k}")
        if isinstance(v, dict):
            out |= _keys(f"{prefix}.{k}", v)
    return out


def _apply(obj: Any, values: dict[str, Any], where: str, label: str, coerce: bool = True) -> None:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    for key, value in values.items():
        name = f"{where}.{key}"
        if key not in fields:
            raise SettingsError(f"{label}: unknown key '{name}'; known keys in [{where}]: {', '.join(fields)}")
        if value is None:  # the command line's "not given" never reaches here; None clears an optional
            setattr(obj, key, None)
            continue
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise SettingsError(f"{label}: '{name}' must be a table ([{name}])")
            _apply(current, value, name, label, coerce)
        else:
            setattr(obj, key, _coerce(value, hints[key], name, label) if coerce else value)


def _coerce(value: Any, hint: Any, name: str, label: str) -> Any:
    """`value` checked against the field's type (and converted where TOML's types are narrower)."""
    try:
        return coerce_field(value, hint, name)
    except ValueError as exc:
        raise SettingsError(f"{label}: {exc}") from None
