"""`--sanitize` (issue 33): one forward of a passed CUDA candidate under compute-sanitizer memcheck,
the caching allocator off; an out-of-bounds or misaligned access is `memory_error`.

memcheck's output is parsed here from the text it prints (both layouts: compute-sanitizer's and
the older cuda-memcheck's); the run itself is `gpu`."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from kernelwright.core.config import EvalConfig, GuardConfig
from kernelwright.core.record import EvalResult, Status
from kernelwright.engine import evaluate, sanitizer

PROBLEM = FIXTURES / "shapes" / "problem.py"

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at swish_scale_neighbour_kernel(const float *, const float *, float *, long, int)+0x1b0
=========     by thread (255,0,0) in block (63,0,0)
=========     Address 0x7f2a4c010000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f2a4c000000 of size 65536 bytes
=========
========= Invalid __global__ write of size 16 bytes
=========     at 0x2f0 in tile_kernel(float *)
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f2a4c000004 is misaligned
=========
========= ERROR SUMMARY: 2 errors
"""

OLD_MEMCHECK = """\
========= CUDA-MEMCHECK
========= Invalid __global__ read of size 8
=========     at 0x000000c8 in /src/helper.cuh:75:void vector_projection<double>(double*, int)
=========     by thread (9,0,0) in block (0,0,0)
=========     Address 0x000370e8 is out of bounds
========= ERROR SUMMARY: 1 error
"""


def test_memcheck_errors_are_read_with_kernel_thread_and_address():
    errors, count = sanitizer.parse(MEMCHECK)
    assert count == 2 and len(errors) == 2
    oob, mis = errors
    assert oob.access == "Invalid __global__ read of size 4 bytes"
    assert oob.kernel == "swish_scale_neighbour_kernel(const float *, const float *, float *, long, int)"
    assert (oob.address, oob.problem, oob.thread, oob.block) == ("0x7f2a4c010000", "out of bounds", "255,0,0", "63,0,0")
    assert oob.detail.startswith("and is 1 bytes after the nearest allocation")
    assert (mis.kernel, mis.problem) == ("tile_kernel(float *)", "misaligned")
    (old,), n = sanitizer.parse(OLD_MEMCHECK)
    assert n == 1 and old.kernel == "void vector_projection<double>(double*, int)" and old.address == "0x000370e8"
    assert sanitizer.parse("========= ERROR SUMMARY: 0 errors\n") == ([], 0)


def test_a_memory_error_fails_the_verdict_while_it_is_in_fail_on():
    errors, count = sanitizer.parse(MEMCHECK)
    rec = EvalResult(status=Status.PASSED, correct=True, speedup=2.0, candidate_ms=0.1)
    sanitizer.flag(rec, EvalConfig(), errors, count)
    assert rec.status is Status.INCORRECT and rec.speedup is None and not rec.correct
    assert "2 error(s)" in rec.error_log and "swish_scale_neighbour_kernel" in rec.error_log
    assert "0x7f2a4c010000 (out of bounds)" in rec.metadata["guards"]["flags"]["memory_error"]
    reported = EvalResult(status=Status.PASSED, correct=True)
    sanitizer.flag(reported, EvalConfig(guards=GuardConfig(fail_on=())), errors, count)
    assert reported.status is Status.PASSED and "memory_error" in reported.metadata["guards"]["flags"]


def test_without_a_gpu_or_the_tool_the_record_says_why_nothing_ran(monkeypatch, tmp_path):
    cfg = EvalConfig(sanitize=True)
    cpu = EvalResult(status=Status.PASSED, device_type="cpu")
    sanitizer.attach(cpu, cfg, tmp_path, {}, {})
    assert cpu.metadata["sanitize"]["ran"] is False and "ran on the CPU" in cpu.metadata["sanitize"]["note"]
    monkeypatch.setattr(sanitizer, "find_tool", lambda hint="": None)
    cuda = EvalResult(status=Status.PASSED, device_type="cuda")
    sanitizer.attach(cuda, cfg, tmp_path, {}, {})
    assert "compute-sanitizer not found" in cuda.metadata["sanitize"]["note"] and cuda.status is Status.PASSED
    off = EvalResult(status=Status.PASSED, device_type="cuda")
    sanitizer.attach(off, EvalConfig(), tmp_path, {}, {})
    assert "sanitize" not in off.metadata


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fixture,bad", [(FIXTURES / "sanitize" / "cuda_oob_read.py", True), (FIXTURES / "shapes" / "cuda_honest.py", False)]
)
def test_an_out_of_bounds_read_that_passes_is_a_memory_error_under_sanitize(cuda_config, fixture, bad):
    cuda_config.time_candidate = False
    cuda_config.shapes = "off"
    plain = evaluate(PROBLEM, fixture, cuda_config)
    assert plain.status is Status.PASSED, plain.error_log  # today: it passes
    cuda_config.sanitize = True
    r = evaluate(PROBLEM, fixture, cuda_config)
    if sanitizer.find_tool() is None:
        assert "compute-sanitizer not found" in r.metadata["sanitize"]["note"]
        pytest.skip("compute-sanitizer is not installed on this machine")
    san = r.metadata["sanitize"]
    assert san["ran"] is True and "note" not in san, san
    if bad:
        assert r.status is Status.INCORRECT and "memory_error" in r.metadata["guards"]["flags"]
        assert "swish_scale_neighbour_kernel" in r.error_log, san["errors"]
        # memcheck names an out-of-bounds access either way (the wording moves between its versions)
        assert "out of bounds" in r.error_log or "after the nearest allocation" in r.error_log, san["errors"]
    else:
        assert r.status is Status.PASSED and san["errors"] == [] and san["error_summary"] == 0
