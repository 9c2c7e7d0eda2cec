"""What one run of the forge loop is made of: its rounds, the model calls in them, the Judge's
expectations, the run's totals, and the recorder protocol that keeps them.

The loop (`loop/forge.py`) fills these; the store (`store/`) and the reports read them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kernelwright.core.record import EvalResult, RoundVerdict, Status
from kernelwright.models.chat import Completion, Usage
from kernelwright.models.extract import FailureCritique, PerformanceCritique


@dataclass
class Progress:
    """One live update: where the loop is, and the best verified speedup so far."""

    round: int
    stage: str  # coder | format check | startup | build | ... (engine stages) | judge | done
    verdict: str | None = None
    speedup: float | None = None
    best_speedup: float | None = None
    result: EvalResult | None = None  # the round's record, at "done"
    best_round: int | None = None  # the round that holds the best so far (after this one, at "done")
    decision: str | None = None  # at "done", for a correct round: why it did (not) become the best
    judge_error: str | None = None  # at "done": the Judge gave no usable critique, and why


@dataclass
class Expectation:
    """What the Judge expected of its optimisation, and what the next passing round measured.

    Speedups over the reviewed candidate are ratios of side-by-side speedups (each against the
    original program, measured in its own evaluation). outcome: exceeded | met | missed |
    regressed (slower than the reviewed candidate) | unrated (the Judge gave no number) |
    not_measured (that round's candidate failed; the expectation carries on to its repair).
    """

    judged_round: int  # the round whose Judge made the claim
    baseline_round: int  # the candidate it reviewed (the best at that time)
    baseline_speedup: float | None
    expected_speedup: float | None  # over the reviewed candidate
    expected_text: str
    optimisation: str
    measured_round: int | None = None
    measured_speedup: float | None = None  # over the original program
    measured_over_baseline: float | None = None
    outcome: str = "not_measured"
    held: bool | None = None  # True: met or exceeded; False: missed or regressed; None: not rated

    def resolve(self, rnd: Round, tolerance: float) -> Expectation:
        """This expectation as measured by `rnd` (a copy; a failed round leaves it not_measured)."""
        out = replace(self, measured_round=rnd.index, measured_speedup=rnd.speedup)
        if rnd.speedup is None or not self.baseline_speedup:
            return out
        ratio = rnd.speedup / self.baseline_speedup
        out.measured_over_baseline = ratio
        if ratio < 1.0:
            out.outcome, out.held = "regressed", False
        elif self.expected_speedup is None:
            out.outcome = "unrated"
        elif ratio > self.expected_speedup * (1 + tolerance):
            out.outcome, out.held = "exceeded", True
        elif ratio >= self.expected_speedup * (1 - tolerance):
            out.outcome, out.held = "met", True
        else:
            out.outcome, out.held = "missed", False
        return out

    def sentence(self) -> str:
        """One line for the next Judge prompt: "in round 1 you expected 1.50x ..., measured 1.10x: missed"."""
        expected = (
            f"expected {self.expected_speedup:.2f}x"
            if self.expected_speedup is not None
            else f"gave no number ({self.expected_text!r})"
        )
        base = f" ({self.baseline_speedup:.3f}x)" if self.baseline_speedup is not None else ""
        head = f"in round {self.judged_round} you {expected} over the round-{self.baseline_round} candidate{base}"
        if self.measured_over_baseline is None:
            return f"{head}; round {self.measured_round} did not measure it ({self.outcome})"
        return (
            f"{head}; round {self.measured_round} measured {self.measured_over_baseline:.2f}x over it "
            f"({self.measured_speedup:.3f}x overall): {self.outcome}"
        )


@dataclass
class ModelCall:
    role: str  # coder | judge
    prompt: str
    completion: Completion | None = None
    error: str | None = None  # the call failed for good (retries spent, or not retryable)
    exhausted: bool = False  # the model had no more answers (a replay at its end): not a failure
    error_attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def response(self) -> str | None:
        return self.completion.text if self.completion else None

    def record(self) -> dict[str, Any]:
        if self.completion:
            return self.completion.record()
        return {"error": self.error, "attempts": self.error_attempts}


class _Outcome:
    """The verdict and speed-up of a Coder answer, read from its `coder` call and its `result`."""

    coder: ModelCall | None
    result: EvalResult | None

    @property
    def verdict(self) -> RoundVerdict:
        if self.result is not None:
            return RoundVerdict.of(self.result.status)
        return RoundVerdict.MODEL_ERROR if self.coder and self.coder.error else RoundVerdict.NOT_RUN

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result is not None and self.result.status is Status.PASSED else None


@dataclass
class Candidate(_Outcome):
    """One of the K Coder answers of a round (`LoopConfig.candidates` > 1): the round's own
    coder/code/result fields hold the one the Judge reviews (`Round.chosen`)."""

    index: int
    coder: ModelCall | None = None
    code: str | None = None
    result: EvalResult | None = None
    evaluated: bool = False
    coder_name: str = ""  # which Coder answered (a model spec; its temperature when varied)


@dataclass
class Round(_Outcome):
    index: int
    kind: str  # first | repair | optimise
    coder: ModelCall | None = None
    code: str | None = None  # the extracted candidate (None when the answer held no code block)
    result: EvalResult | None = None
    evaluated: bool = False  # False for a format_error caught before the engine
    judge: ModelCall | None = None
    critique: FailureCritique | PerformanceCritique | None = None
    judge_error: str | None = None  # no usable critique: the call failed or its JSON did not parse
    became_best: bool = False
    best_decision: str = ""  # why this correct candidate did (not) replace the best
    expectation: Expectation | None = None  # the Judge's earlier expectation, as this round measured it
    wall_s: float = 0.0
    candidates: list[Candidate] = field(default_factory=list)  # all K answers (empty when K = 1)
    chosen: int | None = None  # which of them the round's fields hold
    chosen_why: str = ""


@dataclass
class RunState:
    rounds: list[Round] = field(default_factory=list)
    best: Round | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    unpriced_calls: int = 0  # calls whose model has no known price (cost unknown, not zero)
    started: float = field(default_factory=time.monotonic)
    stop_reason: str | None = None
    # Set when the run stopped on an error (a model failed for good, the engine could not run, an
    # interrupt) rather than at a limit: the run's outcome is then "stopped", not "finished".
    error: str | None = None

    @property
    def outcome(self) -> str:
        """finished | stopped (on an error, or with no model answer at all)."""
        answered = any(
            (r.coder is not None and r.coder.completion is not None)
            or (r.coder is None and r.result is not None)  # an evaluation with no model (suite eval)
            for r in self.rounds
        )
        return "stopped" if self.error is not None or not answered else "finished"

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def count(self, completion: Completion) -> None:
        self.usage = self.usage + completion.usage
        if completion.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += completion.cost_usd


class Recorder(Protocol):
    def round_dir(self, rnd: Round) -> Path | None: ...  # where the round's files go (None: nowhere)

    def record_round(self, rnd: Round, state: RunState) -> None: ...

    def finish(self, state: RunState) -> None: ...


class NoRecorder:
    def round_dir(self, rnd: Round) -> Path | None:
        return None

    def record_round(self, rnd: Round, state: RunState) -> None:
        pass

    def finish(self, state: RunState) -> None:
        pass
