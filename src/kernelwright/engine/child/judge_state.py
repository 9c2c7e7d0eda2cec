"""What the judge knows of one evaluation, and the few acts every stage shares.

`JudgeState` holds the job, the configuration, the record being written and the facts gathered
so far (flags, checks made, the first failure); it reports a failure (`set_verdict`), raises a
flag, asks the parent to let the runner go on (`ask`) and keeps the stages' clocks. The stages
build on it: `judge_outputs` (the reference, the runner's outputs read and judged) on it;
`judge_profile`, `judge_shapes` and `judge_guards` on that; `judge_timing` on the profile;
`judge_trials`, the checks' sequence, on the last three; `judge.Judge` on the sequence.
Imports only torch, the standard library and `core`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from typing import Any

import torch

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult, Stage, Status
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.compare import tensor_bytes
from kernelwright.engine.child.correctness import TimedBound
from kernelwright.engine.child.degenerate import DegenerateDetector
from kernelwright.engine.child.problem_io import ProblemIO
from kernelwright.engine.child.protocol import JudgeJob
from kernelwright.engine.child.verdict import Failure

MAX_TEXT = 20_000
STAGE_KEY = {
    "startup": "startup_s",
    "build": "build_s",
    "init": "init_s",
    "correctness": "correctness_s",
    "timing": "timing_s",
    "profile": "profile_s",
}


class HandoffUnavailable(RuntimeError):
    """A device output could not be received and the judge's own import of device memory failed
    its self-test at start-up: the machine's fault (an engine error), never the candidate's."""


class ReferenceFailure(Exception):
    """The reference problem itself failed (its get_inputs or its forward): the problem's fault."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log


def text(v: Any, limit: int = MAX_TEXT) -> str:
    return str(v)[:limit] if v is not None else ""


def num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def dict_field(msg: dict[str, Any], key: str) -> dict[Any, Any]:
    """`msg[key]` when it is a dict, else an empty one."""
    v = msg.get(key)
    return v if isinstance(v, dict) else {}


def plain_data(v: Any, depth: int = 0) -> Any:
    """A copy of untrusted JSON data with bounded depth and string sizes."""
    if depth > 8:
        return None
    if isinstance(v, dict):
        return {str(k)[:200]: plain_data(x, depth + 1) for k, x in list(v.items())[:500]}
    if isinstance(v, list):
        return [plain_data(x, depth + 1) for x in v[:2000]]
    if isinstance(v, str):
        return v[:MAX_TEXT]
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return str(v)[:200]


def first_line(s: str) -> str:
    return s.strip().splitlines()[0] if s.strip() else ""


def short_tb(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    return "\n".join(lines[:5] + ["  ..."] + lines[-30:] if len(lines) > 40 else lines)


def bounded_cache(cache: dict[int, Any], budget_bytes: int, most: int = 9) -> dict[int, Any]:
    """`cache` (oldest first) without its oldest entries, until it holds at most `most` entries
    and `budget_bytes` of tensors; the newest entry is always kept."""
    keys = list(cache)
    sizes = {k: tensor_bytes(cache[k]) for k in keys}
    while len(keys) > 1 and (len(keys) > most or sum(sizes[k] for k in keys) > budget_bytes):
        keys.pop(0)
    return {k: cache[k] for k in keys}


def memory_bytes(device: Any) -> int:
    """The device's memory (a CUDA device's total; the machine's RAM for the CPU)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory)
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, RuntimeError, AttributeError):
        return 8 << 30


class JudgeState:
    # set at start-up and when the problem loads (judge.Judge.startup, load_problem)
    device: torch.device
    problem: Any
    io: ProblemIO
    ref_model: Any
    init_inputs: Any

    def __init__(self, job: dict[str, Any], chan: Channel, handoff_fd: int | None = None):
        self.chan = chan
        self.take(job)
        self.started = False
        self._warming: threading.Thread | None = None  # the flop counter's first use, off the path
        self.handoff: socket.socket | None = None  # the socket on which the runner's device outputs arrive
        self.handoff_s = 0.0
        self.handoff_self_test = ""  # why this process could not import its own export ('' when it could)
        self.anchor: Any = None  # device_clock.Anchor: the hand-over to another process before any candidate ran
        self.device_clock_off = ""  # why the device clock is not used ('' when it is, or on the CPU)
        self.turn: Any = None  # gpu_turn.GpuTurn: this judge's turn on the GPU, once it asked for one
        self.gpu_query: Any = None  # timing.gpu_load.Query: who kept the GPU busy during the windows
        if handoff_fd is not None:
            self.handoff = socket.socket(fileno=handoff_fd)

    def take(self, raw: dict[str, Any]) -> None:
        job = self.job = JudgeJob.from_json(raw)
        self.cfg = EvalConfig.from_dict(job.config) if "seed" in job.config else EvalConfig(device=job.config["device"])
        self.out_dir = job.out_dir or os.getcwd()
        self.rec = EvalResult(status=Status.RUNTIME_ERROR, atol=self.cfg.atol, rtol=self.cfg.rtol, seed=self.cfg.seed)
        self.rec.metadata = {}
        # Every input the candidate is judged on derives from this secret, drawn fresh for each
        # evaluation and never sent anywhere: the runner gets the inputs themselves, as data.
        # (`seed` stays the public seed of the models' weights, which both sides must share.)
        self.secret = int.from_bytes(os.urandom(6), "little")
        self.input_files: dict[int, str] = {}  # seed -> the wire file the runner reads its inputs from
        self.expected: set[str] = set()  # labels of outputs the runner still owes
        self.checks_done = False
        # how far a timed output may stray: as far as the passed trials did (correctness.errors), with room
        self.timed_bound = TimedBound(rtol=self.cfg.rtol)
        self.stage_started: dict[str, float] = {}
        self.current_stage = "startup"
        self.reported: Any = None  # the first failure reported (verdict.Failure); decide() weighs it at the end
        self.checks_passed = False  # every trial and the guards' calls right (set once every report is in)
        self.first_failure: tuple[int, int, str] | None = None
        self.flags: dict[str, str] = {}
        self.checked: list[str] = ["self_timed"]
        if job.candidate_clocks:  # the parent read them in the candidate's source (core/formats.clocks_read)
            self.flag(
                "self_timed",
                f"ModelNew's source reads a clock ({', '.join(text(c, 60) for c in job.candidate_clocks[:4])}): "
                "a candidate that times itself can pick its path by what it reads, so its path, its speed and "
                "its error follow the load of the process it ran in, and a rerun may take another",
            )
        self.facts: dict[str, Any] = {}
        self.oracle = None
        self.oracle_error = ""
        self.ref_cache: dict[int, tuple[Any, Any, Any]] = {}  # seed -> (reference output, oracle output, inputs)
        self.ref_call_s: list[float] = []  # the reference's own time for each call the judge made of it
        self.largest_bytes = 0  # the largest reference output and inputs so far (bounds what `read` takes)
        self.verified: dict[int, Any] = {}  # seed -> a candidate output judged correct for its inputs
        self.degenerate = DegenerateDetector()  # does the reference depend on its input?
        self.ablation_asked = False
        self.ablation_lines: list[str] = []
        self.shape_plan: Any = None  # other sizes of the problem (shapes.py), once planned
        self.shape_results: dict[str, dict[str, Any]] = {}  # label -> what happened there
        self.timing_asked = False
        self.done = False
        self.busy_s: dict[str, float] = {}
        self.numerics: dict[str, float | str | bool | None] = {
            "verdict": self.cfg.verdict,
            "oracle": self.cfg.numerics.oracle,
            "oracle_dtype": self.cfg.numerics.oracle_dtype,
            "factor": self.cfg.numerics.factor,
            "excess_floor": self.cfg.numerics.excess_floor,
            "excess_floor_low": self.cfg.numerics.excess_floor_low,
            "ill_conditioned": False,
            "strict_passed": True,
            "calibrated_passed": True,
        }

    # ---- the record --------------------------------------------------------------------------------
    def set_verdict(self, status: Status, log: str, stage: Stage | None) -> None:
        """Report a failure. The first one reported is kept; `verdict.decide` weighs it against the
        other facts at the end (a timeout or a crash of the runner, say, comes first)."""
        if self.reported is None:
            self.reported = Failure(status, log, stage)

    @property
    def verdict_set(self) -> bool:
        return self.reported is not None

    def ask(self, what: str) -> None:
        self.chan.send("ask", what=what)

    def flag(self, name: str, detail: str) -> None:
        self.flags.setdefault(name, detail[:2000])

    def failing_guards(self) -> list[str]:
        """The raised flags that fail the verdict (GuardConfig.fail_on)."""
        return [f for f in self.flags if f in self.cfg.guards.fail_on]

    def enter_stage(self, stage: str) -> None:
        """Close the current stage's span and open `stage`'s. A stage entered twice (correctness,
        then timing in this process, then correctness again at other sizes) adds its spans up."""
        self.close_stage()
        self.stage_started[stage] = time.monotonic()
        self.current_stage = stage

    def close_stage(self) -> None:
        prev = self.current_stage
        started = self.stage_started.pop(prev, None)
        if started is not None and prev in STAGE_KEY:
            key = STAGE_KEY[prev]
            before = getattr(self.rec.stage_times, key) or 0.0
            setattr(self.rec.stage_times, key, before + time.monotonic() - started)
