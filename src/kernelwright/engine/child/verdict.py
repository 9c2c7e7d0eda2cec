"""The verdict: one pure function from the facts of an evaluation to (status, log, stage).

The judge collects facts while the evaluation runs (the first failure anyone reported, the first
wrong trial, the guard flags, whether every check passed, whether timing came back, how the
runner ended as the parent saw it) and calls `decide` once, at the end. The precedence is
written once, top to bottom, and tested as a table (tests/test_verdict_decide.py):

1. the runner ran past a stage's deadline: `timeout`;
2. the runner broke the protocol (a flood), or died without finishing: `crashed`;
3. a failure reported during the evaluation other than a wrong output (a build error, a raised
   exception, the reference's own failure, a timing window that did not close): that failure;
4. a wrong trial: `incorrect`, with the first failing trial and the ablation's findings;
5. a wrong output on the guards' further input: `incorrect`;
6. every check passed but a guard that fails the verdict raised its flag: `incorrect`;
7. every check passed, timing was asked for and none came back: `runtime_error`;
8. every check passed: `passed`;
9. otherwise the runner ended without a result: `runtime_error`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelwright.core.record import Stage, Status

_STAGES = {s.value: s for s in Stage}


@dataclass(frozen=True)
class Failure:
    status: Status
    log: str
    stage: Stage | None


@dataclass(frozen=True)
class Facts:
    trials: int  # trials asked for
    reported: Failure | None = None  # the first failure reported during the evaluation
    first_wrong_trial: tuple[int, int, str] | None = None  # (trial, seed, message)
    failed_trials: int = 0
    ablation_lines: tuple[str, ...] = ()
    checks_passed: bool = False  # every trial and the guards' calls right, every expected report in
    failed_guards: tuple[tuple[str, str], ...] = ()  # (flag, evidence) of flags that fail the verdict
    timing_expected: bool = False
    timed: bool = False  # the judge's timing windows produced a figure
    runner_timed_out_stage: str | None = None
    runner_limit_s: float = 0.0
    runner_limit_kind: str = "stage"  # "report": the judge's limit between two reports (a call that never returns)
    protocol_violation: str | None = None
    runner_finished: bool = True  # it said `done` (or was told to stop)
    runner_ended_how: str = ""  # "was killed by SIGSEGV", ... ('' when it exited by itself or was stopped)
    runner_stage: str = "startup"  # the last stage the runner announced
    notes: dict[str, str] = field(default_factory=dict)


def decide(f: Facts) -> Failure:
    """The verdict for `f`, by the precedence in the module's docstring."""
    stage = _STAGES.get(f.runner_stage)
    if f.runner_timed_out_stage and f.runner_limit_kind == "report":
        return Failure(
            Status.TIMEOUT,
            f"Timed out in stage '{f.runner_timed_out_stage}': a call of the candidate did not return within "
            f"{f.runner_limit_s:g} s (the limit its reference's own time sets); the process group was killed.",
            _STAGES.get(f.runner_timed_out_stage),
        )
    if f.runner_timed_out_stage:
        return Failure(
            Status.TIMEOUT,
            f"Timed out in stage '{f.runner_timed_out_stage}' after {f.runner_limit_s:g} s; "
            "the process group was killed (a kernel or loop that never returns, or a build that is too "
            "slow).",
            _STAGES.get(f.runner_timed_out_stage),
        )
    if f.protocol_violation:
        return Failure(Status.CRASHED, f.protocol_violation, stage)
    if f.runner_ended_how and not f.runner_finished:
        return Failure(
            Status.CRASHED,
            f"The evaluation process {f.runner_ended_how} during stage '{f.runner_stage}' "
            "without finishing (a segfault, abort, os._exit or sys.exit in the candidate, or the process "
            "ran out of memory).",
            stage,
        )
    if f.reported is not None and f.reported.status is not Status.INCORRECT:
        return f.reported
    if f.first_wrong_trial is not None:
        t, seed, msg = f.first_wrong_trial
        where = "".join(f"\n  where: {ln}" for ln in f.ablation_lines)
        return Failure(
            Status.INCORRECT,
            f"{msg}{where}\n  ({f.failed_trials}/{f.trials} trials failed; first failing trial {t}, seed {seed})",
            Stage.CORRECTNESS,
        )
    if f.reported is not None:
        return f.reported
    if f.checks_passed:
        if f.failed_guards:
            lines = [f"Reward-hacking guard failed: {', '.join(n for n, _ in f.failed_guards)}"]
            lines += [f"  {n}: {d}" for n, d in f.failed_guards]
            return Failure(Status.INCORRECT, "\n".join(lines), Stage.TIMING if f.timed else Stage.CORRECTNESS)
        if f.timing_expected and not f.timed:
            return Failure(Status.RUNTIME_ERROR, "The candidate was to be timed but no timing came back", Stage.TIMING)
        return Failure(Status.PASSED, "", None)
    if not f.runner_finished:
        return Failure(
            Status.CRASHED,
            f"The evaluation process {f.runner_ended_how or 'ended'} during stage "
            f"'{f.runner_stage}' without finishing (a segfault, abort, os._exit or sys.exit in the "
            "candidate, or the process ran out of memory).",
            stage,
        )
    return Failure(Status.RUNTIME_ERROR, "The runner ended without a result", stage)
