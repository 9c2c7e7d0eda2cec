"""The engine on a real GPU (run on the device: `python3 -m pytest -m gpu`)."""

from __future__ import annotations

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

pytestmark = pytest.mark.gpu

CUDA_EXAMPLE = EXAMPLES / "cuda_swish"


def test_bundled_cuda_candidate_passes_and_is_timed_by_the_judge(cuda_config):
    """Its speed-up (one pass instead of four over 128 MiB; under 1x beside other tests' kernels on
    the device) is benchmarks/clock_checks.py's."""
    cuda_config.timing.compare_compile = True
    r = evaluate(CUDA_EXAMPLE / "problem.py", CUDA_EXAMPLE / "candidate.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.device_type == "cuda" and r.device
    assert r.candidate_timing.clock == "judge_window" and r.metadata["timing"]["calls_per_window"] > 1
    assert r.speedup is not None
    assert r.compile_reference_ms is not None or "compile_reference_error" in r.metadata
    lean = r.metadata["builds"][0]["lean_headers"]
    assert lean["used"] is True and lean["op_headers"] == ["empty_like"]  # built with lean torch headers
    assert r.metadata["inputs_drawn_on"] == "cuda"


def test_a_cuda_source_that_needs_the_full_headers_is_built_as_written(cuda_config, tmp_path):
    cuda_config.cache_dir = str(tmp_path / "cache")  # its own cache: the first build must try lean
    r = evaluate(ADD_ONE, CANDIDATES / "cuda_needs_full_headers.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    b = r.metadata["builds"][0]
    assert b["lean_headers"]["used"] is False and "lean build failed" in b["lean_headers"]["reason"], b
    again = evaluate(ADD_ONE, CANDIDATES / "cuda_needs_full_headers.py", cuda_config)
    b = again.metadata["builds"][0]
    assert again.status is Status.PASSED and b["cached"] is True
    assert "earlier lean build" in b["lean_headers"]["reason"]  # not tried twice


def bad_access(mode: int) -> str:
    text = (CANDIDATES / "cuda_bad_access.py").read_text()
    assert "MODE = 0" in text
    return text.replace("MODE = 0", f"MODE = {mode}")


@pytest.mark.parametrize("mode", [0, 1], ids=["oob_write", "wild_pointer"])
def test_illegal_memory_access_is_a_verdict_and_the_next_evaluation_works(cuda_config, mode):
    r = evaluate(ADD_ONE, None, cuda_config, candidate_text=bad_access(mode))
    assert r.status in (Status.RUNTIME_ERROR, Status.CRASHED), r.error_log
    assert "illegal" in r.error_log.lower() or "memory" in r.error_log.lower() or r.status is Status.CRASHED
    after = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cuda_config)
    assert after.status is Status.PASSED, after.error_log


def test_same_extension_name_different_cuda_code_gets_its_own_build(cuda_config):
    one = evaluate(ADD_ONE, CANDIDATES / "cuda_same_name_1.py", cuda_config)
    two = evaluate(ADD_ONE, CANDIDATES / "cuda_same_name_2.py", cuda_config)
    again = evaluate(ADD_ONE, CANDIDATES / "cuda_same_name_1.py", cuda_config)
    assert one.status is Status.PASSED, one.error_log
    assert two.status is Status.INCORRECT, two.error_log
    assert again.status is Status.PASSED and again.metadata["builds"][0]["cached"] is True
    assert one.metadata["builds"][0]["dir"] != two.metadata["builds"][0]["dir"]


def test_kernel_that_never_returns_is_stopped_within_seconds_and_the_gpu_is_usable_after(cuda_config):
    # the flat stage limit stays far away: the reference's microseconds set the limit (its floor)
    cuda_config.timeouts.correctness = 180
    r = evaluate(ADD_ONE, None, cuda_config, candidate_text=bad_access(2))
    assert r.status is Status.TIMEOUT, r.error_log
    # the floor, or a little over it where other tests' kernels slice the GPU and slow the reference's
    # calls (an add can take tens of ms beside a suite on the same GPU), never the flat 180 s
    floor = cuda_config.timeouts.call_floor
    assert floor <= r.metadata["correctness_limit_s"] < 2 * floor
    assert r.stage_times.correctness_s < 15
    assert evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cuda_config).status is Status.PASSED


def test_three_draws_of_the_bundled_cuda_candidate_on_the_gpu_give_the_median_draw(cuda_config):
    """--draws 3 on a GPU (engine/draws.py, evaluation._more_draws): three whole evaluations, each in
    its own children, the later two started together after the first; the record is the median draw's
    and the first draw's profile stays in it."""
    import dataclasses

    from kernelwright.core.config import ProfileConfig

    timing = dataclasses.replace(cuda_config.timing, draws=3)
    cfg = dataclasses.replace(cuda_config, timing=timing, profile=ProfileConfig(enabled=True))
    stages: list[str] = []
    r = evaluate(CUDA_EXAMPLE / "problem.py", CUDA_EXAMPLE / "candidate.py", cfg, on_stage=stages.append)
    assert r.status is Status.PASSED, r.error_log
    d = r.metadata["draws"]
    assert d["asked"] == 3 and d["ran"] == 3, d
    each = [e["speedup"] for e in d["each"]]
    assert all(e["status"] == "passed" for e in d["each"]) and all(s and s > 0 for s in each), d
    assert r.speedup == sorted(each)[1] == each[d["chosen"] - 1]
    assert "draw 2 of 3" in stages and "draw 3 of 3" in stages and stages.count("correctness") == 3
    assert r.metadata["profile"]["source"] in ("ncu", "torch.profiler", "none"), r.metadata["profile"]
    assert r.stage_times.profile_s is not None  # the first draw's, whichever draw is the record
    assert r.candidate_timing.clock == "judge_window"
