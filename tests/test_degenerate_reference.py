"""A reference whose output does not depend on its input: flagged `degenerate_reference`, never a failure."""

from __future__ import annotations

import pytest
import torch

from conftest import ADD_ONE, CANDIDATES, FIXTURES
from kernelwright.core.config import GuardConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import degenerate

DG = FIXTURES / "degenerate"


# ---- the pure detector --------------------------------------------------------------------------


def test_identical_outputs_for_different_inputs_are_degenerate():
    trials = [([torch.randn(4, 8)], torch.full((4, 3), 0.5)) for _ in range(3)]
    f = degenerate.detect(trials)
    assert f.degenerate
    assert "does not depend on its input" in f.reason and "constant 0.5" in f.reason
    assert "speed-up measures nothing" in f.reason


def test_outputs_that_follow_the_input_are_not_degenerate():
    trials = []
    for _ in range(3):
        x = torch.randn(4, 8)
        trials.append(([x], x.sum(dim=1, keepdim=True)))
    assert not degenerate.detect(trials).degenerate


def test_a_per_trial_constant_that_changes_with_the_input_is_not_degenerate():
    trials = []
    for _ in range(3):
        x = torch.randn(4, 8)
        trials.append(([x], x.mean().expand(4, 3)))  # constant within a trial, not across trials
    assert not degenerate.detect(trials).degenerate


def test_identical_inputs_say_nothing():
    x = torch.randn(4, 8)
    assert not degenerate.detect([([x], torch.zeros(2)), ([x.clone()], torch.zeros(2))]).degenerate


def test_one_trial_says_nothing():
    assert not degenerate.detect([([torch.randn(3)], torch.zeros(2))]).degenerate


def test_one_constant_output_among_varying_ones_is_not_degenerate():
    trials = []
    for _ in range(3):
        x = torch.randn(4, 8)
        trials.append(([x], (torch.zeros(2), x * 2)))
    assert not degenerate.detect(trials).degenerate


def test_a_non_constant_but_input_independent_output_is_degenerate():
    fixed = torch.arange(6.0)
    f = degenerate.detect([([torch.randn(3)], fixed.clone()) for _ in range(2)])
    assert f.degenerate and "is the same tensor" in f.reason


def test_outputs_with_nan_and_integer_inputs_are_fingerprinted_alike_across_trials():
    """Non-finite outputs and integer inputs take the detector's general path; finite floats the fast one."""
    out = torch.tensor([float("nan"), 1.0, float("inf"), -2.0])
    trials = [([torch.randint(0, 100, (16,))], out.clone()) for _ in range(3)]
    f = degenerate.detect(trials)
    assert f.degenerate and "is the same tensor" in f.reason
    a = degenerate.fingerprint(out)
    assert a.nans == 1 and (a.lo, a.hi) == (-2.0, 1.0)
    moved = out.clone()
    moved[1] = 1.5  # one finite element differs: not the same tensor
    assert not degenerate.detect([([torch.randn(3)], out.clone()), ([torch.randn(3)], moved)]).degenerate


def test_a_finite_fingerprint_sees_a_change_outside_its_sample():
    x = torch.randn(64 * degenerate.SAMPLE)  # strided sample: most elements are not in it
    y = x.clone()
    y[1] += 1.0  # element 1 is not sampled (stride 64)
    fx, fy = degenerate.fingerprint(x), degenerate.fingerprint(y)
    assert fx.sample == fy.sample and fx.nans == fy.nans == 0
    assert fx != fy  # the float64 sums see it


def test_identical_is_element_for_element_with_nan_equal_to_nan():
    nan = torch.tensor([float("nan"), 1.0])
    assert degenerate.identical((nan, 3), (nan.clone(), 3))
    assert not degenerate.identical((nan, 3), (nan.clone(), 4))  # a plain value differs
    assert not degenerate.identical(torch.zeros(4), torch.zeros(4).index_fill(0, torch.tensor([2]), 1e-30))
    assert not degenerate.identical(torch.zeros(4), torch.zeros(4, dtype=torch.float64))
    assert not degenerate.identical([torch.zeros(4)], [torch.zeros(4), torch.zeros(4)])
    assert degenerate.identical(torch.arange(3), torch.arange(3))


# ---- through the engine: KernelBench-like degenerate problems ----------------------------------


@pytest.mark.parametrize(
    "problem,candidate,value",
    [
        ("linear_min_clamp.py", "const_candidate.py", "0.5"),
        ("matmul_mean_softmax.py", "ones_candidate.py", "1"),
        ("gemm_max_subtract_gelu.py", "zeros_candidate.py", "0"),
    ],
)
def test_constant_candidate_passes_with_the_flag_and_its_sentence(cpu_config, problem, candidate, value):
    r = evaluate(DG / problem, DG / candidate, cpu_config)
    assert r.status is Status.PASSED, r.error_log  # the candidate is right: the problem is degenerate
    flags = r.metadata["guards"]["flags"]
    assert "degenerate_reference" in flags
    assert f"the constant {value} in every element" in flags["degenerate_reference"]
    assert "speed-up measures nothing" in flags["degenerate_reference"]
    assert "degenerate_reference" not in r.metadata["guards"]["failed"]
    assert "degenerate_reference" not in GuardConfig().fail_on
    assert r.degenerate_reference and not r.speedup_trusted
    assert r.speedup is not None  # measured and kept, but not to be aggregated


RARELY_LEAVES_ZERO = """
import torch
import torch.nn as nn

_draws = [0]


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x - 3.0)


def get_inputs():
    # the trials' handful of draws all below the shift (as CUDA-L1's level 2 problem 9's trials
    # can all be: its output is zero but for one element in a few thousand); the timing's many not
    _draws[0] += 1
    x = torch.randn(64)
    return [x.clamp(max=2.0) if _draws[0] <= 20 else 3.0 * x]


def get_init_inputs():
    return []
"""


def test_a_reference_whose_trials_all_drew_one_output_but_whose_timed_draws_differ_is_not_degenerate(
    cpu_config, tmp_path
):
    problem, cand = tmp_path / "rarely_leaves_zero.py", tmp_path / "cand.py"
    problem.write_text(RARELY_LEAVES_ZERO)
    cand.write_text(
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.clamp_min(x - 3.0, 0.0)\n"
    )
    r = evaluate(problem, cand, cpu_config)
    assert r.status is Status.PASSED, r.error_log
    guards = r.metadata["guards"]
    assert "degenerate_reference" not in guards["flags"] and not r.degenerate_reference
    assert guards["facts"]["timed_reference_outputs_vary"] is True
    assert "the timed draws' were not" in guards["facts"]["degenerate_reference"]  # what the trials alone said


def test_an_honest_problem_is_not_flagged(cpu_config):
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert "degenerate_reference" not in r.metadata["guards"]["flags"]
    assert "degenerate_reference" in r.metadata["guards"]["checked"]
    assert not r.degenerate_reference
