"""Help as people read it, for every command (those registered by other modules included):
`PROBLEM CANDIDATE` in the usage line (typer writes `{problem}`), no type tag after an argument's
name, none (`<bool>`) after a flag, and a plain word (N, X, PATH, TEXT) instead of `<list[str]>`
after an option that names no metavar.

Help is plain text wrapped to the terminal (at most 80 columns), never a table whose cells are
cut: an option and its value on the left, its description wrapped beside or below it, options
grouped in sections by name (`_SECTIONS`, unless the option names its own `rich_help_panel`;
"Options" for the rest). A usage error
(an option's value that does not parse, an unknown option) is one line on stderr, `error: ...`,
naming the command's --help, and exits 2, as every other bad value does.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# click's exceptions, whether typer vendors click (typer._click) or uses the package
UsageError = sys.modules[typer.BadParameter.__module__].UsageError

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


# The sections of an option's help, by its name; an option not named here is under "Options".
_SECTIONS = {
    "Correctness": "--trials --atol --rtol --seed --verdict --shapes --sanitize",
    "Timing and profiling": "--compare-compile --draws --profile --profile-tool",
    "Models": "--coder --judge --base-url --api-key-env --price-file --temperature --request-timeout --retries",
    "Limits": "--rounds --target-speedup --max-tokens --max-cost --max-minutes --min-improvement --candidates",
    "Where evaluations run": "--executor --gpus --ray-address --build-workers --parallel --server",
    "Run store": "--store --name --out --resume",
}
_SECTION_OF = {opt: title for title, opts in _SECTIONS.items() for opt in opts.split()}


def plain_help(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and not getattr(param, "rich_help_panel", None):
            param.rich_help_panel = next((_SECTION_OF[o] for o in param.opts if o in _SECTION_OF), None)
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            param._usage_display_name = lambda name=name: name  # type: ignore[method-assign, misc]
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = _word(param)
    return params


def _sections(cmd: Any, ctx: Any, formatter: Any) -> None:
    """Arguments, then the options section by section, each a wrapped two-column list."""
    args: list[tuple[str, str]] = []
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in cmd.get_params(ctx):
        row = param.get_help_record(ctx)
        if row is None:
            continue
        if param.param_type_name == "argument":
            args.append(row)
        else:
            panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(row)
    if args:
        with formatter.section("Arguments"):
            formatter.write_dl(args)
    order = ["Options", *_SECTIONS]  # then any section a command names itself
    for title, rows in sorted(panels.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        with formatter.section(title):
            formatter.write_dl(rows)


def _options_and_commands(cmd: Any, ctx: Any, formatter: Any) -> None:
    _sections(cmd, ctx, formatter)
    if hasattr(cmd, "commands"):  # a group
        _commands(cmd, ctx, formatter)


def _commands(group: Any, ctx: Any, formatter: Any) -> None:
    """A group's commands, each with its whole short help, wrapped (click's own cuts it with "...")."""
    rows = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            rows.append((name, cmd.get_short_help_str(limit=10_000)))
    if rows:
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class UsageLine(UsageError):  # type: ignore[misc, valid-type]
    """A usage error shown as one line: `error: <what>; see `<command> --help``."""

    def show(self, file: Any = None) -> None:
        where = f" (see `{self.ctx.command_path} --help`)" if self.ctx is not None else ""
        typer.echo(f"error: {self.message}{where}", err=True)


def _one_line(exc: Any) -> Any:
    """The usage error in one line: for a value that does not parse, the option, what went wrong
    and the form it takes ("--trials: ...; pass --trials N")."""
    if isinstance(exc, UsageLine) or type(exc).__name__ == "NoArgsIsHelpError":  # that one's message is the help
        return exc
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None)
    if opts and exc.message and getattr(param, "param_type_name", "") == "option":  # a value that does not parse
        what = " ".join(str(exc.message).split()).rstrip(".")
        form = f"{opts[0]} {getattr(param, 'metavar', None) or 'VALUE'}".rstrip()
        what = f"{opts[0]}: {what[:1].lower()}{what[1:]}; pass {form}"
    else:
        what = " ".join(exc.format_message().split()).rstrip(".")
        what = what[:1].lower() + what[1:]
    return UsageLine(what, exc.ctx)


def _usage_in_one_line(method: Any) -> Any:
    """`method` (parse_args, resolve_command), its usage errors shown in one line."""

    def wrapped(*args: Any) -> Any:
        try:
            return method(*args)
        except UsageError as exc:
            raise _one_line(exc) from None

    return wrapped


def _plain_tree(cmd: Any) -> Any:
    """Plain help for a command another module built (a sub-typer's group and its commands)."""
    if getattr(cmd, "_kw_plain", False) or isinstance(cmd, (PlainCommand, PlainGroup)):
        return cmd
    get_params = cmd.get_params
    cmd.get_params = lambda ctx: plain_help(get_params(ctx))  # type: ignore[method-assign]
    cmd.rich_markup_mode = None  # click's formatter: wrapped, never cut
    cmd.parse_args = _usage_in_one_line(cmd.parse_args)
    if hasattr(cmd, "commands"):  # a group
        get_command = cmd.get_command
        cmd.get_command = lambda ctx, name: _plain_or_none(get_command(ctx, name))  # type: ignore[method-assign]
        cmd.resolve_command = _usage_in_one_line(cmd.resolve_command)
    cmd.format_options = lambda ctx, f: _options_and_commands(cmd, ctx, f)
    cmd._kw_plain = True  # type: ignore[attr-defined]
    return cmd


def _plain_or_none(cmd: Any) -> Any:
    return None if cmd is None else _plain_tree(cmd)


class _Plain:
    """What every command of ours shares: click's plain formatter, plain parameters, sections, and
    usage errors in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "rich_markup_mode": None})  # click's formatter: wrapped, never cut

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_help(super().get_params(ctx))  # type: ignore[misc]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _options_and_commands(self, ctx, formatter)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return _usage_in_one_line(super().parse_args)(ctx, args)  # type: ignore[misc]


class PlainCommand(_Plain, TyperCommand):
    pass


class PlainGroup(_Plain, TyperGroup):
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return _plain_or_none(super().get_command(ctx, cmd_name))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        return _usage_in_one_line(super().resolve_command)(ctx, args)
