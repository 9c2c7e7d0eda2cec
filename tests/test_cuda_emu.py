"""The Mamba-2 SSD tensor-core kernels, run on the CPU under emulation (tools/cuda_emu), against
float64: the tensor-core paths (2: every product in 3xTF32; 5 and 6: some in 3xBF16) pass,
deliberately broken copies fail, and the emulated tensor-core numerics are
TF32 (without the 3xTF32 lo terms the error is ~1e-3).

The kernel source is compiled with g++ into a library cached by content hash (a few seconds cold).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
import shutil
import sys

import pytest

from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        platform.machine() != "x86_64" or shutil.which("g++") is None,
        reason="the emulator's fibers are x86-64; needs g++",
    ),
]


def _load():
    spec = importlib.util.spec_from_file_location("kw_cuda_emu_run_ssd", ROOT / "tools" / "cuda_emu" / "run_ssd.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


emu = _load()
Case = emu.Case

# ragged lengths (not a multiple of the 32-step chunk), 1 to 3 segments, initial states, both signs
# of A, two head-dim tiles, N 64 and 128, P 32 and 64, fp32 and bf16; "fast": the local pass skips
# whole chunks
CASES = [
    Case(l=80, nseg=1, init=True),
    Case(l=100, nseg=3, init=True, a_kind="pos", seed=1),
    Case(l=100, d=64, n=64, p=32, nseg=2, seed=3),
    Case(l=80, d=128, nseg=2, dtype="bf16", init=True, seed=2),
    Case(l=100, d=32, n=64, p=32, nseg=3, dtype="bf16", a_kind="pos", seed=4),
    Case(l=100, d=128, n=64, nseg=3, dtype="bf16", init=True, seed=7),
    Case(l=640, h=1, nseg=2, init=True, a_kind="fast", seed=5),
]
STATE_CASE = Case(l=100, nseg=3, init=True, seed=6)
BASE = Case(l=100, nseg=3, init=True, seed=1)  # the broken copies' case
PATHS = (2, 5, 6)  # 2: ssd_tc_kernel (8 warps a block for P = 64); 5: the state products in 3xBF16
# (error ~5e-6 where the state dominates, see below); 6: C B^T in 3xBF16 too


@pytest.fixture(scope="module")
def lib():
    """Every instantiation the tests below use, in one build per path."""
    combos = [c.combo(True) for c in CASES] + [STATE_CASE.combo(False)]
    return {path: emu.build([dataclasses.replace(c, path=path) for c in combos]) for path in PATHS}


def _cases(path):
    cases = [dataclasses.replace(c, path=path) for c in CASES]
    return [pytest.param(c, id=c.label().replace(" ", "-")) for c in cases]


@pytest.mark.parametrize("case", [c for p in PATHS for c in _cases(p)])
def test_kernel_matches_float64(lib, case):
    res = emu.run_case(lib[case.path], case)
    assert emu.ok(case, res), res
    if case.dtype == "fp32":
        assert res["y"] < FP32_BOUND[case.path], res


# fp32 error bounds by path: 3xTF32 keeps ~2e-7 here; path 5's state products in 3xBF16 keep 16 of
# 24 bits (~5e-6 where the state dominates the output: growing A, or the final state itself), still
# 200x under plain TF32's ~1e-3
FP32_BOUND = {2: 1e-6, 5: 1e-5, 6: 1e-5}


@pytest.mark.parametrize("path", PATHS)
def test_final_state_mode_matches_float64(lib, path):
    case = dataclasses.replace(STATE_CASE, path=path)
    res = emu.run_case(lib[path], case, want="state")
    assert res["state"] < FP32_BOUND[path], res


def test_result_does_not_depend_on_block_order(lib):
    """Blocks take tickets in the order they start: run in reverse, segments still chain correctly."""
    fwd = emu.run_case(lib[2], BASE)
    rev = emu.run_case(lib[2], BASE, block_order=1)
    assert rev == fwd


@pytest.mark.parametrize("mode", ["no_lo", "no_split"])
def test_plain_tf32_is_visibly_less_accurate(lib, mode):
    """Without the lo terms (no_lo: TF32-rounded operands; no_split: raw float32 operands the
    emulated tensor core truncates to TF32) the error is TF32's, ~1e-3: the rounding is emulated."""
    res = emu.run_case(lib[2], BASE, tf32_mode=mode)
    assert 1e-4 < res["y"] < 1e-2, res


@pytest.mark.parametrize("name", [n for n in emu.BROKEN if "deadlock" not in n])
def test_broken_copy_is_rejected(name):
    path, mutations = emu.BROKEN[name]
    case = dataclasses.replace(BASE, path=path)
    res = emu.run_case(emu.build([case.combo(True)], mutations=mutations), case)
    assert not emu.ok(case, res), res


def test_waiting_on_a_flag_nobody_sets_is_reported_as_deadlock():
    path, mutations = emu.BROKEN["waits on the wrong flag (deadlock)"]
    broken = emu.build([BASE.combo(True)], mutations=mutations)
    with pytest.raises(RuntimeError, match="deadlock"):
        emu.run_case(broken, BASE)
