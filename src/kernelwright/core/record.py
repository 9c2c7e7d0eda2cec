"""The evaluation record: one typed result per evaluation, serialisable to JSON.

Standard library only: the evaluation child builds these records too.

The record carries at least what a KernelBench `KernelExecResult` carries
(compiled, correctness, runtime, runtime statistics, metadata), typed, plus the
evidence a Judge needs (error log, structured compiler errors, per-trial errors).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """The verdict of one evaluation. Exactly one per record."""

    PASSED = "passed"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    FORMAT_ERROR = "format_error"
    # The engine's own code failed (a bug in kernelwright, not in the candidate): never a pass, never
    # blamed on the candidate; the traceback is in metadata["engine_traceback"].
    ENGINE_ERROR = "engine_error"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


class RoundVerdict(str, Enum):
    """What a round of the loop, or a problem of a suite, came to: its evaluation's `Status`
    (`RoundVerdict.of`), or why it has no evaluation. A type of its own, not members of `Status`:
    `Status` is what an evaluation can end with, and no evaluation ends "model_error"."""

    PASSED = "passed"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    FORMAT_ERROR = "format_error"
    ENGINE_ERROR = "engine_error"
    MODEL_ERROR = "model_error"  # the Coder's call failed for good: nothing to evaluate
    NOT_RUN = "not_run"  # no evaluation: no answer came (a replay at its end), or no round finished
    NO_CANDIDATE = "no_candidate"  # a problem of a suite with no candidate given for it

    @classmethod
    def of(cls, status: Status) -> RoundVerdict:
        return cls(status.value)

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


# The flags that withhold a measured speed-up from every comparison and aggregate: the timing
# conditions did not hold (`timing_unstable`), or the time beats the hardware (`faster_than_hardware`).
# The figure stays in the record; it never makes a round the loop's best, nor counts in fast_p.
WITHHOLDING_FLAGS = ("timing_unstable", "faster_than_hardware")


def withheld_by(flags: Iterable[str]) -> list[str]:
    """Of `flags` (a record's flag names), those that withhold its speed-up, in WITHHOLDING_FLAGS' order."""
    names = set(flags)
    return [f for f in WITHHOLDING_FLAGS if f in names]


class Stage(str, Enum):
    """Where in the evaluation something happened."""

    STARTUP = "startup"  # child started, torch imported
    BUILD = "build"  # candidate imported, its extensions built
    INIT = "init"  # models constructed
    REFERENCE = "reference"  # reference run (a failure here is the problem's fault)
    CORRECTNESS = "correctness"
    TIMING = "timing"
    PROFILE = "profile"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


@dataclass
class CompileIssue:
    """One compiler diagnostic, located in the generated file and, when possible, in the candidate."""

    message: str
    severity: str = "error"  # error | warning
    file: str | None = None  # generated file (main.cpp, cuda.cu, ...) or the candidate itself
    line: int | None = None  # line in `file`
    column: int | None = None
    candidate_line: int | None = None  # line in the candidate .py where the source string sits
    source_line: str | None = None  # the offending line of kernel source


@dataclass
class TrialRecord:
    """Comparison of candidate and reference outputs for one trial (one seed, fresh inputs)."""

    trial: int
    seed: int
    passed: bool
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    worst_index: list[int] | None = None  # index of the worst element (in the output that holds it)
    worst_output: str | None = None  # which output (path such as "out" or "out[1]")
    frac_out_of_tol: float | None = None
    message: str = ""
    # Filled by the numerics-aware check (float64 oracle), when enabled.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimingStats:
    """Timing of one callable under the engine's protocol. Times in milliseconds."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    iterations: int
    warmup: int
    clock: str  # "judge_window" (the judge's windows); older records: "cuda_event" | "perf_counter"
    l2_flush: bool
    statistic: str = "median"


@dataclass
class StageTimes:
    """Wall-clock seconds spent in each stage of the evaluation (parent's view where the child died)."""

    startup_s: float | None = None
    build_s: float | None = None
    init_s: float | None = None
    correctness_s: float | None = None
    timing_s: float | None = None
    profile_s: float | None = None
    total_s: float | None = None
    # stage -> [start, end]: seconds since the epoch on the parent's clock (the coordinator's, which
    # hears each stage begin; the profile's and the trusted build's, the evaluation's), from which a
    # suite's accounting (suites/accounting.py) tells when each GPU was at work
    spans: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class EvalResult:
    status: Status
    correct: bool = False
    compiled: bool = False  # the candidate imported and its extensions built
    error_log: str = ""  # the text a repair prompt quotes
    error_stage: Stage | None = None
    compile_issues: list[CompileIssue] = field(default_factory=list)
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    trials: list[TrialRecord] = field(default_factory=list)
    candidate_ms: float | None = None
    reference_ms: float | None = None
    speedup: float | None = None  # reference_ms / candidate_ms, timed side by side in one child
    # what `speedup` measures: "device" (each side's work on the device's own timeline, the judge's
    # events: what papers and leaderboards report) or "host" (the judge's wall clock around the calls)
    speedup_basis: str | None = None
    # the speed-up of the calls as a caller launches them one at a time (host time included: the larger
    # of a call's device time and its host's time to queue it); equal to `speedup` on the host basis
    speedup_as_launched: float | None = None
    compile_reference_ms: float | None = None  # torch.compile(reference), when asked for
    speedup_vs_compile: float | None = None
    candidate_timing: TimingStats | None = None
    reference_timing: TimingStats | None = None
    compile_reference_timing: TimingStats | None = None
    device: str = ""  # device name, e.g. "NVIDIA H100 80GB HBM3" or "cpu (x86_64, 2 threads)"
    device_type: str = ""  # "cuda" | "cpu"
    stage_times: StageTimes = field(default_factory=StageTimes)
    atol: float | None = None
    rtol: float | None = None
    seed: int | None = None
    sandbox: str = "none"  # how the child was isolated: "bwrap" | "none"
    exit_code: int | None = None  # child's exit code; negative: killed by that signal
    # Free-form but named: toolchain versions, build cache hits, guard flags, profile, ...
    metadata: dict[str, Any] = field(default_factory=dict)

    # ---- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in dataclasses.asdict(self).items()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        data = dict(data)
        data["status"] = Status(data["status"])
        if data.get("error_stage") is not None:
            # "done" was a member once, never a stage the engine reported: a record that holds it
            # (a forged runner message could put it there) loads with no stage
            data["error_stage"] = None if data["error_stage"] == "done" else Stage(data["error_stage"])
        data["compile_issues"] = [CompileIssue(**c) for c in data.get("compile_issues", [])]
        data["trials"] = [TrialRecord(**t) for t in data.get("trials", [])]
        for key in ("candidate_timing", "reference_timing", "compile_reference_timing"):
            if data.get(key) is not None:
                data[key] = TimingStats(**data[key])
        data["stage_times"] = StageTimes(**(data.get("stage_times") or {}))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:  # a misspelled key in whoever wrote the record must not vanish
            raise ValueError(f"EvalResult has no field(s) {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> EvalResult:
        return cls.from_dict(json.loads(text))

    # ---- views -------------------------------------------------------------------------
    def flags(self) -> dict[str, str]:
        """The guard flags the evaluation raised (name -> one line of evidence)."""
        return dict((self.metadata.get("guards") or {}).get("flags") or {})

    @property
    def degenerate_reference(self) -> bool:
        """The reference's output does not depend on its input: the speed-up means nothing, and
        speed-up aggregates over problems leave this one out by default."""
        return "degenerate_reference" in self.flags()

    @property
    def sizes_failed(self) -> list[str]:
        """The other sizes of the problem the kernel failed at (names such as "dim=1023"), from
        metadata["shapes"]; empty when none failed or none was tried."""
        shapes = self.metadata.get("shapes")
        return [str(n) for n in (shapes.get("failed") or [])] if isinstance(shapes, dict) else []

    @property
    def draw_speedups(self) -> list[float]:
        """With several draws (`--draws`, engine/draws.py): each draw's speed-up, in the order they
        ran (the record's is their median); empty for one draw."""
        draws = self.metadata.get("draws")
        each = draws.get("each") if isinstance(draws, dict) else None
        if not isinstance(each, list) or len(each) < 2:
            return []
        return [float(e["speedup"]) for e in each if isinstance(e, dict) and isinstance(e.get("speedup"), int | float)]

    @property
    def size_robust(self) -> bool | None:
        """Does the passed kernel hold at every size the shapes check tried? True: the check ran
        and every size passed; False: flagged `shape_specific` (wrong at some size); None: not
        known: the verdict is not passed, the check was off, the problem's sizes could not be
        varied, or a size was not run."""
        if self.status is not Status.PASSED or not self.correct:
            return None
        if "shape_specific" in self.flags() or self.sizes_failed:
            return False
        shapes = self.metadata.get("shapes")
        if not isinstance(shapes, dict) or shapes.get("mode", "off") == "off":
            return None
        tried = shapes.get("tried") or []
        return True if tried and all(isinstance(t, dict) and t.get("passed") is True for t in tried) else None

    @property
    def speedup_withheld_by(self) -> list[str]:
        """The flags that withhold this measured speed-up from every comparison and aggregate (the
        loop's choice of its best, a suite's fast_p and means): its timing conditions did not hold,
        or its time beats what the hardware can do. Empty where the figure stands."""
        return withheld_by(self.flags())

    @property
    def speedup_trusted(self) -> bool:
        """A speed-up to aggregate: measured, on a problem that is not degenerate, timed in stable conditions."""
        return self.speedup is not None and not self.degenerate_reference and not self.speedup_withheld_by

    def to_kernelbench(self) -> dict[str, Any]:
        """The record in KernelBench's `KernelExecResult` shape, for tools that read that format."""
        stats = dataclasses.asdict(self.candidate_timing) if self.candidate_timing else {}
        return {
            "compiled": self.compiled,
            "correctness": self.correct,
            "metadata": {
                "hardware": self.device,
                "device": self.device_type,
                "status": self.status.value,
                "error_log": self.error_log,
                **{k: v for k, v in self.metadata.items() if isinstance(v, (str, int, float, bool))},
            },
            "runtime": self.candidate_ms if self.candidate_ms is not None else -1.0,
            "runtime_stats": {
                "mean": stats.get("mean_ms"),
                "std": stats.get("std_ms"),
                "min": stats.get("min_ms"),
                "max": stats.get("max_ms"),
                "num_trials": stats.get("iterations"),
            }
            if stats
            else {},
        }

    def summary_line(self) -> str:
        """One line a person or a log reads first."""
        if self.status is Status.PASSED and self.speedup is not None:
            return (
                f"passed: {self.candidate_ms:.4g} ms vs reference {self.reference_ms:.4g} ms "
                f"({self.speedup:.3g}x) on {self.device}"
            )
        first = self.error_log.strip().splitlines()[0] if self.error_log.strip() else ""
        return (
            f"{self.status.value}"
            + (f" [{self.error_stage.value}]" if self.error_stage else "")
            + (f": {first}" if first else "")
        )


def _plain(obj: Any) -> Any:
    """Enums to their values, recursively, so json.dumps needs no hooks."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
