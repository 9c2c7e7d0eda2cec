"""The verdict's precedence, as a table: facts in, (status, stage, words of the log) out."""

from __future__ import annotations

import pytest

from kernelwright.core.record import Stage, Status
from kernelwright.engine.child.verdict import Facts, Failure, decide

BUILD = Failure(Status.COMPILE_ERROR, "Compilation of extension 'k' failed", Stage.BUILD)
RAISED = Failure(Status.RUNTIME_ERROR, "ModelNew.forward raised on trial0", Stage.CORRECTNESS)
GUARD_CALL = Failure(Status.INCORRECT, "ModelNew's output on a further input is wrong", Stage.CORRECTNESS)
WINDOW = Failure(Status.TIMEOUT, "Timed out in stage 'timing': the runner did not finish a timing window", Stage.TIMING)
WRONG = (1, 1234, "Outputs are not close (atol=0.001, rtol=0.001).")
PASSED = dict(checks_passed=True, timing_expected=True, timed=True)

TABLE = [
    # (what happened, facts, status, stage, words the log must hold)
    ("all checks passed and timed", Facts(trials=5, **PASSED), Status.PASSED, None, ""),
    (
        "the parent's deadline beats everything",
        Facts(
            trials=5,
            reported=BUILD,
            runner_timed_out_stage="build",
            runner_limit_s=600,
            runner_finished=False,
            **PASSED,
        ),
        Status.TIMEOUT,
        Stage.BUILD,
        "after 600 s",
    ),
    (
        "a flood is a crash",
        Facts(trials=5, protocol_violation="a flood", **PASSED),
        Status.CRASHED,
        Stage.STARTUP,
        "flood",
    ),
    (
        "died by a signal without finishing",
        Facts(
            trials=5,
            runner_finished=False,
            runner_ended_how="was killed by SIGSEGV",
            runner_stage="correctness",
            first_wrong_trial=WRONG,
            failed_trials=1,
        ),
        Status.CRASHED,
        Stage.CORRECTNESS,
        "SIGSEGV",
    ),
    (
        "stopped by the judge after its failure: the failure stands",
        Facts(trials=5, reported=WINDOW, runner_finished=False, runner_stage="timing"),
        Status.TIMEOUT,
        Stage.TIMING,
        "timing window",
    ),
    ("a build error stands", Facts(trials=5, reported=BUILD), Status.COMPILE_ERROR, Stage.BUILD, "Compilation"),
    (
        "a raised exception beats a wrong trial seen before it",
        Facts(trials=5, reported=RAISED, first_wrong_trial=WRONG, failed_trials=1),
        Status.RUNTIME_ERROR,
        Stage.CORRECTNESS,
        "raised",
    ),
    (
        "a wrong trial, with the ablation's finding",
        Facts(
            trials=5,
            first_wrong_trial=WRONG,
            failed_trials=2,
            ablation_lines=("the mismatch disappears when 'w' is 0",),
        ),
        Status.INCORRECT,
        Stage.CORRECTNESS,
        "2/5 trials failed; first failing trial 1, seed 1234",
    ),
    (
        "a wrong trial beats the guards' own wrong output",
        Facts(trials=5, reported=GUARD_CALL, first_wrong_trial=WRONG, failed_trials=1),
        Status.INCORRECT,
        Stage.CORRECTNESS,
        "first failing trial 1",
    ),
    (
        "the guards' further input wrong",
        Facts(trials=5, reported=GUARD_CALL),
        Status.INCORRECT,
        Stage.CORRECTNESS,
        "further input",
    ),
    (
        "a failing guard after timing",
        Facts(trials=5, failed_guards=(("timed_output_mismatch", "3 of 40"),), **PASSED),
        Status.INCORRECT,
        Stage.TIMING,
        "Reward-hacking guard failed: timed_output_mismatch",
    ),
    (
        "a failing guard before timing",
        Facts(trials=5, checks_passed=True, failed_guards=(("mutates_inputs", "x"),)),
        Status.INCORRECT,
        Stage.CORRECTNESS,
        "mutates_inputs",
    ),
    (
        "asked to time, no figure",
        Facts(trials=5, checks_passed=True, timing_expected=True),
        Status.RUNTIME_ERROR,
        Stage.TIMING,
        "no timing came back",
    ),
    ("not asked to time", Facts(trials=5, checks_passed=True), Status.PASSED, None, ""),
    (
        "ended without a word",
        Facts(trials=5, runner_stage="init"),
        Status.RUNTIME_ERROR,
        Stage.INIT,
        "without a result",
    ),
    (
        "ended without finishing, no signal",
        Facts(trials=5, runner_finished=False, runner_stage="correctness"),
        Status.CRASHED,
        Stage.CORRECTNESS,
        "ended during stage 'correctness'",
    ),
]


@pytest.mark.parametrize("what,facts,status,stage,words", TABLE, ids=[row[0] for row in TABLE])
def test_decide(what, facts, status, stage, words):
    v = decide(facts)
    assert (v.status, v.stage) == (status, stage), (what, v)
    assert words in v.log, (what, v.log)
