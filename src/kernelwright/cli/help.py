"""Help as people read it, for every command (those registered by other modules included):
`PROBLEM CANDIDATE` in the usage line (typer writes `{problem}`), no type tag after an argument's
name, none (`<bool>`) after a flag, and a plain word (N, X, PATH, TEXT) instead of `<list[str]>`
after an option that names no metavar."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# every command's --store
STORE_HELP = (
    "Run store that indexes every run (default: $KERNELWRIGHT_STORE, else kernelwright.db in the "
    "user's data directory, ~/.local/share/kernelwright on Linux)."
)


def _word(param: Any) -> str:
    """N, X, PATH, TEXT or the choices: what an option takes, in a word."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and desc.is_choice:
        return "|".join(map(str, desc.choices or ()))
    if desc is not None and desc.is_path:
        return "PATH"
    bare = str(param.bare_type()) if hasattr(param, "bare_type") else ""
    return "N" if "int" in bare else "X" if "float" in bare else "" if "bool" in bare else "TEXT"


def plain_help(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            param._usage_display_name = lambda name=name: name  # type: ignore[method-assign, misc]
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = _word(param)
    return params


def _plain_tree(cmd: Any) -> Any:
    """Plain help for a command another module built (a sub-typer's group and its commands)."""
    if getattr(cmd, "_kw_plain", False) or isinstance(cmd, (PlainCommand, PlainGroup)):
        return cmd
    get_params = cmd.get_params
    cmd.get_params = lambda ctx: plain_help(get_params(ctx))  # type: ignore[method-assign]
    if hasattr(cmd, "commands"):  # a group
        get_command = cmd.get_command
        cmd.get_command = lambda ctx, name: _plain_or_none(get_command(ctx, name))  # type: ignore[method-assign]
    cmd._kw_plain = True  # type: ignore[attr-defined]
    return cmd


def _plain_or_none(cmd: Any) -> Any:
    return None if cmd is None else _plain_tree(cmd)


class PlainCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return plain_help(super().get_params(ctx))


class PlainGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return plain_help(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return _plain_or_none(super().get_command(ctx, cmd_name))
