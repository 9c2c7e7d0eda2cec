"""The forge loop: the Coder writes, the engine judges the code, the Judge names what to change.

    round 0   Coder (first prompt) -> code -> engine -> Judge
    round n   Coder (repair prompt when round n-1 failed, optimisation prompt when it passed) -> ...

The best candidate is the fastest correct one seen; a regression never replaces it, nor does a
candidate that is faster only by noise, nor the best's own code submitted again (see `keep`).
The loop stops at the round limit, at the target speedup, when a budget (tokens, cost, wall time)
is spent, or when a model fails for good, and always returns the best so far. Every round is
handed to the recorder as soon as it ends, whatever ended it.

The Judge's performance answer names a bottleneck, an optimisation and the speedup it expects over
the candidate it reviewed. That expectation is checked at the next round that passes (repairs of a
failed attempt carry it on): the round's record, and the next Judge prompt, say what was expected,
what was measured, and whether it held (`Expectation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from kernelwright.core import run_files
from kernelwright.core.config import EvalConfig, LoopConfig
from kernelwright.core.record import EvalResult, Status
from kernelwright.loop.history import Candidate, Expectation, ModelCall, NoRecorder, Progress, Recorder, Round, RunState
from kernelwright.loop.llm_judge_evidence import render_for_llm_judge
from kernelwright.models import prompts
from kernelwright.models.chat import AnswersExhausted, ChatModel, ModelError
from kernelwright.models.extract import (
    FailureCritique,
    JudgeParseError,
    OutputRuleError,
    PerformanceCritique,
    extract_code,
    parse_judge,
)

# ---- what the loop is given ---------------------------------------------------------------


class Evaluator(Protocol):
    def __call__(
        self, problem: Path, code: str, on_stage: Callable[[str], None], report_dir: Path | None
    ) -> EvalResult: ...


class EngineEvaluator:
    """The real engine: every candidate in its own isolated child. `report_dir` (the round's folder
    of the run directory) receives the raw profiler files (ncu's report and CSV) of that round.

    With `warm` (the default), the next round's child is started as soon as an evaluation ends
    (`engine.WarmEvaluator`): it imports torch and initialises CUDA while the Judge and the Coder
    answer. `close()` stops the spare; `Forge.run` calls it at the end of a run.
    """

    def __init__(self, config: EvalConfig, warm: bool = True):
        from kernelwright.engine import WarmEvaluator

        self.config = config
        self.warm = WarmEvaluator(config) if warm else None

    def __call__(
        self, problem: Path, code: str, on_stage: Callable[[str], None], report_dir: Path | None
    ) -> EvalResult:
        from kernelwright import engine

        cfg = self.config
        if report_dir is not None and cfg.profile.enabled:
            cfg = replace(cfg, profile=replace(cfg.profile, report_dir=str(report_dir)))
        evaluate = self.warm.evaluate if self.warm else engine.evaluate
        return evaluate(problem, None, cfg, candidate_text=code, on_stage=on_stage)

    def prestart(self) -> None:
        """Start the next evaluation's child now (when warm), unless one is waiting."""
        from kernelwright.engine import EngineError

        if self.warm:
            try:
                self.warm.prestart()
            except EngineError:
                pass  # the evaluation itself will start a child and report the problem

    def close(self) -> None:
        if self.warm:
            self.warm.close()


def engine_evaluator(config: EvalConfig, warm: bool = True) -> EngineEvaluator:
    return EngineEvaluator(config, warm)


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
        coders: list[ChatModel] | None = None,
    ):
        self.problem = Path(problem)
        self.problem_code = self.problem.read_text()
        self.coder, self.judge, self.evaluate = coder, judge, evaluate
        self.config = config
        self.device_words = "the CPU" if device == "cpu" else "an NVIDIA GPU (CUDA)"
        self.recorder = recorder or NoRecorder()
        self.on_progress = on_progress or (lambda p: None)
        self.state = RunState()
        self.pending: Expectation | None = None  # the Judge's last expectation, not yet measured
        # with config.candidates = K > 1: the K Coders (e.g. one model at K temperatures); one given: asked K times
        self.coders = list(coders) if coders else [coder]
        self.unjudged: Round | None = None  # resume: a last round recorded without its Judge (see restore)

    # -- resume: a run continued from its recorded rounds (store.rundir.load_rounds) --
    def restore(self, rounds: list[Round], wall_s: float = 0.0) -> None:
        """Continue after `rounds`: the same best so far, token and cost totals, the Judge's pending
        expectation and wall time (`wall_s` already spent), as if this loop had run them."""
        st = self.state
        st.rounds, st.started = list(rounds), st.started - wall_s
        for r in rounds:  # the bookkeeping of step(), in its order
            for call in (r.coder, r.judge):
                if call is not None and call.completion is not None:
                    st.count(call.completion)
            if r.evaluated and self.pending is not None and _result(r).status is Status.PASSED:
                self.pending = None
            if r.became_best:
                st.best = r
            if isinstance(r.critique, PerformanceCritique) and st.best is not None:
                self.pending = Expectation(
                    judged_round=r.index,
                    baseline_round=st.best.index,
                    baseline_speedup=st.best.speedup,
                    expected_speedup=r.critique.expected_speedup,
                    expected_text=r.critique.expected_text,
                    optimisation=r.critique.optimisation,
                )
        self._skip_used_answers(rounds)
        st.stop_reason = self._stop_reason(len(rounds)) if rounds else None
        last = rounds[-1] if rounds else None
        if (
            st.stop_reason is None
            and last is not None
            and last.result is not None
            and last.judge is None
            and last.judge_error is None
            and last.result.status is not Status.FORMAT_ERROR
        ):
            self.unjudged = last  # it ended the run at its old limit: run() asks the Judge first, as step() would have

    def _skip_used_answers(self, rounds: list[Round]) -> None:
        """A model with a fixed list of answers (a replay, `skip(n)`) moves past those the restored
        rounds already used, so the resumed run gets the answers an uninterrupted run would have."""
        used = [0] * len(self.coders)
        judged = 0
        for r in rounds:
            calls = [c.coder for c in r.candidates] if r.candidates else [r.coder]
            for i, call in enumerate(calls):
                if call is not None and call.completion is not None:
                    used[i % len(self.coders)] += 1
            if r.judge is not None and r.judge.completion is not None:
                judged += 1
        for model, n in [*zip(self.coders, used), (self.judge, judged)]:  # noqa: B905
            skip = getattr(model, "skip", None)
            if callable(skip) and n:
                skip(n)

    def _judge_unjudged(self) -> None:
        rnd, self.unjudged = self.unjudged, None
        assert rnd is not None, "called only while a round waits for its Judge"
        self.state.rounds.pop()  # the Judge sees the history as step() shows it: the round itself not yet in it
        try:
            self._progress(rnd.index, "judge")
            self._ask_judge(rnd)
        finally:
            self.state.rounds.append(rnd)
        self.recorder.record_round(rnd, self.state)

    # -- driver --
    def run(self) -> RunState:
        prestart = getattr(self.evaluate, "prestart", None)
        if prestart:  # the first evaluation's child starts up while the Coder writes
            prestart()
        try:
            if self.unjudged is not None:
                self._judge_unjudged()
            while self.state.stop_reason is None:
                self.step()
                self.state.stop_reason = self.state.stop_reason or self._stop_reason(len(self.state.rounds))
        except KeyboardInterrupt:
            self.state.stop_reason = self.state.error = "interrupted"
            raise
        except BaseException as exc:
            self.state.stop_reason = self.state.error = f"error: {exc}"
            raise
        finally:
            close = getattr(self.evaluate, "close", None)
            if close:
                close()
            self.recorder.finish(self.state)
        return self.state

    def step(self) -> None:
        """One round: Coder, format check, engine, then (unless the run stops here) the Judge."""
        index = len(self.state.rounds)
        kind, prompt = self._coder_prompt()
        rnd = Round(index=index, kind=kind)
        t0 = time.monotonic()
        played = True
        try:
            self._progress(index, "coder")
            if self.config.candidates > 1:
                self._candidates(rnd, prompt)
            else:
                rnd.coder = self._call(self.coder, "coder", prompt)
            if rnd.coder is not None and rnd.coder.exhausted:  # a replay at its end: no round played
                self.state.stop_reason, played = rnd.coder.error, False
                return
            if _coder(rnd).error:
                self.state.stop_reason = self.state.error = f"coder failed: {_coder(rnd).error}"
                return
            if self.config.candidates <= 1:
                self._check_and_evaluate(rnd)
            if rnd.became_best:
                self.state.best = rnd
            self.state.stop_reason = self._stop_reason(index + 1)
            if self.state.stop_reason is None and _result(rnd).status is not Status.FORMAT_ERROR:
                self._progress(index, "judge")
                self._ask_judge(rnd)
        finally:
            if played:
                rnd.wall_s = round(time.monotonic() - t0, 3)
                self.state.rounds.append(rnd)
                self.recorder.record_round(rnd, self.state)
                self._progress(index, "done", rnd)

    # -- pieces of a round --
    def _check_and_evaluate(self, rnd: Round) -> None:
        text = _coder(rnd).response or ""
        self._progress(rnd.index, "format check")
        try:
            rnd.code = extract_code(text, self.config.backend)
        except OutputRuleError as exc:
            rnd.code = exc.code
            rnd.result = EvalResult(
                status=Status.FORMAT_ERROR,
                error_log=f"Output rules broken: {exc}",
                metadata={"checked_by": "kernelwright.models.extract", "evaluated": False},
            )
            return
        report_dir = self.recorder.round_dir(rnd)
        rnd.result = self.evaluate(
            self.problem,
            rnd.code,
            lambda stage: self._progress(rnd.index, stage),
            report_dir / run_files.PROFILE_DIR if report_dir is not None else None,
        )
        rnd.evaluated = True
        self._settle(rnd)

    def _settle(self, rnd: Round) -> None:
        """The evaluated round against the Judge's pending expectation and the best so far."""
        if self.pending is not None:
            rnd.expectation = self.pending.resolve(rnd, self.config.expectation_tolerance)
            if _result(rnd).status is Status.PASSED:
                self.pending = None  # measured; a failed attempt leaves it to the repair
        if _result(rnd).status is Status.PASSED:
            rnd.became_best, rnd.best_decision = keep(rnd, self.state.best, self.config)

    def _ask_judge(self, rnd: Round) -> None:
        history = [_history_entry(r) for r in self.state.rounds]
        target = None
        if _result(rnd).status is Status.PASSED:
            target = self.state.best  # the fastest correct candidate, which this round may be
            assert target is not None, "a passed round has become the best or lost to one"
            kind: type = PerformanceCritique
            last = rnd.expectation if rnd.expectation and rnd.expectation.measured_over_baseline is not None else None
            prompt = self._render(
                "llm_judge_performance",
                backend=self.config.backend,
                problem_code=self.problem_code,
                code=target.code,
                result=target.result,
                history=history + [_history_entry(rnd) | {"expectation": None}],  # told below
                profile=_profile_text(target.result),
                target_round=target.index,
                last_expectation=last.sentence() if last else None,
            )
        else:
            kind = FailureCritique
            prompt = self._render(
                "llm_judge_failure",
                backend=self.config.backend,
                problem_code=self.problem_code,
                code=rnd.code,
                result=rnd.result,
                history=history,
                profile=_profile_text(rnd.result),
            )
        rnd.judge = self._call(self.judge, "judge", prompt)
        if rnd.judge.error:
            rnd.judge_error = rnd.judge.error
            return
        try:
            rnd.critique = parse_judge(rnd.judge.response or "", kind)
        except JudgeParseError as exc:
            rnd.judge_error = str(exc)
            return
        if isinstance(rnd.critique, PerformanceCritique) and target is not None:
            self.pending = Expectation(
                judged_round=rnd.index,
                baseline_round=target.index,
                baseline_speedup=target.speedup,
                expected_speedup=rnd.critique.expected_speedup,
                expected_text=rnd.critique.expected_text,
                optimisation=rnd.critique.optimisation,
            )

    def _coder_prompt(self) -> tuple[str, str]:
        backend, rounds = self.config.backend, self.state.rounds
        if not rounds:
            return "first", self._render(
                "coder_first", backend=backend, device=self.device_words, problem_code=self.problem_code
            )
        last = rounds[-1]
        if _result(last).status is Status.PASSED:
            best = self.state.best
            assert best is not None, "a passed round has become the best or lost to one"
            note = None
            if best is not last:
                note = f"passed but was not kept: {last.best_decision}" if last.best_decision else None
            return "optimise", self._render(
                "coder_optimise",
                backend=backend,
                device=self.device_words,
                result=best.result,
                old_code=best.code,
                critique=last.critique,
                last_attempt=note,
                problem_code=self.problem_code,
            )
        old = last.code if last.code is not None else (_coder(last).response or "")
        return "repair", self._render(
            "coder_repair",
            backend=backend,
            error_log=_result(last).error_log,
            old_code=old,
            critique=last.critique,
            verdict=last.verdict,
        )

    def _render(self, name: str, **variables: Any) -> str:
        """A prompt, from the user's prompt folder (`model.prompt_dir`) where it holds that template."""
        return prompts.render(name, self.config.model.prompt_dir, **variables)

    def _call(self, model: ChatModel, role: str, prompt: str, count: bool = True) -> ModelCall:
        call = ModelCall(role=role, prompt=prompt)
        try:
            call.completion = model.complete([{"role": "user", "content": prompt}])
        except ModelError as exc:
            call.error, call.exhausted = str(exc), isinstance(exc, AnswersExhausted)
            call.error_attempts = [vars(a) for a in exc.attempts]
            return call
        if count:
            self.state.count(call.completion)
        return call

    # -- several candidates per round (config.candidates = K > 1) --
    def _candidates(self, rnd: Round, prompt: str) -> None:
        """K Coder answers at once; every code block evaluated (at once, when the evaluator is
        `concurrent`, e.g. an executor over several GPUs); the round keeps the one to review."""
        from concurrent.futures import ThreadPoolExecutor

        k = self.config.candidates
        coders = [self.coders[i % len(self.coders)] for i in range(k)]
        with ThreadPoolExecutor(max_workers=k, thread_name_prefix="kw-coder") as pool:
            calls = list(pool.map(lambda m: self._call(m, "coder", prompt, count=False), coders))
        cands = [
            Candidate(index=i, coder=c, coder_name=getattr(m, "name", ""))
            for i, (c, m) in enumerate(zip(calls, coders, strict=True))
        ]
        for c in calls:
            if c.completion:
                self.state.count(c.completion)
        round_dir = None
        for cand in cands:
            if _coder(cand).error:
                continue
            try:
                cand.code = extract_code(_coder(cand).response or "", self.config.backend)
            except OutputRuleError as exc:
                cand.code = exc.code
                cand.result = EvalResult(
                    status=Status.FORMAT_ERROR,
                    error_log=f"Output rules broken: {exc}",
                    metadata={"checked_by": "kernelwright.models.extract", "evaluated": False},
                )
        todo = [c for c in cands if c.code is not None and c.result is None]
        if todo:
            rnd.code = todo[0].code  # names the round's folder (the recorder keeps the first name it gives)
            round_dir = self.recorder.round_dir(rnd)

        def evaluate(cand: Candidate) -> None:
            code = cand.code
            assert code is not None, "only candidates with code are evaluated"
            report = None
            if round_dir is not None:
                name = run_files.candidate_dir_name(cand.index, code)
                report = round_dir / run_files.CANDIDATES_DIR / name / run_files.PROFILE_DIR
            cand.result = self.evaluate(
                self.problem, code, lambda stage: self._progress(rnd.index, f"candidate {cand.index}: {stage}"), report
            )
            cand.evaluated = True

        if getattr(self.evaluate, "concurrent", False) and len(todo) > 1:
            with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="kw-candidate") as pool:
                list(pool.map(evaluate, todo))
        else:
            for cand in todo:
                evaluate(cand)
        rnd.candidates = cands
        chosen, rnd.chosen_why = choose_candidate(cands)
        rnd.chosen = chosen.index
        rnd.coder, rnd.code, rnd.result, rnd.evaluated = chosen.coder, chosen.code, chosen.result, chosen.evaluated
        if rnd.evaluated:
            self._settle(rnd)

    def _stop_reason(self, rounds_done: int) -> str | None:
        cfg, st = self.config, self.state
        best = st.best.result if st.best is not None else None
        # a figure the record withholds reaches no target
        if cfg.target_speedup is not None and best is not None and not best.speedup_withheld_by:
            if (best.speedup or 0) >= cfg.target_speedup:
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
        best = self.state.best
        self.on_progress(
            Progress(
                round=index,
                stage=stage,
                verdict=rnd.verdict if rnd else None,
                speedup=rnd.speedup if rnd else None,
                best_speedup=best.speedup if best else None,
                result=rnd.result if rnd else None,
                best_round=best.index if best else None,
                decision=(rnd.best_decision or None) if rnd else None,
                judge_error=rnd.judge_error if rnd else None,
            )
        )


def _result(rnd: Round | Candidate) -> EvalResult:
    """The record of a round or candidate the loop has checked (format-checked or evaluated)."""
    assert rnd.result is not None, f"round or candidate {rnd.index} has no result yet"
    return rnd.result


def _coder(rnd: Round | Candidate) -> ModelCall:
    """The Coder call of a round or candidate that has asked the Coder."""
    assert rnd.coder is not None, f"round or candidate {rnd.index} has not asked the Coder yet"
    return rnd.coder


# How far a failed candidate got: the further, the more its error says about the kernel itself
# (an incorrect one built and ran; a compile error says nothing about the numbers).
_PROGRESS = {
    Status.INCORRECT: 5,
    Status.RUNTIME_ERROR: 4,
    Status.TIMEOUT: 3,
    Status.CRASHED: 2,
    Status.COMPILE_ERROR: 1,
    Status.FORMAT_ERROR: 0,
}


def choose_candidate(cands: list[Candidate]) -> tuple[Candidate, str]:
    """The candidate the Judge reviews: the fastest correct one (a timed one before an untimed one,
    a trusted figure before one its record withholds), else the failure that got furthest
    (incorrect > runtime error > timeout > crash > compile error > format error), else the first;
    ties go to the lower index."""
    passed = [c for c in cands if c.result is not None and c.result.status is Status.PASSED]
    if passed:
        best = max(
            passed,
            key=lambda c: (
                _figure(_result(c)) is not None,
                not _unstable(_result(c)),
                _figure(_result(c)) or 0.0,
                -c.index,
            ),
        )
        return best, f"the fastest of {len(passed)} correct candidates"
    failed = [c for c in cands if c.result is not None]
    if failed:
        best = max(failed, key=lambda c: (_PROGRESS.get(_result(c).status, -1), -c.index))
        return best, f"none correct; the {_result(best).status.value} got furthest"
    return cands[0], "no candidate was evaluated"


def _figure(result: EvalResult) -> float | None:
    """The speed-up the loop compares: None untimed, or faster than the hardware can go."""
    return None if "faster_than_hardware" in result.speedup_withheld_by else result.speedup


def _unstable(result: EvalResult) -> bool:
    return "timing_unstable" in result.speedup_withheld_by


def _band(result: EvalResult, factor: float) -> tuple[float, float]:
    """(slow end, fast end) of a timed result's speedup, from its candidate timing's p10/p90 spread:
    speedup x median/p90 and speedup x median/p10, each distance from the speedup scaled by `factor`.
    A result without timing statistics has a band of width zero."""
    s, t = result.speedup, result.candidate_timing
    if s is None or t is None or not (t.median_ms > 0 and t.p10_ms > 0 and t.p90_ms > 0) or factor == 0:
        return s or 0.0, s or 0.0
    slow = s / (1 + factor * max(t.p90_ms / t.median_ms - 1, 0.0))
    fast = s * (1 + factor * max(t.median_ms / t.p10_ms - 1, 0.0))
    return slow, fast


def code_hash(code: str | None) -> str:
    """The first 12 hex digits of the code's sha256 ("" for no code): what "the same code" means."""
    import hashlib

    return hashlib.sha256(code.encode()).hexdigest()[:12] if code is not None else ""


def keep(rnd: Round, best: Round | None, config: LoopConfig) -> tuple[bool, str]:
    """Does the correct round `rnd` replace `best`? (decision, the reason in words)

    The best's own code submitted again (the same hash) never does, whatever its timing: a second
    measurement of one kernel is noise, not progress. Otherwise `improvement` decides on the timings.
    """
    if best is not None and rnd.code is not None and code_hash(rnd.code) == code_hash(best.code):
        return False, (
            f"the same code as round {best.index} (sha256 {code_hash(rnd.code)}); "
            "identical code never replaces the best, whatever its timing"
        )
    return improvement(_result(rnd), best.result if best else None, config)


def improvement(new: EvalResult, best: EvalResult | None, config: LoopConfig) -> tuple[bool, str]:
    """Does the correct candidate `new` replace `best`? (decision, the reason in words)

    The rule: timed speedups s_new and s_best (each measured side by side with the original) and
    the candidate's own timing spread (p10/p90 of its runs). `new` wins when
        s_new >= s_best * (1 + min_improvement)                      (clearly faster), and
        s_new * median/p90 (new's slow end) > s_best * median/p10 (best's fast end)
    with each band's width scaled by `spread_factor` (0: no spread test). So a re-submitted
    identical candidate, or one within the measured noise, never wins; neither does a regression.
    The first correct candidate always becomes the best; an untimed pass never replaces a timed one.
    A speed-up the record withholds ranks below one that stands: `faster_than_hardware` (a time under
    what the hardware can do) counts as untimed; `timing_unstable` (timed while the conditions did
    not hold) never replaces a figure that stands, and one that stands replaces it; two unstable
    figures are compared by the rule above, whose bands their own spread widens (on a shared CPU
    most figures are unstable, and the loop must still be able to keep the faster kernel).
    """
    if best is None:
        return True, "the first correct candidate"
    s_new, s_best = _figure(new), _figure(best)
    if s_new is None:
        if new.speedup is None:
            return False, "passed but untimed; an untimed candidate never replaces a timed one"
        return False, (
            f"passed at {new.speedup:.3f}x, faster than the hardware can go (faster_than_hardware): "
            "a figure that decides nothing never replaces the best"
        )
    if s_best is None:
        if best.speedup is None:
            return True, f"timed at {s_new:.3f}x; the best so far was untimed"
        return True, f"timed at {s_new:.3f}x; the best so far ({best.speedup:.3f}x) was faster than the hardware can go"
    if _unstable(new) and not _unstable(best):
        return False, (
            f"passed at {s_new:.3f}x, a figure not trusted (timing_unstable: timed while the conditions "
            f"did not hold); it never replaces a best that stands ({s_best:.3f}x)"
        )
    if _unstable(best) and not _unstable(new):
        return True, f"timed at {s_new:.3f}x; the best so far ({s_best:.3f}x) was not trusted (timing_unstable)"
    slow_new, _ = _band(new, config.spread_factor)
    _, fast_best = _band(best, config.spread_factor)
    floor = s_best * (1 + config.min_improvement)
    # the speedup `new` would have needed with its own spread: both conditions, stated as one number
    needed = max(floor, fast_best * (s_new / slow_new if slow_new > 0 else 1.0))
    if s_new <= s_best:
        return False, f"{s_new:.3f}x is not faster than the best ({s_best:.3f}x)"
    if s_new < floor:
        return False, (
            f"{s_new:.3f}x beats the best ({s_best:.3f}x) by less than the "
            f"{config.min_improvement:.0%} minimum (needs {needed:.3f}x)"
        )
    if slow_new <= fast_best:
        return False, (
            f"{s_new:.3f}x is within the measured timing spread of the best ({s_best:.3f}x): its slow end "
            f"{slow_new:.3f}x does not clear the best's fast end {fast_best:.3f}x (needs {needed:.3f}x)"
        )
    return True, f"{s_new:.3f}x beats the best ({s_best:.3f}x) beyond the measured spread (needed {needed:.3f}x)"


def _history_entry(rnd: Round) -> dict[str, Any]:
    exp = rnd.expectation
    return {
        "round": rnd.index,
        "verdict": rnd.verdict,
        "speedup": rnd.speedup,
        "became_best": rnd.became_best,
        "expectation": exp.sentence() if exp is not None and exp.measured_over_baseline is not None else None,
    }


def _profile_text(result: EvalResult | None) -> str:
    """The hardware evidence the engine attached (GPU facts, roofline, kernel profile), as text."""
    return render_for_llm_judge(result) if result is not None else ""
