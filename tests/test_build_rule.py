"""One rule for builds the candidate catches (docs/VERDICTS.md): however a build call fails (the
compiler, the precheck, or a module that built but cannot be imported), it is a compile_error,
and a candidate that catches the failure and falls back to PyTorch does not pass with its
fallback. An extension with an undefined symbol builds (the trusted builder never imports what
it builds) and fails when the evaluation loads it."""

from __future__ import annotations

import pytest

from conftest import ADD_ONE, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

BF = FIXTURES / "builds"


@pytest.mark.slow
@pytest.mark.parametrize("trusted_cache", [True, False])
def test_a_module_that_cannot_be_imported_is_a_compile_error_caught_or_not(cpu_config, trusted_cache):
    cfg = cpu_config
    cfg.build.trusted_cache = trusted_cache  # loaded from the trusted cache, or built and loaded by the evaluation
    caught = evaluate(ADD_ONE, BF / "cpp_undefined_symbol_fallback.py", cfg)
    assert caught.status is Status.COMPILE_ERROR, caught.error_log  # not passed with the PyTorch fallback
    assert caught.error_log.startswith("The candidate caught this build failure and would have run PyTorch instead")
    assert "undefined symbol" in caught.error_log and caught.metadata["build_failure_caught"] is True
    plain = evaluate(ADD_ONE, BF / "cpp_undefined_symbol.py", cfg)
    assert plain.status is Status.COMPILE_ERROR, plain.error_log  # not a runtime_error at import
    assert "undefined symbol" in plain.error_log and "caught this build failure" not in plain.error_log
    assert any("undefined symbol" in i.message for i in plain.compile_issues)


def test_a_call_torch_rejects_before_building_is_a_compile_error_when_caught(cpu_config):
    r = evaluate(ADD_ONE, BF / "cpp_bad_argument_fallback.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert r.error_log.startswith("The candidate caught this build failure") and "optimise" in r.error_log
