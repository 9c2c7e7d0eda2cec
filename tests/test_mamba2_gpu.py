"""The fused Mamba-2 SSD candidates on a GPU: accuracy against a float64 evaluation of the
reference, on inputs of both signs of A and on the shapes the kernel claims to support, and
through the evaluation engine.

Accuracy is judged normwise (||out - ref64|| / ||ref64||), not by allclose against the float32
reference: with A drawn from randn the outputs reach ~1e16 and the float32 reference itself is off
by up to ~6e10 there (see issue 4), so only a float64 oracle tells a correct kernel from a wrong one.
"""

from __future__ import annotations

import copy
import importlib.util
import sys

import pytest

from kernelwright.engine import evaluate
from kernelwright.core.record import Status

from mamba2_shapes import MAMBA2, problem_at_shape

pytestmark = pytest.mark.gpu
TOL = 1e-5  # normwise, against float64


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mods():
    import os

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return {
        "problem_y": _load(MAMBA2 / "problem_y.py", "kw_m2_problem_y"),
        "problem_state": _load(MAMBA2 / "problem_state.py", "kw_m2_problem_state"),
        "y": _load(MAMBA2 / "candidate_y.py", "kw_m2_candidate_y"),
        "state": _load(MAMBA2 / "candidate_state.py", "kw_m2_candidate_state"),
    }


def _poison_allocator(torch, numel):
    """Leave NaN in the caching allocator's free blocks, so unwritten outputs show up."""
    junk = torch.full((numel,), float("nan"), device="cuda")
    del junk


def _run_case(torch, mods, b, l, h, p, n, block, a_sign, seed, p_tile=0, with_initial=False, path=0):
    import torch.nn.functional as F

    prob = mods["problem_y"]
    torch.manual_seed(seed)
    ref = prob.Model(b, l, h, p, n, block).cuda()
    if a_sign < 0:
        ref.A.data.copy_(-F.softplus(torch.randn_like(ref.A)))
    X = torch.randn(b, l, h, p, device="cuda")
    S0 = torch.randn(b, 1, h, p, n, device="cuda") if with_initial else None
    with torch.no_grad():
        ref64 = copy.deepcopy(ref).double()
        Y64, S64 = prob.ssd_chunked(X.double(), ref64.A, ref64.B, ref64.C, block,
                                    None if S0 is None else S0.double())
    ext = mods["y"].ssd_ext
    _poison_allocator(torch, X.numel() * 2)
    Y = ext.ssd_fused_path(X, ref.A.detach(), ref.B.detach(), ref.C.detach(), S0, False, p_tile, path)
    _poison_allocator(torch, X.numel() * 2)
    S = ext.ssd_fused_path(X, ref.A.detach(), ref.B.detach(), ref.C.detach(), S0, True, p_tile, path)
    torch.cuda.synchronize()
    assert Y.shape == Y64.shape and S.shape == S64.shape
    assert torch.isfinite(Y).all() and torch.isfinite(S).all()
    ey = ((Y.double() - Y64).norm() / Y64.norm()).item()
    es = ((S.double() - S64).norm() / S64.norm()).item()
    return ey, es


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_shape_positive_A_matches_float64(mods, seed):
    import torch

    ey, es = _run_case(torch, mods, 16, 128, 8, 64, 16, 64, +1, seed)
    assert ey <= TOL and es <= TOL, (ey, es)


# path 0: picked by shape (d_state 64/128 -> tensor cores); 1: FP32 CUDA-core kernel forced;
# 2: 3xTF32 tensor-core kernel forced (only d_state 64/128).
@pytest.mark.parametrize("path", [0, 1, 2])
@pytest.mark.parametrize(
    "b, l, h, p, n, block, a_sign, p_tile, init",
    [
        (2, 512, 4, 64, 128, 64, -1, 32, False),
        (2, 512, 4, 64, 128, 256, -1, 64, False),
        (2, 256, 3, 128, 64, 64, +1, 0, False),
        (1, 80, 2, 96, 32, 16, +1, 32, False),   # length not a multiple of the kernel's 32-step chunk
        (3, 48, 2, 32, 16, 16, -1, 0, True),     # initial state given
        (2, 192, 2, 64, 128, 64, +1, 64, True),
        (1, 80, 2, 96, 64, 16, +1, 32, True),    # tensor cores: ragged length, initial state, d_head 96
        (3, 48, 2, 64, 128, 16, -1, 32, True),
    ],
)
def test_shapes_and_signs_match_float64(mods, b, l, h, p, n, block, a_sign, p_tile, init, path):
    import torch

    if path == 2 and n not in (64, 128):
        pytest.skip("the tensor-core kernel takes d_state 64 or 128")
    ey, es = _run_case(torch, mods, b, l, h, p, n, block, a_sign, seed=7, p_tile=p_tile, with_initial=init, path=path)
    assert ey <= TOL and es <= TOL, (ey, es)


def test_candidate_modules_compute_the_reference_function(mods):
    """ModelNew draws the same parameters as Model under one seed and returns the same kind of output."""
    import torch

    for kind in ("y", "state"):
        prob = mods[f"problem_{kind}"]
        torch.manual_seed(3)
        ref = prob.Model(*prob.get_init_inputs()).cuda()
        torch.manual_seed(3)
        new = mods[kind].ModelNew(*prob.get_init_inputs()).cuda()
        X = prob.get_inputs()[0].cuda()
        with torch.no_grad():
            want = copy.deepcopy(ref).double()(X.double())
            got = new(X)
        err = ((got.double() - want).norm() / want.norm()).item()
        assert got.shape == want.shape and err <= TOL, (kind, err)


@pytest.mark.parametrize("kind", ["y", "state"])
def test_engine_calibrated_verdict_passes(cuda_config, kind):
    """At the KernelBench shape, through the engine's calibrated (float64-oracle) verdict; the strict
    allclose against float32 rejects correct kernels here (outputs reach 1e16: docs/VERDICTS.md)."""
    cuda_config.verdict = "calibrated"
    r = evaluate(MAMBA2 / f"problem_{kind}.py", MAMBA2 / f"candidate_{kind}.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.candidate_ms is not None and r.candidate_ms > 0


def test_engine_strict_passes_for_the_final_state(cuda_config, tmp_path):
    """Through the engine's strict allclose on a short sequence, where it is meaningful for the state.

    Not asserted for Y: there the strict check fails a handful of elements (2 of 65536 at
    b4 l32 h8 p64 n16, seen on an H100 2026-11-22) where large terms cancel to a small value and the
    float32 reference's own rounding exceeds atol + rtol * |ref|; the kernel's error against float64
    is still ~2e-7 normwise (the tests above)."""
    prob = problem_at_shape("state", tmp_path, batch_size=4, seq_length=32, n_heads=8, d_head=64, d_state=16, block_len=32)
    r = evaluate(prob, MAMBA2 / "candidate_state.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None
