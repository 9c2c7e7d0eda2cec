"""A verdict another draw of inputs could turn says so: the `borderline` flag and the margin (the
worst error over what the deciding rule allows; 1 is the edge), either side of the edge."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import ADD_ONE, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child.compare import compare_tensors

HERE = FIXTURES / "borderline"


def quick(cfg):
    return dataclasses.replace(cfg, time_candidate=False)


def test_passed_near_the_edge_is_borderline(cpu_config):
    r = evaluate(ADD_ONE, HERE / "near_edge_pass.py", quick(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    assert "borderline" in r.flags()
    margin = r.metadata["numerics"]["margin"]
    assert 0.5 <= margin <= 1.0, margin
    assert f"{margin:.2f} of what the tolerance allows" in r.metadata["guards"]["flags"]["borderline"]


def test_failed_near_the_edge_is_borderline_and_still_fails(cpu_config):
    r = evaluate(ADD_ONE, HERE / "near_edge_fail.py", quick(cpu_config))
    assert r.status is Status.INCORRECT
    assert "borderline" in r.flags()
    assert 1.0 < r.metadata["numerics"]["margin"] <= 2.0


def test_well_inside_the_tolerance_is_not_borderline(cpu_config):
    r = evaluate(ADD_ONE, HERE / "well_inside.py", quick(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    assert "borderline" not in r.flags()
    assert r.metadata["numerics"]["margin"] < 0.5


def test_strict_mode_measures_the_margin_against_allclose(cpu_config):
    r = evaluate(ADD_ONE, HERE / "near_edge_pass.py", dataclasses.replace(quick(cpu_config), verdict="strict"))
    assert r.status is Status.PASSED and "borderline" in r.flags()


def test_a_wrong_structure_or_a_nan_is_never_borderline():
    ref = torch.ones(4)
    nan = compare_tensors("out", torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref, 1e-3, 1e-3)
    assert nan.tol_ratio == math.inf
    edge = compare_tensors("out", torch.tensor([1.0015, 1.0, 1.0, 1.0]), ref, 1e-3, 1e-3)
    assert edge.tol_ratio == pytest.approx(0.75, rel=1e-4)  # (1.0015 in float32)
    zero_tol = compare_tensors("out", torch.tensor([1e-9]), torch.zeros(1), 0.0, 0.0)
    assert zero_tol.tol_ratio == math.inf and not zero_tol.passed
