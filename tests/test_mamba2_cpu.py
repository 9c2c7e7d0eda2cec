"""The buggy Mamba-2 SSD candidates are caught on the CPU; a correct plain-torch control passes."""

from __future__ import annotations

import ast
import subprocess
import sys

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


@pytest.mark.slow
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


def _source(path, name):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return node.value.value
    raise AssertionError(f"{path.name} defines no {name}")


def test_the_fused_candidates_are_written_from_the_kernel_source():
    """candidate_y.py and candidate_state.py are what make_candidates.py writes from ssd_kernel.cu and
    ssd_bindings.cpp (edit those, then run it); both hold the same sources, so one build serves both."""
    out = subprocess.run(
        [sys.executable, str(MAMBA2 / "make_candidates.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for kind in ("y", "state"):
        path = MAMBA2 / f"candidate_{kind}.py"
        assert _source(path, "cuda_source") == "\n" + (MAMBA2 / "ssd_kernel.cu").read_text()
        assert _source(path, "cpp_source") == "\n" + (MAMBA2 / "ssd_bindings.cpp").read_text()


def test_a_stale_candidate_is_reported(tmp_path):
    """The check fails, naming the file and the fix, when a candidate no longer matches its sources."""
    for name in ("make_candidates.py", "ssd_kernel.cu", "ssd_bindings.cpp", "candidate_y.py", "candidate_state.py"):
        (tmp_path / name).write_text((MAMBA2 / name).read_text())
    (tmp_path / "ssd_kernel.cu").write_text((MAMBA2 / "ssd_kernel.cu").read_text() + "// an edit\n")
    out = subprocess.run(
        [sys.executable, str(tmp_path / "make_candidates.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "not current: candidate_y.py, candidate_state.py; run python3 examples/mamba2_ssd/make_candidates.py"
    )


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
