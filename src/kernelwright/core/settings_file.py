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

Trust (as git's `safe.directory`): the search passes over a file the user does not own, and one in
a folder that others may write (group or world writable: /tmp), saying so in one line on stderr,
and goes on upwards; a candidate evaluated with `--sandbox none` runs as the user and could plant
one there. A file given with `--config` is read as given. A file that lowers the evaluation's
protection (`protection_lowered`) says so on stderr each time it is read, and every record names
its settings file and what its configuration lowers (`metadata["settings"]`).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig, GuardConfig, Settings
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


MAX_TOLERANCE = 1e-1  # an atol or rtol above this lowers the protection (a wrong kernel passes)


def _others_may_write(st: os.stat_result) -> bool:
    """Whether a user other than this one may write a file or folder with this status: anyone may
    (world-writable), or its group may and the group is not this user's own private group (the
    user's primary group with no other member, as `umask 002` systems give every user)."""
    if st.st_mode & stat.S_IWOTH:
        return True
    if not st.st_mode & stat.S_IWGRP:
        return False
    if st.st_gid != os.getgid():
        return True
    try:
        import grp
        import pwd

        me = pwd.getpwuid(os.getuid()).pw_name
        return bool(set(grp.getgrgid(st.st_gid).gr_mem) - {me})
    except (ImportError, KeyError):
        return True


def untrusted_because(path: Path) -> str:
    """Why a settings file found by the search is not read ('' where it may be): another user owns
    it, or others may write it or its folder (they could have put it there)."""
    try:
        st, folder = os.stat(path), os.stat(path.parent)
    except OSError as exc:
        return f"it cannot be checked ({exc.strerror})"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to this user"
    if _others_may_write(folder):
        return f"its folder may be written by others (mode {stat.filemode(folder.st_mode)})"
    if _others_may_write(st):
        return f"it may be written by others (mode {stat.filemode(st.st_mode)})"
    return ""


def _announce(message: str) -> None:
    print(f"kernelwright: {message}", file=sys.stderr, flush=True)


def find_settings_file(start: Path | None = None) -> Path | None:
    """The nearest kernelwright.toml, or pyproject.toml with [tool.kernelwright], from `start`
    upwards, passing over (in one line on stderr) a file that `untrusted_because` refuses."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for candidate in (folder / FILE_NAME, folder / PYPROJECT):
            if not candidate.is_file() or (candidate.name == PYPROJECT and not _has_our_table(candidate)):
                continue
            why = untrusted_because(candidate)
            if not why:
                return candidate
            _announce(f"passed over the settings file {candidate}: {why}; use --config FILE to read it anyway")
    return None


def _has_our_table(pyproject: Path) -> bool:
    """Whether a pyproject.toml has a [tool.kernelwright] table (one that cannot be read: yes, so
    that its error is said, unless it is passed over)."""
    try:
        return "kernelwright" in _read_toml(pyproject).get("tool", {})
    except SettingsError:
        return not untrusted_because(pyproject)


def protection_lowered(cfg: EvalConfig) -> list[str]:
    """What of the evaluation's protection `cfg` turns off or loosens, each said in a few words."""
    out = []
    if cfg.sandbox == "none":
        out.append('sandbox = "none"')
    if not cfg.guards.enabled:
        out.append("guards off")
    out += [f"{name} = {getattr(cfg, name):g}" for name in ("atol", "rtol") if getattr(cfg, name) > MAX_TOLERANCE]
    dropped = [f for f in GuardConfig().fail_on if f not in cfg.guards.fail_on]
    if dropped:
        kept = cfg.guards.fail_on
        out.append(f"guards.fail_on without {', '.join(dropped)}" if kept else "guards.fail_on emptied")
    if not cfg.build.trusted_cache:
        out.append("build.trusted_cache off")
    return out


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
        settings.eval.settings_file = str(path.resolve())
        lowered = protection_lowered(settings.eval)
        if lowered:
            _announce(f"the settings file {path} lowers the evaluation's protection: {'; '.join(lowered)}")
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
        if key not in fields or (where, key) == ("eval", "settings_file"):
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
