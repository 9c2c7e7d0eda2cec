"""The one rule for whether an output is right (engine/child/correctness.py): a check's output
against the reference's under the configured mode, as sloppy and hostile candidates return it."""

from __future__ import annotations

import torch

from kernelwright.core.config import EvalConfig
from kernelwright.engine.child.correctness import errors, judge_output


def _ref() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    return x * torch.sigmoid(x), (x.double() * torch.sigmoid(x.double()))


def test_an_output_of_another_structure_fails_before_any_number_is_compared():
    ref, oracle = _ref()
    j = judge_output((ref,), ref, oracle, EvalConfig(device="cpu"))  # a one-element tuple of the right tensor
    assert not j.passed and j.strict is None and j.calibrated is None
    assert j.evidence == {"strict_passed": False} and j.message


def test_the_right_output_passes_in_both_modes_and_says_so_in_its_evidence():
    ref, oracle = _ref()
    for mode in ("strict", "calibrated"):
        j = judge_output(ref.clone(), ref, oracle, EvalConfig(device="cpu", verdict=mode))
        assert j.passed, (mode, j.message)
        assert j.evidence["strict_passed"] and j.evidence.get("calibrated_passed", True)
    j = judge_output(ref.clone(), ref, oracle, EvalConfig(device="cpu", verdict="calibrated"))
    assert j.calibrated is not None  # the verdict followed the oracle's report


def test_nan_where_the_reference_has_numbers_and_a_constant_output_fail():
    ref, oracle = _ref()
    nan = ref.clone()
    nan[3, 4] = float("nan")
    for wrong in (nan, torch.zeros_like(ref)):
        for mode in ("strict", "calibrated"):
            j = judge_output(wrong, ref, oracle, EvalConfig(device="cpu", verdict=mode))
            assert not j.passed, mode
    assert errors(nan, ref) is None  # the timed check's measure agrees: not comparable, so wrong


def test_without_an_oracle_the_calibrated_mode_falls_back_to_allclose():
    ref, _ = _ref()
    off = ref + 0.5
    j = judge_output(off, ref, None, EvalConfig(device="cpu", verdict="calibrated"))
    assert not j.passed and j.calibrated is None and j.strict is not None and not j.strict.passed
