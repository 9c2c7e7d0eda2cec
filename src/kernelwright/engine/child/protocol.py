"""What the judge asks of the runner, as typed commands: one dataclass per kind, one line of JSON each.

The judge drives; the runner (the candidate's process) only answers. Commands travel from the
judge through the parent to the runner's stdin, except a timing window, which goes straight on
the pair's socket with the descriptors of its regions (`windows.py`). `parse_command` is the
runner's reader; whatever it cannot read is ignored, never guessed. The runner's reports are
parsed by the judge with `Report.parse`: every field checked, nothing else kept.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar


@dataclass
class Construct:
    """Build ModelNew from the problem's init inputs (a wire file the judge wrote) after seeding torch.
    `label` '': the candidate's model; another label keeps one more model, built for other sizes
    (`shapes.py`), whose failure to construct is reported as a `call_error` under that label."""

    kind: ClassVar[str] = "construct"
    init: str
    seed: int
    label: str = ""


@dataclass
class Call:
    """Call ModelNew once on the inputs in `inputs`; write its output under `label`. `model`: the
    label of a model built by `Construct` ('' the candidate's own). `probe`: a call at another size,
    whose error is reported as a `call_error` and ends nothing (the runner goes on)."""

    kind: ClassVar[str] = "call"
    label: str
    inputs: str
    nan_fill: bool = True
    model: str = ""
    probe: bool = False


@dataclass
class Guards:
    """The guarded calls: one traced call on `inputs` (kept, same tensors), the inputs after it,
    the output after the same tensors were refilled from `refill`, and the first output again."""

    kind: ClassVar[str] = "guards"
    inputs: str
    refill: str = ""


@dataclass
class Ablate:
    """For each parameter name: zero it, call ModelNew on `inputs`, write the output, restore it."""

    kind: ClassVar[str] = "ablate"
    inputs: str
    params: list[str] = field(default_factory=list)


@dataclass
class Profile:
    """Evidence for the Judge model: the candidate's kernels under torch.profiler on `inputs`."""

    kind: ClassVar[str] = "profile"
    inputs: str


@dataclass
class Stop:
    kind: ClassVar[str] = "stop"


Command = Construct | Call | Guards | Ablate | Profile | Stop
COMMANDS: dict[str, type[Command]] = {c.kind: c for c in (Construct, Call, Guards, Ablate, Profile, Stop)}


def to_line(cmd: Command) -> str:
    return json.dumps({"cmd": cmd.kind, **asdict(cmd)})


def _typed(cls: type[Command], raw: dict[str, Any]) -> Command | None:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        v = raw[f.name]
        want = {"str": str, "int": int, "bool": bool, "list[str]": list}.get(str(f.type), object)
        if want is int and isinstance(v, bool) or not isinstance(v, want):
            return None
        if want is list and isinstance(v, list):
            v = [str(x)[:200] for x in v[:64]]
        kwargs[f.name] = v
    try:
        return cls(**kwargs)
    except TypeError:
        return None


def parse_command(line: str) -> Command | None:
    """A command line from the judge; None for anything else (the line is ignored)."""
    text = line.strip()
    if text == "stop":
        return Stop()
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("cmd") not in COMMANDS:
        return None
    return _typed(COMMANDS[raw["cmd"]], raw)


def safe_name(name: Any) -> str | None:
    """A file name inside the shared directory, or None (no path, no hidden file)."""
    if isinstance(name, str) and name and "/" not in name and not name.startswith(".") and len(name) < 200:
        return name
    return None
