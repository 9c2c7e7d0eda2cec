"""The mode the models run in (EvalConfig.model_mode): as their constructors leave them, as
KernelBench and the published figures run them, so a BatchNorm normalises by its batch. In eval mode a
fresh BatchNorm is nearly the identity: a candidate that computes the batch's statistics (what a
fused level-2 kernel does) reads `incorrect` there, and one that leaves the norm out reads `passed`."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import FIXTURES
from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

MM = FIXTURES / "model_mode"


def test_the_default_is_the_mode_the_constructor_leaves():
    assert EvalConfig().model_mode == "as_constructed"
    with pytest.raises(ValueError, match="model.mode"):
        EvalConfig(model_mode="train").validate()  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,honest,skipper",
    [("as_constructed", Status.PASSED, Status.INCORRECT), ("eval", Status.INCORRECT, Status.PASSED)],
)
def test_batch_statistics_are_the_reference_s_as_constructed(cpu_config, mode, honest, skipper):
    cfg = dataclasses.replace(cpu_config, model_mode=mode)
    r = evaluate(MM / "conv_bn.py", MM / "fused_batch_stats.py", cfg)
    assert r.status is honest, r.error_log
    r = evaluate(MM / "conv_bn.py", MM / "skips_the_norm.py", cfg)
    assert r.status is skipper, r.error_log
    if skipper is Status.INCORRECT:
        assert "not close" in (r.error_log or "")


def test_a_reference_that_draws_at_random_as_constructed_runs_in_eval_mode(cpu_config):
    """A Dropout(p=0.2) as the last step: as constructed the reference's output is a random draw, and
    a check against it (its own float64 copy draws other masks) could not tell a wrong candidate from
    a right one. Both models run in eval mode instead, and the record says why."""
    r = evaluate(MM / "gemm_dropout.py", MM / "gemm_dropout_same.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.metadata["model_mode"]["used"] == "eval" and "random draw" in r.metadata["model_mode"]["why"]
    assert "random draw" in r.flags()["random_reference"]  # the line a reader of the report sees
    assert r.metadata["numerics"]["strict_passed"]  # checked value by value, not within the noise
    r = evaluate(MM / "gemm_dropout.py", MM / "gemm_dropout_no_relu.py", cpu_config)
    assert r.status is Status.INCORRECT, r.error_log
    # a model with no random draw keeps the mode it was constructed in (its BatchNorm's batch statistics)
    r = evaluate(MM / "conv_bn.py", MM / "fused_batch_stats.py", cpu_config)
    assert r.status is Status.PASSED and "model_mode" not in r.metadata, r.error_log
    assert "random_reference" not in r.flags() and "random_reference" in r.metadata["guards"]["checked"]


def test_the_probing_calls_leave_the_running_statistics_as_constructed(cpu_config):
    """BatchNorm and a Dropout: eval mode, with the statistics a fresh BatchNorm has, so the
    reference's own code (a fresh BatchNorm too) matches it; without the state put back, the two
    probing calls in training mode would have moved the reference's running mean (inputs * 3 + 1)."""
    r = evaluate(MM / "conv_bn_dropout.py", MM / "conv_bn_dropout_same.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.metadata["model_mode"]["used"] == "eval"


def test_a_reference_that_draws_in_eval_mode_too_is_checked_strictly(cpu_config):
    """Noise in the forward itself: no mode removes it, and against its own float64 copy it looks
    like an ill-conditioned problem, so the calibrated rule widened its tolerance to the noise and
    passed a candidate biased by 0.02 (less than the noise). It is checked strictly instead."""
    r = evaluate(MM / "noisy_relu.py", MM / "noisy_biased.py", cpu_config)
    assert r.status is Status.INCORRECT, r.error_log
    assert r.metadata["numerics"]["verdict"] == "strict"
    assert "in eval mode too" in r.flags()["random_reference"]
    assert r.metadata["model_mode"]["used"] == "as_constructed"  # eval mode removed no draw: not used
