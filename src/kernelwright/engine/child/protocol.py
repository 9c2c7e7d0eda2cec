"""What the judge asks of the runner, as typed commands: one dataclass per kind, one line of JSON each.

The judge drives; the runner (the candidate's process) only answers. Commands travel from the
judge through the parent to the runner's stdin, except a timing window, which goes straight on
the pair's socket with the descriptors of its regions (`timing/`). `parse_command` is the
runner's reader; whatever it cannot read is ignored, never guessed. The runner's reports are
parsed by the judge with `Report.parse`: every field checked, nothing else kept.
"""

from __future__ import annotations

import json
import types
import typing
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
    mode: str = ""  # the mode both models run in (ProblemIO.settle_mode); '': EvalConfig.model_mode


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


# ---- the jobs: what the parent hands each child when it starts one evaluation ---------------------


class JobError(ValueError):
    """A job file or line that is not a job of its kind (a field missing, unknown or of a wrong type)."""


def _job_from_json(cls: type[Any], raw: Any) -> Any:
    """`cls` from a JSON object, every field checked against its annotation (str, bool, int, dict,
    list, or None where the field allows it); unknown keys are an error, not dropped."""
    if not isinstance(raw, dict):
        raise JobError(f"a {cls.__name__} must be a JSON object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise JobError(f"{cls.__name__} has unknown fields: {', '.join(unknown)}")
    for name, value in raw.items():
        kinds = _JOB_TYPES[cls][name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            allowed = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise JobError(f"{cls.__name__}.{name} must be {allowed} (got {type(value).__name__})")
    try:
        return cls(**raw)
    except TypeError as exc:  # a required field missing
        raise JobError(f"{cls.__name__}: {exc}") from None


@dataclass
class RunnerJob:
    """The runner's job (a JSON file the parent writes in the runner's directory): what to import,
    where to write, and how it reports. It holds nothing of the problem: no source, no seed."""

    config: dict[str, Any]
    candidate_path: str = ""
    problem_path: str = ""  # build_only: the problem beside the candidate (a CPU-only prebuild)
    mode: str = "evaluate"  # evaluate | build_only | profile_only
    out_dir: str = ""
    spill_dir: str = ""
    fd: int | None = None  # the report pipe's write end (or record_path)
    record_path: str = ""
    handoff_fd: int | None = None  # the pair's socket (windows; device outputs)
    verified_builds: dict[str, Any] | None = None  # the trusted builder's: name -> hash it may load
    failed_builds: dict[str, Any] | None = None  # name -> the compiler's output of a build that failed
    private_builds: str = ""
    init_path: str = ""  # profile_only: the init inputs and inputs the judge wrote
    inputs_path: str = ""

    MODES: ClassVar[tuple[str, ...]] = ("evaluate", "build_only", "profile_only")

    @staticmethod
    def from_json(raw: Any) -> RunnerJob:
        job: RunnerJob = _job_from_json(RunnerJob, raw)
        if job.mode not in RunnerJob.MODES:
            raise JobError(f"RunnerJob.mode must be one of {', '.join(RunnerJob.MODES)} (got {job.mode!r})")
        return job

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JudgeJob:
    """The judge's job (a line on its stdin, never a file the runner could reach): the problem's
    source, the configuration, and the runner's directories it reads from."""

    config: dict[str, Any]
    problem_source: str = ""
    problem_name: str = "problem.py"
    out_dir: str = ""
    spill_dir: str = ""
    candidate_jit: bool = False  # the candidate compiles at its first call (read by the parent)
    candidate_clocks: list[str] = field(default_factory=list)  # the clocks its source reads (read by the parent)

    @staticmethod
    def from_json(raw: Any) -> JudgeJob:
        job: JudgeJob = _job_from_json(JudgeJob, raw)
        return job

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _kinds(tp: Any) -> tuple[type, ...]:
    """The runtime types a JSON value of annotation `tp` may have (`int | None` -> (int, NoneType))."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return tuple(k for arg in typing.get_args(tp) for k in _kinds(arg))
    return (origin,) if origin is not None else (tp,)


_JOB_TYPES: dict[type[Any], dict[str, tuple[type, ...]]] = {
    cls: {f.name: _kinds(typing.get_type_hints(cls)[f.name]) for f in fields(cls)} for cls in (RunnerJob, JudgeJob)
}
