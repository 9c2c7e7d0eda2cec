"""The buggy Mamba-2 SSD candidates are caught on the CPU; a correct plain-torch control passes."""

from __future__ import annotations

import ast

import pytest

from conftest import FIXTURES
from helpers.mamba2_shapes import MAMBA2, problem_at_shape
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

BUGGY = FIXTURES / "mamba2"
SMALL = dict(batch_size=2, seq_length=64, n_heads=2, d_head=8, d_state=4, block_len=16)


@pytest.fixture(scope="module")
def small_problems(tmp_path_factory):
    dest = tmp_path_factory.mktemp("mamba2")
    return {kind: problem_at_shape(kind, dest, **SMALL) for kind in ("y", "state")}


@pytest.mark.parametrize("kind", ["y", "state"])
def test_plain_torch_control_passes(cpu_config, small_problems, kind):
    r = evaluate(small_problems[kind], BUGGY / f"ssd_torch_{kind}.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log


@pytest.mark.parametrize(
    "kind, candidate",
    [("y", "buggy_segsum_y.py"), ("y", "buggy_reshape_y.py"), ("state", "buggy_segsum_state.py")],
)
def test_buggy_candidate_is_incorrect(cpu_config, small_problems, kind, candidate):
    r = evaluate(small_problems[kind], BUGGY / candidate, cpu_config)
    assert r.status is Status.INCORRECT, r.error_log
    assert "Outputs are not close" in r.error_log
    assert all(not t.passed for t in r.trials)  # wrong on every input, not by chance


def _cuda_source(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "cuda_source":
            return node.value.value
    raise AssertionError(f"{path.name} defines no cuda_source")


def test_fused_candidates_share_one_kernel_source():
    """Both candidates build the same extension (one build serves both); they differ only in mode."""
    assert _cuda_source(MAMBA2 / "candidate_y.py") == _cuda_source(MAMBA2 / "candidate_state.py")


@pytest.mark.parametrize(
    "kind, candidate, pointer, unnamed",
    [
        # the decay exp(segsum(A)) is where it goes wrong: zeroing A in both models hides the mismatch
        ("y", "buggy_segsum_y.py", "parameter 'A' is set to 0", None),
        ("state", "buggy_segsum_state.py", "parameter 'A' is set to 0", None),
        # chunks put back in the wrong order; the ablation's control: zeroing A does not hide a
        # reordering, so no parameter is named (a passing candidate is never ablated: no control there)
        ("y", "buggy_reshape_y.py", "'(c l)' where '(l c)' was meant", "parameter 'A'"),
    ],
)
def test_buggy_candidate_error_log_points_at_its_bug(cpu_config, small_problems, kind, candidate, pointer, unnamed):
    r = evaluate(small_problems[kind], BUGGY / candidate, cpu_config)
    assert r.status is Status.INCORRECT, r.error_log
    assert pointer in r.error_log, r.error_log
    assert unnamed is None or unnamed not in r.error_log, r.error_log
