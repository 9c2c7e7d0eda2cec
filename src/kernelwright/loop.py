"""The forge loop: the Coder writes, the engine judges the code, the Judge names what to change.

    round 0   Coder (first prompt) -> code -> engine -> Judge
    round n   Coder (repair prompt when round n-1 failed, optimisation prompt when it passed) -> ...

The best candidate is the fastest correct one seen; a regression never replaces it. The loop
stops at the round limit, at the target speedup, when a budget (tokens, cost, wall time) is
spent, or when a model fails for good, and always returns the best so far. Every round is
handed to the recorder as soon as it ends, whatever ended it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from kernelwright import prompts
from kernelwright.config import EvalConfig, LoopConfig
from kernelwright.extract import (
    FailureCritique,
    JudgeParseError,
    OutputRuleError,
    PerformanceCritique,
    extract_code,
    parse_judge,
)
from kernelwright.models.base import ChatModel, Completion, ModelError, Usage
from kernelwright.result import EvalResult, Status

# ---- what the loop is given ---------------------------------------------------------------


class Evaluator(Protocol):
    def __call__(self, problem: Path, code: str, on_stage: Callable[[str], None]) -> EvalResult: ...


def engine_evaluator(config: EvalConfig) -> Evaluator:
    """The real engine: every candidate in its own isolated child."""
    from kernelwright.engine import evaluate

    def run(problem: Path, code: str, on_stage: Callable[[str], None]) -> EvalResult:
        return evaluate(problem, None, config, candidate_text=code, on_stage=on_stage)

    return run


@dataclass
class Progress:
    """One live update: where the loop is, and the best verified speedup so far."""

    round: int
    stage: str  # coder | format check | startup | build | ... (engine stages) | judge | done
    verdict: str | None = None
    speedup: float | None = None
    best_speedup: float | None = None


# ---- what the loop records ----------------------------------------------------------------


@dataclass
class ModelCall:
    role: str  # coder | judge
    prompt: str
    completion: Completion | None = None
    error: str | None = None  # the call failed for good (retries spent, or not retryable)
    error_attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def response(self) -> str | None:
        return self.completion.text if self.completion else None

    def record(self) -> dict[str, Any]:
        if self.completion:
            return self.completion.record()
        return {"error": self.error, "attempts": self.error_attempts}


@dataclass
class Round:
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
    wall_s: float = 0.0

    @property
    def verdict(self) -> str:
        if self.result is not None:
            return self.result.status.value
        return "model_error" if self.coder and self.coder.error else "not_run"

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result is not None and self.result.status is Status.PASSED else None


@dataclass
class RunState:
    rounds: list[Round] = field(default_factory=list)
    best: Round | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    unpriced_calls: int = 0  # calls whose model has no known price (cost unknown, not zero)
    started: float = field(default_factory=time.monotonic)
    stop_reason: str | None = None

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
    def record_round(self, rnd: Round, state: RunState) -> None: ...

    def finish(self, state: RunState) -> None: ...


class _NoRecorder:
    def record_round(self, rnd: Round, state: RunState) -> None:
        pass

    def finish(self, state: RunState) -> None:
        pass


# ---- the loop -----------------------------------------------------------------------------


class Forge:
    def __init__(
        self,
        problem: str | Path,
        coder: ChatModel,
        judge: ChatModel,
        evaluate: Evaluator,
        config: LoopConfig,
        *,
        device: str = "cuda",
        recorder: Recorder | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ):
        self.problem = Path(problem)
        self.problem_code = self.problem.read_text()
        self.coder, self.judge, self.evaluate = coder, judge, evaluate
        self.config = config
        self.device_words = "the CPU" if device == "cpu" else "an NVIDIA GPU (CUDA)"
        self.recorder = recorder or _NoRecorder()
        self.on_progress = on_progress or (lambda p: None)
        self.state = RunState()

    # -- driver --
    def run(self) -> RunState:
        try:
            while self.state.stop_reason is None:
                self.step()
                self.state.stop_reason = self.state.stop_reason or self._stop_reason(len(self.state.rounds))
        except KeyboardInterrupt:
            self.state.stop_reason = "interrupted"
            raise
        except BaseException as exc:
            self.state.stop_reason = f"error: {exc}"
            raise
        finally:
            self.recorder.finish(self.state)
        return self.state

    def step(self) -> None:
        """One round: Coder, format check, engine, then (unless the run stops here) the Judge."""
        index = len(self.state.rounds)
        kind, prompt = self._coder_prompt()
        rnd = Round(index=index, kind=kind)
        t0 = time.monotonic()
        try:
            self._progress(index, "coder")
            rnd.coder = self._call(self.coder, "coder", prompt)
            if rnd.coder.error:
                self.state.stop_reason = f"coder failed: {rnd.coder.error}"
                return
            self._check_and_evaluate(rnd)
            if rnd.became_best:
                self.state.best = rnd
            self.state.stop_reason = self._stop_reason(index + 1)
            if self.state.stop_reason is None and rnd.result.status is not Status.FORMAT_ERROR:
                self._progress(index, "judge")
                self._ask_judge(rnd)
        finally:
            rnd.wall_s = round(time.monotonic() - t0, 3)
            self.state.rounds.append(rnd)
            self.recorder.record_round(rnd, self.state)
            self._progress(index, "done", rnd)

    # -- pieces of a round --
    def _check_and_evaluate(self, rnd: Round) -> None:
        text = rnd.coder.response or ""
        self._progress(rnd.index, "format check")
        try:
            rnd.code = extract_code(text, self.config.backend)
        except OutputRuleError as exc:
            rnd.code = exc.code
            rnd.result = EvalResult(status=Status.FORMAT_ERROR, error_log=f"Output rules broken: {exc}",
                                    metadata={"checked_by": "kernelwright.extract", "evaluated": False})
            return
        rnd.result = self.evaluate(self.problem, rnd.code, lambda stage: self._progress(rnd.index, stage))
        rnd.evaluated = True
        best = self.state.best
        if rnd.result.status is Status.PASSED and (best is None or _faster(rnd.result, best.result)):
            rnd.became_best = True

    def _ask_judge(self, rnd: Round) -> None:
        history = [{"round": r.index, "verdict": r.verdict, "speedup": r.speedup} for r in self.state.rounds]
        if rnd.result.status is Status.PASSED:
            target = self.state.best  # the fastest correct candidate, which this round may be
            kind: type = PerformanceCritique
            prompt = prompts.render("judge_performance", backend=self.config.backend, problem_code=self.problem_code,
                                    code=target.code, result=target.result, history=history + [
                                        {"round": rnd.index, "verdict": rnd.verdict, "speedup": rnd.speedup}],
                                    profile=_profile_text(target.result))
        else:
            kind = FailureCritique
            prompt = prompts.render("judge_failure", backend=self.config.backend, problem_code=self.problem_code,
                                    code=rnd.code, result=rnd.result, history=history,
                                    profile=_profile_text(rnd.result))
        rnd.judge = self._call(self.judge, "judge", prompt)
        if rnd.judge.error:
            rnd.judge_error = rnd.judge.error
            return
        try:
            rnd.critique = parse_judge(rnd.judge.response or "", kind)
        except JudgeParseError as exc:
            rnd.judge_error = str(exc)

    def _coder_prompt(self) -> tuple[str, str]:
        backend, rounds = self.config.backend, self.state.rounds
        if not rounds:
            return "first", prompts.render("coder_first", backend=backend, device=self.device_words,
                                           problem_code=self.problem_code)
        last = rounds[-1]
        if last.result.status is Status.PASSED:
            best = self.state.best
            note = None
            if best is not last:
                note = (f"passed at {last.speedup:.3f}x, slower than this code ({best.speedup:.3f}x): "
                        "it was not kept") if last.speedup is not None and best.speedup is not None else None
            return "optimise", prompts.render("coder_optimise", backend=backend, device=self.device_words,
                                              result=best.result, old_code=best.code, critique=last.critique,
                                              last_attempt=note, problem_code=self.problem_code)
        old = last.code if last.code is not None else (last.coder.response or "")
        return "repair", prompts.render("coder_repair", backend=backend, error_log=last.result.error_log,
                                        old_code=old, critique=last.critique, verdict=last.verdict)

    def _call(self, model: ChatModel, role: str, prompt: str) -> ModelCall:
        call = ModelCall(role=role, prompt=prompt)
        try:
            call.completion = model.complete([{"role": "user", "content": prompt}])
        except ModelError as exc:
            call.error = str(exc)
            call.error_attempts = [vars(a) for a in exc.attempts]
            return call
        self.state.count(call.completion)
        return call

    def _stop_reason(self, rounds_done: int) -> str | None:
        cfg, st = self.config, self.state
        if cfg.target_speedup is not None and st.best is not None and (st.best.speedup or 0) >= cfg.target_speedup:
            return f"target speedup {cfg.target_speedup:g}x reached"
        if cfg.max_tokens is not None and st.usage.total_tokens >= cfg.max_tokens:
            return f"token budget spent ({st.usage.total_tokens} of {cfg.max_tokens})"
        if cfg.max_cost_usd is not None and st.cost_usd >= cfg.max_cost_usd:
            return f"cost budget spent (${st.cost_usd:.4f} of ${cfg.max_cost_usd:g})"
        if cfg.max_wall_s is not None and st.wall_s >= cfg.max_wall_s:
            return f"wall-time budget spent ({st.wall_s:.0f} s of {cfg.max_wall_s:g} s)"
        if rounds_done >= cfg.rounds:
            return f"round limit ({cfg.rounds}) reached"
        return None

    def _progress(self, index: int, stage: str, rnd: Round | None = None) -> None:
        best = self.state.best.speedup if self.state.best else None
        self.on_progress(Progress(round=index, stage=stage, verdict=rnd.verdict if rnd else None,
                                  speedup=rnd.speedup if rnd else None, best_speedup=best))


def _faster(new: EvalResult, old: EvalResult) -> bool:
    """Strictly faster by the side-by-side speedup; an untimed pass never beats a timed one."""
    return (new.speedup or 0.0) > (old.speedup or 0.0)


def _profile_text(result: EvalResult | None) -> str:
    """The hardware evidence the engine attached (GPU facts, roofline, kernel profile), as text."""
    if result is None:
        return ""
    try:  # the hardware-feedback work's renderer, where it is installed
        from kernelwright.profile_report import render_for_judge
    except ImportError:
        render_for_judge = None
    if render_for_judge is not None:
        return render_for_judge(result)
    profile = result.metadata.get("profile")
    if not profile:
        return ""
    return profile if isinstance(profile, str) else "\n".join(f"{k}: {v}" for k, v in dict(profile).items())
