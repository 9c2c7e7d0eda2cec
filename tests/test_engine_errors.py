"""An exception in the engine's own code is `engine_error`, never the candidate's fault and never a
pass; a candidate's own error or a CUDA error it left pending stays the candidate's."""

from __future__ import annotations

import pytest
import torch

from conftest import ADD_ONE, CANDIDATES, FIXTURES
from kernelwright.core.record import EvalResult, Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import faults

EF = FIXTURES / "engine_faults"
PY_CORRECT = CANDIDATES / "py_correct.py"


# ---- the classification (no child process) ---------------------------------------------------------


def test_a_cuda_error_outside_candidate_code_is_the_candidates_pending_error():
    exc = RuntimeError("CUDA error: invalid argument\nCUDA kernel errors might be asynchronously reported")
    blame = faults.classify(exc, "cuda")
    assert blame.status is Status.RUNTIME_ERROR
    assert blame.log.startswith("the candidate left a CUDA error pending: CUDA error: invalid argument")


def test_a_pending_error_found_by_sync_and_check_is_the_candidates():
    exc = faults.PendingCudaError("the candidate left a CUDA error pending: CUDA error: invalid argument")
    assert faults.classify(exc, "cuda").status is Status.RUNTIME_ERROR


def test_an_exception_raised_only_in_engine_and_torch_code_is_engine_error(monkeypatch):
    # frames of this test file would count as foreign (candidate) code: count them as the engine's
    try:
        torch.empty(2, 3).view(7)
    except RuntimeError as exc:
        monkeypatch.setattr(faults, "_roots", lambda: _with_tests(faults))
        blame = faults.classify(exc, "cpu")
    assert blame.status is Status.ENGINE_ERROR
    assert "engine bug, not the candidate's fault" in blame.log
    assert "Traceback" in blame.metadata["engine_traceback"]


_ORIG_ROOTS = faults._roots


def _with_tests(mod):
    import os

    return _ORIG_ROOTS() + (os.path.dirname(os.path.realpath(__file__)) + os.sep,)


def test_a_torch_error_raised_while_a_candidate_module_was_called_is_the_candidates(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    monkeypatch.setattr(faults, "_roots", lambda: _with_tests(faults))
    try:
        model(torch.randn(3, 5))  # wrong shape: raised in torch's frames, called on the candidate's module
    except RuntimeError as exc:
        assert faults.classify(exc, "cpu").status is Status.ENGINE_ERROR  # without knowing the module
        blame = faults.classify(exc, "cpu", candidate_objects=tuple(model.modules()))
    assert blame.status is Status.RUNTIME_ERROR


def test_sync_and_check_is_a_no_op_on_the_cpu():
    faults.sync_and_check(torch.device("cpu"))


def test_engine_error_round_trips_through_the_record():
    r = EvalResult.from_dict({"status": "engine_error", "metadata": {"engine_traceback": "tb"}})
    assert r.status is Status.ENGINE_ERROR and r.status is not Status.PASSED


# ---- injected faults through a real evaluation --------------------------------------------------------


def test_a_bug_in_a_guard_is_engine_error_not_the_candidates(cpu_config):
    r = evaluate(EF / "add_one_broken_guard.py", PY_CORRECT, cpu_config)
    assert r.status is Status.ENGINE_ERROR, r.error_log
    assert "engine bug, not the candidate's fault" in r.error_log
    assert "injected engine bug in same_values" in r.metadata["engine_traceback"]
    assert "guards" in r.metadata["engine_traceback"] or "checks.py" in r.metadata["engine_traceback"]


def test_a_bug_in_the_timing_code_is_engine_error_and_withdraws_the_speedup(cpu_config):
    r = evaluate(EF / "add_one_broken_timing.py", PY_CORRECT, cpu_config)
    assert r.status is Status.ENGINE_ERROR, r.error_log
    assert "injected engine bug in summary._stats" in r.metadata["engine_traceback"]
    assert r.speedup is None and r.candidate_ms is None


def test_the_candidates_own_error_inside_a_guard_call_is_still_its_runtime_error(cpu_config):
    r = evaluate(ADD_ONE, EF / "raises_on_guard_call.py", cpu_config)
    assert r.status is Status.RUNTIME_ERROR, r.error_log
    assert "candidate bug on call 4" in r.error_log
    assert "engine_traceback" not in r.metadata


@pytest.mark.gpu
def test_a_launch_error_left_pending_is_the_candidates_in_plain_words(cuda_config):
    r = evaluate(ADD_ONE, EF / "cuda_launch_error_left_pending.py", cuda_config)
    assert r.status is Status.RUNTIME_ERROR, r.error_log
    assert "the candidate left a CUDA error pending" in r.error_log
    assert "engine_traceback" not in r.metadata
