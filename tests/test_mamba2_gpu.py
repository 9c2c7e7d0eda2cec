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

from helpers.mamba2_shapes import MAMBA2, problem_at_shape
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

pytestmark = pytest.mark.gpu
TOL = 1e-5  # normwise, against float64


def tol(path):
    """fp32 bound by path. Path 6 (C B^T in 3xBF16 too, opt-in for fp32) measured 3.0e-5 on spiky A
    (H100, 2026-11-23), where a few intra-chunk products carry the output: over 1e-5, which is why the
    auto path never picks it for fp32; its bound here is its envelope, still 10x under plain TF32."""
    return 1e-4 if path == 6 else TOL


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
        Y64, S64 = prob.ssd_chunked(X.double(), ref64.A, ref64.B, ref64.C, block, None if S0 is None else S0.double())
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
# 2: 3xTF32 tensor-core kernel forced (only d_state 64/128); 5: path 2 with the state products in
# 3xBF16; 6: C B^T too.
@pytest.mark.parametrize("path", [0, 1, 2, 5, 6])
@pytest.mark.parametrize(
    "b, l, h, p, n, block, a_sign, p_tile, init",
    [
        (2, 512, 4, 64, 128, 64, -1, 32, False),
        (2, 512, 4, 64, 128, 256, -1, 64, False),
        (2, 256, 3, 128, 64, 64, +1, 0, False),
        (1, 80, 2, 96, 32, 16, +1, 32, False),  # length not a multiple of the kernel's 32-step chunk
        (3, 48, 2, 32, 16, 16, -1, 0, True),  # initial state given
        (2, 192, 2, 64, 128, 64, +1, 64, True),
        (1, 80, 2, 96, 64, 16, +1, 32, True),  # tensor cores: ragged length, initial state, d_head 96
        (3, 48, 2, 64, 128, 16, -1, 32, True),
    ],
)
def test_shapes_and_signs_match_float64(mods, b, l, h, p, n, block, a_sign, p_tile, init, path):
    import torch

    if path in (2, 5, 6) and n not in (64, 128):
        pytest.skip("the tensor-core kernel takes d_state 64 or 128")
    ey, es = _run_case(torch, mods, b, l, h, p, n, block, a_sign, seed=7, p_tile=p_tile, with_initial=init, path=path)
    assert ey <= tol(path) and es <= tol(path), (ey, es)


def _run_cfg(
    torch, mods, b, l, h, p, n, block, a_sign, seed, nseg, path=0, p_tile=0, with_initial=False, dtype=None, a_kind=None
):
    """Y and final state through ssd_fused_cfg (segments forced), in float32 or bfloat16, with their
    errors against float64 of the inputs the kernel received; for bf16 also the error of the float64
    result itself rounded to bf16 (the best a bf16 output can do)."""
    import torch.nn.functional as F

    prob = mods["problem_y"]
    dtype = dtype or torch.float32
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(b, l, h, p, device="cuda", generator=g).to(dtype)
    A = torch.randn(b, l, h, device="cuda", generator=g)
    if a_sign < 0:
        A = -F.softplus(A)
    if a_kind == "fast":  # decay so fast that whole chunks of a segment fall below float32's range
        A = -3.0 - 4.0 * A.abs()
    elif a_kind == "spiky":  # mostly decaying, with large positive steps now and then
        A = torch.where(torch.rand_like(A) < 0.05, 5.0 * A.abs(), -2.0 - A.abs())
    B = torch.randn(b, l, h, n, device="cuda", generator=g).to(dtype)
    C = torch.randn(b, l, h, n, device="cuda", generator=g).to(dtype)
    S0 = torch.randn(b, 1, h, p, n, device="cuda", generator=g) if with_initial else None
    with torch.no_grad():
        Y64, S64 = prob.ssd_chunked(
            X.double(), A.double(), B.double(), C.double(), block, None if S0 is None else S0.double()
        )
    ext = mods["y"].ssd_ext
    _poison_allocator(torch, X.numel() * 4)
    Y = ext.ssd_fused_cfg(X, A, B, C, S0, False, p_tile, path, nseg)
    _poison_allocator(torch, X.numel() * 4)
    S = ext.ssd_fused_cfg(X, A, B, C, S0, True, p_tile, path, nseg)
    torch.cuda.synchronize()
    assert Y.dtype == dtype and S.dtype == dtype
    assert Y.shape == Y64.shape and S.shape == S64.shape
    assert torch.isfinite(Y).all() and torch.isfinite(S).all()

    def err(out, ref):
        return ((out.double() - ref).norm() / ref.norm()).item()

    best = (err(Y64.to(dtype), Y64), err(S64.to(dtype), S64))
    return (err(Y, Y64), err(S, S64)), best


# Segments along the sequence (tensor-core path): forced counts, including ones that leave a short
# last segment, ragged lengths, an initial state, and both signs of A; fp32.
@pytest.mark.parametrize("nseg", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "b, l, h, p, n, block, a_sign, path, p_tile, init",
    [
        (2, 512, 4, 64, 128, 64, -1, 2, 64, False),
        (1, 80, 2, 96, 64, 16, +1, 2, 32, True),  # ragged: the last segment is shorter than the rest
        (3, 256, 2, 64, 128, 64, +1, 2, 64, True),
        (2, 384, 3, 128, 64, 128, -1, 2, 0, False),  # two head-dim tiles
        # the state products in 3xBF16 (path 5) on path 2's shapes
        (2, 512, 4, 64, 128, 64, -1, 5, 64, False),
        (1, 80, 2, 96, 64, 16, +1, 5, 32, True),
        (2, 384, 3, 128, 64, 128, -1, 5, 0, False),
        (2, 512, 4, 64, 128, 64, -1, 6, 64, False),
        (1, 80, 2, 96, 64, 16, +1, 6, 32, True),
    ],
)
def test_segments_match_float64(mods, nseg, b, l, h, p, n, block, a_sign, path, p_tile, init):
    import torch

    (ey, es), _ = _run_cfg(
        torch,
        mods,
        b,
        l,
        h,
        p,
        n,
        block,
        a_sign,
        seed=11 + nseg,
        nseg=nseg,
        path=path,
        p_tile=p_tile,
        with_initial=init,
    )
    assert ey <= tol(path) and es <= tol(path), (ey, es)


@pytest.mark.parametrize("path", [0, 5, 6])
@pytest.mark.parametrize("a_kind", ["fast", "spiky"])
@pytest.mark.parametrize("nseg", [2, 5])
def test_segments_skip_only_steps_that_vanish_in_float32(mods, a_kind, nseg, path):
    """The local pass starts after the steps whose weight to the segment end underflows float32;
    with fast or spiky decay that skips whole chunks, and the result must not change."""
    import torch

    (ey, es), _ = _run_cfg(
        torch, mods, 2, 640, 2, 64, 128, 64, -1, seed=21, nseg=nseg, a_kind=a_kind, with_initial=True, path=path
    )
    assert ey <= tol(path) and es <= tol(path), (ey, es)


@pytest.mark.parametrize("path", [0, 5, 6])
def test_segments_long_sequence_few_heads(mods, path):
    """The shape class the segments exist for: one (batch, head) pair, a long sequence, auto count."""
    import torch

    (ey, es), _ = _run_cfg(torch, mods, 1, 4096, 1, 64, 128, 256, -1, seed=5, nseg=0, path=path)
    assert ey <= tol(path) and es <= tol(path), (ey, es)


# bfloat16 inputs and outputs: fp32 arithmetic inside, so the error is the output's own rounding:
# at most 5% over the float64 result rounded to bf16 (plus a hair), on every path.
@pytest.mark.parametrize("path, nseg", [(0, 0), (2, 1), (2, 3), (1, 0), (5, 1), (5, 3), (6, 2)])
@pytest.mark.parametrize(
    "b, l, h, p, n, block, a_sign, init",
    [
        (2, 512, 4, 64, 128, 64, -1, False),
        (1, 80, 2, 96, 64, 16, +1, True),
        (2, 256, 2, 64, 16, 64, -1, True),  # d_state 16: the CUDA-core kernel (widened to fp32)
    ],
)
def test_bf16_matches_float64_to_output_rounding(mods, path, nseg, b, l, h, p, n, block, a_sign, init):
    import torch

    if n not in (64, 128) and path in (2, 5, 6):
        pytest.skip("the tensor-core kernel takes d_state 64 or 128")
    (ey, es), (by, bs) = _run_cfg(
        torch, mods, b, l, h, p, n, block, a_sign, seed=3, nseg=nseg, path=path, with_initial=init, dtype=torch.bfloat16
    )
    assert ey <= 1.05 * by + 1e-5 and es <= 1.05 * bs + 1e-5, (ey, by, es, bs)


def test_bad_arguments_raise_and_the_process_survives():
    """Every argument check raises a Python RuntimeError; none takes the process down (a TORCH_CHECK
    with a multi-part message crashed the process on the H100 machine: docs/PERFORMANCE.md). Run in a
    child so a crash shows as a code."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import importlib.util, sys, torch
        spec = importlib.util.spec_from_file_location("m2y", {str(MAMBA2 / "candidate_y.py")!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        ext = mod.ssd_ext
        d = "cuda"
        X = torch.randn(2, 64, 2, 64, device=d); A = torch.randn(2, 64, 2, device=d)
        B = torch.randn(2, 64, 2, 128, device=d); C = torch.randn(2, 64, 2, 128, device=d)
        cases = [
            lambda: ext.ssd_fused(X.cpu(), A, B, C, None, False, 0),                       # CPU tensor
            lambda: ext.ssd_fused(X.double(), A, B, C, None, False, 0),                    # float64
            lambda: ext.ssd_fused(X.half(), A, B.half(), C.half(), None, False, 0),        # float16
            lambda: ext.ssd_fused(X.bfloat16(), A, B, C, None, False, 0),                  # mixed dtypes
            lambda: ext.ssd_fused(X[..., :48], A, B, C, None, False, 0),                   # d_head 48
            lambda: ext.ssd_fused(X, A[:, :32], B, C, None, False, 0),                     # A length
            lambda: ext.ssd_fused(X, A, B[..., :96], C[..., :96], None, False, 0),         # d_state 96
            lambda: ext.ssd_fused_path(X, A, B[..., :32], C[..., :32], None, False, 0, 2), # TC with n=32
            lambda: ext.ssd_fused_path(X, A, B, C, None, False, 48, 0),                    # p_tile 48
            lambda: ext.ssd_fused_path(X, A, B, C, None, False, 0, 7),                     # path 7
            lambda: ext.ssd_fused_path(X, A, B, C, None, False, 0, 4),                     # path 4 (removed)
            lambda: ext.ssd_fused_cfg(X, A, B, C, None, False, 0, 0, -1),                  # nseg -1
            lambda: ext.ssd_fused(X, A, B, C, torch.randn(3, device=d), False, 0),         # bad initial state
            lambda: ext.ssd_fused(X, A, B, C.view(2, 64, 2, 2, 64), None, False, 0),       # C rank 5
            lambda: ext.ssd_fused(X.view(2, 64, 2, 8, 8)[..., 0], A, B, C, None, False, 0),  # d_head 8 (strided)
            lambda: ext.ssd_fused(torch.randn(X.numel() + 8, device=d).bfloat16()[1:X.numel() + 1].view(X.shape),
                                  A, B.bfloat16(), C.bfloat16(), None, False, 0),        # not 16-byte aligned
        ]
        raised = 0
        for i, f in enumerate(cases):
            print("case", i, flush=True)
            try:
                f()
                torch.cuda.synchronize()
                print("no error", i)
            except RuntimeError as e:
                raised += 1
        Y = ext.ssd_fused(X, A, B, C, None, False, 0)  # the extension still works afterwards
        torch.cuda.synchronize()
        assert torch.isfinite(Y).all()
        print("raised", raised, "of", len(cases))
    """)
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-u", "-c", code], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert "raised 16 of 16" in r.stdout, r.stdout


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


BF16_SHAPES = {
    "kernelbench": {},  # d_state 16: the CUDA-core kernel, inputs widened to float32
    "tensor_cores_n64": dict(batch_size=2, seq_length=512, n_heads=4, d_head=64, d_state=64),  # path 6
}


@pytest.mark.parametrize("shape", list(BF16_SHAPES), ids=list(BF16_SHAPES))
def test_engine_calibrated_verdict_passes_bf16(cuda_config, tmp_path, shape):
    """The bf16 path (bf16 X, B, C and Y; float32 A) through the engine: problem_y_bf16.py, whose reference
    computes in float32 and rounds Y once, judged by the calibrated verdict against the float64 oracle
    with the tolerance at one bf16 ulp (docs/VERDICTS.md, "Low-precision outputs")."""
    cuda_config.verdict = "calibrated"
    prob = (
        problem_at_shape("y_bf16", tmp_path, **BF16_SHAPES[shape])
        if BF16_SHAPES[shape]
        else MAMBA2 / "problem_y_bf16.py"
    )
    r = evaluate(prob, MAMBA2 / "candidate_y.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    leaves = [leaf for t in r.trials for leaf in t.extra.get("numerics", {}).get("leaves", [])]
    assert leaves and all(leaf["rtol"] == 2.0**-7 for leaf in leaves)
    assert r.candidate_ms is not None and r.candidate_ms > 0


def test_engine_strict_passes_for_the_final_state(cuda_config, tmp_path):
    """Through the engine's strict allclose on a short sequence, where it is meaningful for the state.

    Not asserted for Y: there the strict check fails a handful of elements (2 of 65536 at
    b4 l32 h8 p64 n16, seen on an H100 2026-11-22) where large terms cancel to a small value and the
    float32 reference's own rounding exceeds atol + rtol * |ref|; the kernel's error against float64
    is still ~2e-7 normwise (the tests above)."""
    prob = problem_at_shape(
        "state", tmp_path, batch_size=4, seq_length=32, n_heads=8, d_head=64, d_state=16, block_len=32
    )
    r = evaluate(prob, MAMBA2 / "candidate_state.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None
