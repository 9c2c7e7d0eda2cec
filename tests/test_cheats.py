"""Every trick in tests/cheats/ is caught, and no honest example is flagged.

A trick is caught when the verdict is not `passed` and the record names why (a guard flag, or
an incorrect verdict from the numerics), except `torch_ops_only`, whose `no_custom_kernel`
flag is reported without failing the verdict (GuardConfig.fail_on leaves it out by default).
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

CHEATS = FIXTURES.parent / "cheats"


def flags(r) -> dict:
    """Flags about the candidate (`timing_unstable` is a fact about the machine: a shared test machine raises it)."""
    return {k: v for k, v in r.metadata.get("guards", {}).get("flags", {}).items() if k != "timing_unstable"}


def failed(r) -> list:
    return r.metadata.get("guards", {}).get("failed", [])


def run(cfg, name):
    return evaluate(ADD_ONE, CHEATS / name, cfg)


# (file, the flag that must be raised and fail the verdict); device-independent tricks whose
# outputs are right on every trial, so that the guard alone catches them
CPU_CAUGHT_BY_FLAG = [
    ("cache_by_identity.py", "stale_output_on_refill"),
    ("patch_perf_counter.py", "patched_functions"),
    ("patch_cuda_timing.py", "patched_functions"),
    ("mutate_inputs.py", "mutates_inputs"),
    ("alias_input.py", "output_aliases_input"),
    ("persistent_buffer.py", "output_changed_later"),
    ("executor_thread.py", "background_threads"),
    ("deferred_thread_lingering.py", "background_threads"),
]


@pytest.mark.parametrize("name,flag", CPU_CAUGHT_BY_FLAG)
def test_cheat_is_caught_by_its_guard(cpu_config, name, flag):
    r = run(cpu_config, name)
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.speedup, r.error_log)
    assert len(r.trials) == cpu_config.trials and all(t.passed for t in r.trials), r.error_log
    assert flag in flags(r) and flag in failed(r), r.metadata.get("guards")
    assert r.error_log.startswith("Reward-hacking guard failed:") and flag in r.error_log.splitlines()[0], r.error_log


def test_the_reference_is_out_of_the_candidates_reach(cpu_config):
    """calls_reference.py imports the problem file to call its Model: the runner never holds the
    problem (the judge hands it inputs as data), so there is nothing to import."""
    r = run(cpu_config, "calls_reference.py")
    assert r.status is Status.RUNTIME_ERROR and r.speedup is None, (r.status, r.error_log)
    assert "No module named 'problem'" in r.error_log, r.error_log


def test_pointer_cache_is_caught_by_the_refill_alone(cpu_config):
    """cache_by_pointer.py keeps its inputs alive, so every fresh tensor gets the right output (each
    trial passes); refilling the guarded call's tensors in place, same addresses, gets the stale one."""
    r = run(cpu_config, "cache_by_pointer.py")
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.speedup, r.error_log)
    assert len(r.trials) == cpu_config.trials and all(t.passed for t in r.trials), r.error_log
    assert failed(r) == ["stale_output_on_refill"], r.metadata.get("guards")
    assert r.error_log.startswith("Reward-hacking guard failed: stale_output_on_refill"), r.error_log
    assert "inputs refilled in place with new values" in r.error_log


def test_a_wrong_output_on_refilled_inputs_that_is_no_kept_answer_is_an_error_not_a_cache(cpu_config, tmp_path):
    """A candidate wrong on the refilled tensors, but not with the answer it gave them before (here
    off by 0.5; in the wild, an honest kernel whose error sits at the tolerance's edge, CUDA-L1's
    level 1 problem 60 on an H200): incorrect all the same, but not called a stale output."""
    cand = tmp_path / "wrong_on_refill.py"
    cand.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        again = getattr(x, '_kw_seen', False)  # the same tensor object: refilled in place\n"
        "        x._kw_seen = True\n"
        "        return torch.relu(x) + (1.5 if again else 1.0)\n"
    )
    r = evaluate(ADD_ONE, cand, dataclasses.replace(cpu_config, time_candidate=False))
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.error_log)
    assert "stale_output_on_refill" not in flags(r), r.metadata.get("guards")
    assert "output on a further input" in r.error_log and "written into the tensors of the one before" in r.error_log


def test_stored_output_fails_on_the_second_trial(cpu_config):
    r = run(cpu_config, "stored_output.py")
    assert r.status is Status.INCORRECT
    assert r.trials[0].passed and not r.trials[1].passed  # right once, then stale


def test_patched_verifier_is_restored_and_the_wrong_output_fails(cpu_config):
    r = run(cpu_config, "patch_verifier.py")
    assert r.status is Status.INCORRECT
    assert "compare_outputs" in flags(r)["patched_functions"]
    assert r.error_log.startswith("Outputs are not close")


def test_output_a_thread_fills_after_it_was_read_shows_as_never_written(cpu_config):
    """deferred_thread_late.py: the worker writes a call's output only once the next call starts, so
    trial 0's output is read while it still holds the guards' NaN fill."""
    r = run(cpu_config, "deferred_thread_late.py")
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.speedup, r.error_log)
    assert not r.trials[0].passed and "first failing trial 0" in r.error_log, r.error_log
    assert "never written" in r.error_log and "unwritten_output" in flags(r), r.error_log


def test_bf16_compute_fails_calibrated_and_is_named(cpu_config):
    r = run(cpu_config, "bf16_compute.py")
    assert r.status is Status.INCORRECT
    assert "calibrated check" in r.error_log
    assert "lower_precision_suspected" in flags(r)
    assert "bf16/fp16" in r.error_log


def test_reuse_of_reference_memory_shows_as_unwritten(cpu_config):
    r = run(cpu_config, "reuse_reference_output.py")
    assert r.status is Status.INCORRECT
    assert "unwritten_output" in flags(r)
    assert "never written" in r.error_log


def test_torch_ops_only_is_reported_as_no_custom_kernel(cpu_config):
    r = run(cpu_config, "torch_ops_only.py")
    assert r.status is Status.PASSED, r.error_log  # reported, not failed, by default
    assert "no_custom_kernel" in flags(r) and not failed(r)


def test_no_custom_kernel_fails_when_configured(cpu_config):
    cpu_config.guards.fail_on = cpu_config.guards.fail_on + ("no_custom_kernel",)
    r = run(cpu_config, "torch_ops_only.py")
    assert r.status is Status.INCORRECT and "no_custom_kernel" in r.error_log


def test_guards_off_lets_an_identity_cache_through(cpu_config):
    """The control: the same cheat passes when the guards are disabled (so the guard is what catches it)."""
    cpu_config.guards.enabled = False
    r = run(cpu_config, "cache_by_identity.py")
    assert r.status is Status.PASSED, r.error_log


# ---- honest candidates ---------------------------------------------------------------------------


def test_honest_python_candidate_raises_no_failing_flag(cpu_config):
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    # the one flag it does get is true: it is PyTorch operators only, no kernel of its own
    assert set(flags(r)) == {"no_custom_kernel"} and not failed(r)
    assert "timed_output_mismatch" in r.metadata["guards"]["checked"]


def test_a_candidate_that_turns_on_autotuning_is_said_to_and_still_passes(cpu_config):
    """`autotuned`: ModelNew's process turned `torch.backends.cudnn.benchmark` on (its speed is a
    draw of the algorithms timed in that process). A fact, never a verdict; the honest candidate
    without it is not flagged (test above)."""
    from kernelwright.core.config import REPORT_ONLY_FLAGS

    r = evaluate(ADD_ONE, CANDIDATES / "py_autotunes.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert "torch.backends.cudnn.benchmark" in flags(r)["autotuned"] and not failed(r)
    assert "autotuned" in REPORT_ONLY_FLAGS and "autotuned" in r.metadata["guards"]["checked"]
    # (and nothing else a check could say of it: on a loaded machine, its timing may be unstable)
    assert set(flags(r)) - {"timing_unstable"} == {"no_custom_kernel", "autotuned"}, flags(r)
    # the runner's report is the candidate's word: any shape of it is read as text, never trusted as a list
    from kernelwright.engine.child.judge_guards import _listed

    assert _listed(7) == [7] and _listed("abc") == ["abc"] and _listed(["a", "b"]) == ["a", "b"]


def test_a_candidate_that_times_itself_to_pick_its_path_is_said_to_and_still_passes(cpu_config):
    """`self_timed`: ModelNew's source reads a clock (here `time.perf_counter` around its two ways,
    at its first call, as CUDA-L1's level1/6, 13 and 60 do), so the path it keeps, and with it its
    speed and error, can follow the load of its process. Read by the parent from the source, relayed
    to the judge; a fact, never a verdict. The honest candidate reads none and is not flagged (above)."""
    from kernelwright.core.config import REPORT_ONLY_FLAGS

    r = evaluate(ADD_ONE, CANDIDATES / "py_self_timed.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert "time.perf_counter" in flags(r)["self_timed"] and not failed(r)
    assert "self_timed" in REPORT_ONLY_FLAGS and "self_timed" in r.metadata["guards"]["checked"]
    assert set(flags(r)) - {"timing_unstable"} == {"no_custom_kernel", "self_timed"}, flags(r)


@pytest.mark.slow
def test_honest_cpp_examples_are_flagged_by_nothing(cpu_config, small_swish):
    # the example's candidate and build on the example's problem at batch 16 (its 2M elements took
    # 75 s of the suite's time on 2 cores, for the same flags)
    r = evaluate(small_swish, EXAMPLES / "cpu_swish" / "candidate.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert flags(r) == {}, flags(r)
    assert r.metadata["guards"]["facts"]["call"]["extension_calls"] == ["kw_example_swish_cpu.fused_swish_affine"]
    r = evaluate(ADD_ONE, CANDIDATES / "cpp_same_name_1.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert flags(r) == {}, flags(r)


# ---- on a GPU -------------------------------------------------------------------------------------

GPU_CAUGHT_BY_FLAG = CPU_CAUGHT_BY_FLAG + [
    ("cache_by_pointer.py", "stale_output_on_refill"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("device_clock", [True, False])
def test_side_stream_work_is_on_the_judges_clock(cuda_config, device_clock):
    """side_stream.py hides a ~1 ms sleep, and its kernel, on a stream the timed one does not wait
    for. On the device clock the runner's stream starts when the judge's inputs have landed, and a
    stream that does not wait for it may read the window's inputs before they are there, or be
    committed before it is done: its timed outputs are wrong; where they are right, its work was
    inside the judge's span. On the wall clock (a driver without stream memory operations) the window
    ends after the runner synchronised the device and committed the outputs: the sleep is timed (a
    speed-up far below 1 on this tiny problem) and every timed output is right."""
    cfg = dataclasses.replace(cuda_config, timing=dataclasses.replace(cuda_config.timing, device_clock=device_clock))
    r = run(cfg, "side_stream.py")
    if device_clock and r.status is not Status.PASSED:  # (a race: the clock test's side_stream.py)
        assert r.status is Status.INCORRECT and "timed_output_mismatch" in flags(r), (r.status, r.error_log)
        return
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup < 0.5, r.speedup
    assert "timed_output_mismatch" not in flags(r)


@pytest.mark.gpu
@pytest.mark.parametrize("name,flag", GPU_CAUGHT_BY_FLAG)
def test_cheat_is_caught_on_cuda(cuda_config, name, flag):
    r = run(cuda_config, name)
    assert r.status is Status.INCORRECT, (r.status, r.error_log)
    accepted = (flag,) if isinstance(flag, str) else flag
    assert set(accepted) & set(failed(r)), r.metadata.get("guards")
    assert r.speedup is None


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    [
        "stored_output.py",
        "bf16_compute.py",
        "reuse_reference_output.py",
        "patch_verifier.py",
        "deferred_thread_late.py",
    ],
)
def test_incorrect_cheats_fail_on_cuda(cuda_config, name):
    r = run(cuda_config, name)
    assert r.status is Status.INCORRECT, (r.status, r.error_log)


@pytest.mark.gpu
def test_reference_memory_reuse_is_unwritten_on_cuda(cuda_config):
    r = run(cuda_config, "reuse_reference_output.py")
    assert r.status is Status.INCORRECT and "unwritten_output" in flags(r), r.error_log


@pytest.mark.gpu
def test_honest_cuda_example_is_flagged_by_nothing(cuda_config):
    ex = EXAMPLES / "cuda_swish"
    r = evaluate(ex / "problem.py", ex / "candidate.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert flags(r) == {}, (flags(r), r.metadata["guards"]["facts"])
    call = r.metadata["guards"]["facts"]["call"]
    # its own code was seen running: the extension's function (the autograd profiler of torch 2.11
    # lists ops, not kernel names, so own_cuda_kernels may stay empty; the kineto profile names them)
    assert call.get("extension_calls") or call.get("own_cuda_kernels"), call
    assert {"timed_output_mismatch", "faster_than_hardware"} <= set(r.metadata["guards"]["checked"])


@pytest.mark.gpu
def test_torch_ops_only_is_no_custom_kernel_on_cuda(cuda_config):
    r = run(cuda_config, "torch_ops_only.py")
    assert r.status is Status.PASSED, r.error_log
    # a few small ops a call can be host-bound: launch_bound reports that, never a verdict or a cheat
    assert set(flags(r)) - {"launch_bound"} == {"no_custom_kernel"}, (flags(r), r.metadata["guards"]["facts"])
