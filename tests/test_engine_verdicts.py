"""Every way a candidate can fail ends as its own recorded verdict, and the caller carries on."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES
from kernelwright.core.record import EvalResult, Stage, Status
from kernelwright.engine import EngineError, evaluate


def ev(cfg, candidate, problem=ADD_ONE):
    return evaluate(problem, CANDIDATES / candidate if isinstance(candidate, str) else candidate, cfg)


def test_correct_python_candidate_passes_with_timing(cpu_config):
    r = ev(cpu_config, "py_correct.py")
    assert r.status is Status.PASSED, r.error_log
    assert r.correct and r.compiled
    assert len(r.trials) == cpu_config.trials and all(t.passed for t in r.trials)
    assert len({t.seed for t in r.trials}) == cpu_config.trials  # a fresh seed per trial
    assert r.candidate_ms > 0 and r.reference_ms > 0
    assert r.speedup == pytest.approx(r.reference_ms / r.candidate_ms)
    # the CPU's figures are the judge's wall clock: the speed-up as launched is the speed-up itself
    assert r.speedup_basis == "host" and r.speedup_as_launched == r.speedup
    assert r.candidate_timing.clock == "judge_window" and r.candidate_timing.iterations >= 2
    assert r.metadata["timing"]["clock"] == "judge" and r.metadata["timing"]["calls_per_window"] >= 1
    assert r.device.startswith("cpu") and r.device_type == "cpu"
    assert r.stage_times.build_s is not None and r.stage_times.correctness_s is not None
    # the timing stage is the judge's windows (the runner no longer announces it): their wall is in it
    windows_s = sum(w["wall_ms"] for w in r.metadata["timing"]["windows"]) / 1e3
    assert r.stage_times.timing_s is not None and r.stage_times.timing_s >= windows_s


def test_wrong_values_are_incorrect_with_seed_pipeline_message(cpu_config):
    r = ev(cpu_config, "py_wrong.py")
    assert r.status is Status.INCORRECT and not r.correct
    assert r.error_log.startswith(
        "Outputs are not close (atol=0.001, rtol=0.001). max_abs_err=5.000e-01, mean_abs_err=2.500e-01"
    )
    trial = r.trials[0]
    assert trial.frac_out_of_tol == pytest.approx(0.5)
    assert trial.worst_index is not None and trial.worst_index[1] >= 64
    assert r.candidate_ms is None  # timing runs only for a correct candidate


def test_wrong_shape_is_incorrect(cpu_config):
    r = ev(cpu_config, "py_wrong_shape.py")
    assert r.status is Status.INCORRECT
    assert "shape mismatch" in r.error_log and "[64, 128]" in r.error_log


def test_exception_in_forward_is_runtime_error(cpu_config):
    r = ev(cpu_config, "py_raises.py")
    assert r.status is Status.RUNTIME_ERROR and r.error_stage is Stage.CORRECTNESS
    assert "grid dimension 0" in r.error_log


def test_import_error_is_runtime_error_at_build(cpu_config):
    r = ev(cpu_config, "py_import_error.py")
    assert r.status is Status.RUNTIME_ERROR and r.error_stage is Stage.BUILD
    assert "a_module_that_does_not_exist" in r.error_log


def test_segfault_is_crashed_and_names_the_stage(cpu_config):
    r = ev(cpu_config, "py_segfault.py")
    assert r.status is Status.CRASHED and r.error_stage is Stage.CORRECTNESS
    assert "SIGSEGV" in r.error_log
    assert "Segmentation fault" in r.error_log  # faulthandler's stack, kept from the child's output


def test_infinite_loop_is_killed_at_the_stage_limit(cpu_config):
    cpu_config.timeouts.correctness = 6  # the judge's own work on this tiny problem takes well under a second
    r = ev(cpu_config, "py_infinite_loop.py")
    assert r.status is Status.TIMEOUT and r.error_stage is Stage.CORRECTNESS
    assert f"{cpu_config.timeouts.correctness:g} s" in r.error_log
    assert r.stage_times.total_s < 60


def test_a_call_that_never_returns_is_stopped_at_the_limit_the_reference_sets(cpu_config):
    # the flat stage limit is far away; the reference (x + 1 on a small tensor) takes microseconds,
    # so the correctness stage's limit is the floor
    cpu_config.timeouts.correctness = 120
    cpu_config.timeouts.call_floor = 5
    r = ev(cpu_config, "py_infinite_loop.py")
    assert r.status is Status.TIMEOUT and r.error_stage is Stage.CORRECTNESS
    assert r.metadata["correctness_limit_s"] == 5
    assert "did not return within 5 s" in r.error_log
    assert r.stage_times.correctness_s < 30


SLOW_INPUTS_PROBLEM = """
import time
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0


def get_inputs():
    time.sleep(0.8)  # inputs that take a while to make (a structured matrix, a graph, a tokenizer's output)
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_a_runner_waiting_for_a_slow_judge_is_not_timed_out(cpu_config, tmp_path):
    """The judge draws every input itself (a window's worth at a time): with a slow get_inputs() the
    runner waits seconds for its next window, longer than its correctness stage's limit between
    reports (2 s) and, all windows together, than its timing stage's budget (6 s here). The runner's
    clocks stand still while the judge works (engine/coordinator.py); an honest candidate passes,
    where it was `timeout` before (as an honest kernel was on an H100, 2026-11-26, while its judge
    compiled the reference for `--compare-compile`)."""
    problem = tmp_path / "problem.py"
    problem.write_text(SLOW_INPUTS_PROBLEM)
    cpu_config.timeouts.call_floor = 2
    cpu_config.timeouts.timing = 6
    cpu_config.timing.windows = 2
    cpu_config.timing.max_window_calls = 4  # 4 draws of 0.8 s before a window
    cpu_config.shapes = "off"
    r = evaluate(problem, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None
    assert r.metadata["engine_phases_s"]["runner_clocks_paused"] > cpu_config.timeouts.call_floor


SLOW_BUT_RETURNING = """
import time
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(1.2)
        return torch.relu(x) + 1.0
"""


@pytest.mark.slow
def test_the_limit_is_per_call_so_a_slow_candidate_that_returns_is_not_stopped(cpu_config):
    cpu_config.timeouts.correctness = 120
    # the guards' report comes after two calls (2.4 s of sleep): 5 s to spare for a loaded machine
    cpu_config.timeouts.call_floor = 7.5
    cpu_config.trials = 8  # eight calls of 1.2 s, then the guards' two: the stage lasts ~12 s
    cpu_config.time_candidate = False
    cpu_config.shapes = "off"
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=SLOW_BUT_RETURNING)
    assert r.status is Status.PASSED, r.error_log
    assert r.stage_times.correctness_s > 9.5  # the stage outlasted the limit; no call did


@pytest.mark.slow
def test_a_candidate_that_compiles_at_its_first_call_gets_the_jit_allowance(cpu_config):
    cpu_config.timeouts.correctness = 120
    cpu_config.timeouts.call_floor = 4
    cpu_config.timeouts.jit_allowance = 3
    text = (CANDIDATES / "py_infinite_loop.py").read_text() + "\n# forward = torch.compile(forward): a JIT\n"
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.TIMEOUT and r.metadata["correctness_limit_s"] == 4
    assert r.metadata["correctness_first_call_extra_s"] == 3
    assert "did not return within 7 s" in r.error_log


def test_the_derived_limit_never_lengthens_the_stage(cpu_config):
    cpu_config.timeouts.correctness = 3
    cpu_config.timeouts.call_floor = 50
    r = ev(cpu_config, "py_infinite_loop.py")
    assert r.status is Status.TIMEOUT and r.metadata["correctness_limit_s"] == 3
    assert " 3 s" in r.error_log and r.stage_times.correctness_s < 20


def test_os_exit_at_import_is_crashed(cpu_config):
    r = ev(cpu_config, "py_exit_at_import.py")
    assert r.status is Status.CRASHED and r.error_stage is Stage.BUILD
    assert "exited with code 0" in r.error_log


def test_os_exit_in_forward_is_crashed_not_passed(cpu_config):
    r = ev(cpu_config, "py_exit_in_forward.py")
    assert r.status is Status.CRASHED and r.error_stage is Stage.CORRECTNESS


def test_missing_modelnew_is_format_error(cpu_config):
    r = ev(cpu_config, "py_no_modelnew.py")
    assert r.status is Status.FORMAT_ERROR and "ModelNew" in r.error_log


def test_syntax_error_is_format_error(cpu_config):
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text="class ModelNew(:\n  pass\n")
    assert r.status is Status.FORMAT_ERROR and "not valid Python" in r.error_log


def test_candidate_cannot_read_parent_secrets(cpu_config, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-do-not-leak")
    monkeypatch.setenv("HF_TOKEN", "sk-test-do-not-leak")
    monkeypatch.setenv("MY_SERVICE_SECRET", "sk-test-do-not-leak")
    r = ev(cpu_config, "py_reads_secrets.py")
    assert r.status is Status.PASSED, r.error_log


def test_evaluation_after_each_failure_still_works_in_the_same_parent(cpu_config):
    for bad in ("py_segfault.py", "py_exit_in_forward.py", "py_raises.py"):
        assert ev(cpu_config, bad).status is not Status.PASSED
    assert ev(cpu_config, "py_correct.py").status is Status.PASSED


def test_result_round_trips_through_json(cpu_config):
    r = ev(cpu_config, "py_wrong.py")
    again = EvalResult.from_json(r.to_json())
    assert again == r
    kb = r.to_kernelbench()
    assert kb["correctness"] is False and kb["compiled"] is True
    json.dumps(kb)


def test_a_record_with_the_retired_done_stage_still_loads():
    """Stage "done" is gone from the enum; a stored record that names it loads with no stage."""
    r = EvalResult.from_dict({"status": "runtime_error", "error_stage": "done"})
    assert r.status is Status.RUNTIME_ERROR and r.error_stage is None
    assert EvalResult.from_dict({"status": "crashed", "error_stage": "build"}).error_stage is Stage.BUILD
    with pytest.raises(ValueError):
        EvalResult.from_dict({"status": "crashed", "error_stage": "nowhere"})


def test_problem_errors_raise_engine_error_not_verdicts(cpu_config, tmp_path):
    with pytest.raises(EngineError, match="not found"):
        evaluate(tmp_path / "missing.py", CANDIDATES / "py_correct.py", cpu_config)
    bad = tmp_path / "bad_problem.py"
    bad.write_text("import torch\n")
    with pytest.raises(EngineError, match="defines no Model"):
        evaluate(bad, CANDIDATES / "py_correct.py", cpu_config)


def test_reference_that_raises_is_blamed_on_the_problem(cpu_config, tmp_path):
    prob = tmp_path / "broken.py"
    prob.write_text(ADD_ONE.read_text().replace("return torch.relu(x) + 1.0", "raise RuntimeError('broken reference')"))
    r = evaluate(prob, CANDIDATES / "py_correct.py", cpu_config)
    assert r.error_stage is Stage.REFERENCE and "broken reference" in r.error_log


# ---- C++ candidates (built once per session, then cached) ----------------------------------
# The example's candidate on its problem at batch 16 (conftest's small_swish): what is asserted here
# does not depend on the size; the example at its own size is evaluated in test_cheats.py.

CPU_EXAMPLE = EXAMPLES / "cpu_swish"


@pytest.mark.slow
def test_bundled_cpp_candidate_passes_and_is_timed(cpu_config, small_swish):
    r = evaluate(small_swish, CPU_EXAMPLE / "candidate.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None and r.speedup > 0
    builds = r.metadata["builds"]
    assert len(builds) == 1 and builds[0]["ok"] and builds[0]["name"] == "kw_example_swish_cpu"


@pytest.mark.slow
def test_unchanged_extension_is_not_rebuilt(cpu_config, small_swish):
    first = evaluate(small_swish, CPU_EXAMPLE / "candidate.py", cpu_config)
    second = evaluate(small_swish, CANDIDATES / "cpp_wrong.py", cpu_config)
    assert first.status is Status.PASSED
    assert second.metadata["builds"][0]["cached"] is True
    assert second.metadata["builds"][0]["key"] == first.metadata["builds"][0]["key"]
    # (no time bound: the first may itself be a load from the session's cache, and under a loaded
    # CI machine a load's time says nothing; `cached` and the one key are what "not rebuilt" means)
    assert second.status is Status.INCORRECT  # same kernel, wrong call: the cache does not mask it


@pytest.mark.slow
def test_compile_error_is_located_in_the_candidate_file(cpu_config):
    r = ev(cpu_config, "cpp_compile_error.py")
    assert r.status is Status.COMPILE_ERROR and not r.compiled
    first = r.compile_issues[0]
    assert "one_constant_never_declared" in first.message
    assert first.file == "main.cpp"
    assert first.candidate_line == 15
    assert "candidate line 15" in r.error_log


@pytest.mark.slow
def test_same_extension_name_different_code_gets_its_own_build(cpu_config):
    one = ev(cpu_config, "cpp_same_name_1.py")
    two = ev(cpu_config, "cpp_same_name_2.py")
    again = ev(cpu_config, "cpp_same_name_1.py")
    assert one.status is Status.PASSED, one.error_log
    assert two.status is Status.INCORRECT  # adds 2, not 1: its own module ran, not the sibling's
    assert again.status is Status.PASSED
    d1, d2 = one.metadata["builds"][0]["dir"], two.metadata["builds"][0]["dir"]
    assert d1 != d2 and os.path.basename(d1).startswith("kw_same_name-")
    assert again.metadata["builds"][0]["cached"] is True


# ---- sampled timed outputs: bit-identical ones need no second full comparison -------------------

_NOISY = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    # right to within float32 rounding, but never the same bits twice (as an atomics-based
    # reduction is): every sampled timed output must be compared in full
    def forward(self, x):
        noise = torch.rand_like(x) * 1e-7 * (1.0 + x.abs())
        return x.clamp_min(0.0) + 1.0 + noise
"""


def test_a_correct_but_never_identical_candidate_has_every_sample_compared_and_passes(cpu_config, tmp_path):
    cand = tmp_path / "noisy.py"
    cand.write_text(_NOISY)
    r = evaluate(ADD_ONE, cand, cpu_config)
    assert r.status is Status.PASSED, r.error_log
    facts = r.metadata["guards"]["facts"]
    assert facts["timed_calls_checked"] >= 1
