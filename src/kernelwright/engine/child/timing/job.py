"""The timing stage's one job and its one outcome (`run(TimingJob) -> TimingOutcome`).

The job is all the stage may use: the device, the socket to the runner, the input draw, the
reference, the bound a timed output must keep, the deadlines and the device clock's yardstick.
The outcome is all it says: the statistics, a failure or none, and the facts the judge records
(flags raised, checks made, the metadata of the windows).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.core.config import TimingConfig
from kernelwright.core.record import Stage, Status, TimingStats
from kernelwright.engine.child.correctness import TimedBound


@dataclass
class TimingJob:
    device: torch.device
    sock: socket.socket  # the pair's socket: windows go to the runner on it
    config: TimingConfig
    draw: Callable[[], list[Any]]  # a fresh input set from the judge's secret stream, each call
    reference: Callable[..., Any]  # the reference model, as the judge holds it
    inputs: Any  # the first trial's inputs (the windows' size comes from the reference's time on them)
    reference_output: Any  # the reference's output for `inputs`
    bound: TimedBound  # how far a timed output may stray from the reference's
    anchor: Any = None  # device_clock.Anchor: measured at the judge's start-up (None: no device clock)
    device_clock_off: str = ""  # why the judge has no device clock ('' when it has one, or on the CPU)
    # at the end of the windows: why the device may have been shared with another evaluation ('' when
    # it is not known to be; gpu_turn.GpuTurn.check)
    shared: Callable[[], str] = lambda: ""

    def deadline(self, expected_s: float) -> float:
        """How long a window that should take `expected_s` may take before it times out."""
        return max(self.config.window_deadline_s, 100.0 * expected_s)


@dataclass
class TimingFailure:
    status: Status
    log: str
    stage: Stage = Stage.TIMING
    stop: bool = True  # the runner is told to stop (its window failed, or timed out)


@dataclass
class TimingOutcome:
    candidate: TimingStats | None = None
    reference: TimingStats | None = None
    compiled_reference: TimingStats | None = None  # torch.compile(reference), where asked
    failure: TimingFailure | None = None
    flags: dict[str, str] = field(default_factory=dict)  # raised, in order
    checked: list[str] = field(default_factory=list)  # the checks the stage made
    facts: dict[str, Any] = field(default_factory=dict)  # the guards' facts it adds
    metadata: dict[str, Any] = field(default_factory=dict)  # the record's metadata it adds ("timing", ...)
    # what the figures measure: "device" (the judge's events around each side's work on the device's
    # own timeline, the figure the field reports) or "host" (the judge's wall clock: the CPU, or a GPU
    # where the device clock is off or a window could not be queued whole)
    basis: str = "host"
    # each side's calls as a caller launches them one at a time (the larger of its device time and its
    # host's time to queue it), on the device basis; the speed-up itself on the host basis
    speedup_as_launched: float | None = None

    @property
    def speedup(self) -> float | None:
        if self.candidate is None or self.reference is None or self.candidate.median_ms <= 0:
            return None
        return self.reference.median_ms / self.candidate.median_ms

    @property
    def speedup_vs_compile(self) -> float | None:
        if self.candidate is None or self.compiled_reference is None or self.candidate.median_ms <= 0:
            return None
        return self.compiled_reference.median_ms / self.candidate.median_ms
