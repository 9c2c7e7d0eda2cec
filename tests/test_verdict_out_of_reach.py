"""The verdict is made where the candidate cannot reach (issue 12).

Each attack in tests/verdict_attacks/ runs with a canary secret in the caller's environment; the verdict
must be the right one, the canary must appear nowhere in the record, and the evaluation must not
outlive its schedule. These run on the CPU; the CUDA variants are in test_cheats.py (gpu).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from conftest import ADD_ONE, FIXTURES
from kernelwright.core.config import StageTimeouts
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.config_resolution import resolve_config

ATTACKS = FIXTURES.parent / "verdict_attacks"
CANARY = "sk-canary-7f3a9c1e5b2d4680"


@pytest.fixture
def canary_env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("KW_TEST_SESSION_TOKEN", CANARY + "-token")
    return CANARY


def run(cfg, name):
    return evaluate(ADD_ONE, ATTACKS / name, cfg)


def assert_no_canary(r):
    text = r.to_json()
    assert CANARY not in text, "the caller's secret reached the record"


@pytest.mark.parametrize("sandbox", ["none", "auto"])
def test_a_log_replaced_by_a_link_to_the_environment_reads_nothing_back(cpu_config, canary_env, sandbox):
    r = run(resolve_config(replace(cpu_config, sandbox=sandbox)), "symlink_log.py")
    assert r.status is Status.RUNTIME_ERROR and "see the log" in r.error_log
    assert_no_canary(r)


def test_a_forged_final_record_on_the_report_pipe_is_not_the_verdict(cpu_config, canary_env):
    r = run(cpu_config, "forge_verdict.py")
    assert r.status is not Status.PASSED, r.error_log
    assert r.speedup is None and r.candidate_ms is None and not r.correct
    assert r.metadata["judged_by"].startswith("judge process")
    assert_no_canary(r)


def test_announcing_stages_does_not_extend_the_deadline(cpu_config, canary_env):
    cfg = replace(cpu_config, timeouts=StageTimeouts(startup=60, build=60, init=10, correctness=4, timing=4, profile=4))
    t0 = time.monotonic()
    r = run(cfg, "stage_flood.py")
    wall = time.monotonic() - t0
    assert r.status is Status.TIMEOUT, r.error_log
    # the stages the flood announced never restarted a clock: at most one budget per stage,
    # and the hung forward is in correctness, whose 4 s started once
    assert wall < 60, wall
    assert_no_canary(r)


def test_a_100_mb_line_on_the_report_pipe_ends_the_runner_quickly(cpu_config, canary_env):
    t0 = time.monotonic()
    r = run(cpu_config, "long_line.py")
    wall = time.monotonic() - t0
    assert r.status is Status.CRASHED and "over 1 MiB" in r.error_log, r.error_log
    assert wall < 30, wall  # bounded lines, linear parsing: no minute of parsing, no 500 MB
    assert_no_canary(r)


def test_lying_comparison_methods_on_tensor_do_not_make_zeros_correct(cpu_config, canary_env):
    r = run(cpu_config, "lying_tensor_ops.py")
    assert r.status is Status.INCORRECT and "Outputs are not close" in r.error_log, r.error_log
    assert_no_canary(r)


def test_a_tensor_subclass_output_is_judged_as_data(cpu_config, canary_env):
    r = run(cpu_config, "subclass_output.py")
    assert r.status is Status.INCORRECT, r.error_log
    assert "subclass" in r.error_log and "plain torch.Tensor" in r.error_log
    assert_no_canary(r)


def test_a_tuple_where_the_reference_returns_a_tensor_is_a_structure_mismatch(cpu_config, canary_env):
    r = run(cpu_config, "wrapped_in_tuple.py")
    assert r.status is Status.INCORRECT and "structure mismatch" in r.error_log, r.error_log
    assert_no_canary(r)


def test_replaying_outputs_keyed_on_version_gains_nothing_in_the_timed_calls(cpu_config, canary_env):
    """Every timed call gets a new tensor over inputs never seen before: the replay never hits, so
    the candidate is timed doing its (slow) honest work, and every timed output is right. A loaded
    machine moves its figure either way, and then says so: a gain is never trusted (its figure on a
    quiet machine, under 1x: benchmarks/clock_checks.py)."""
    r = run(cpu_config, "replay_by_version.py")
    assert r.status is Status.PASSED, (r.status, r.error_log, r.speedup)
    assert r.speedup < 1.5 or not r.speedup_trusted, (r.speedup, r.flags())
    assert "timed_output_mismatch" not in r.flags()
    assert_no_canary(r)


def test_output_files_swapped_for_links_are_never_followed(cpu_config, canary_env):
    r = run(cpu_config, "report_file_swap.py")
    assert r.status is not Status.PASSED or all(t.passed for t in r.trials)
    assert_no_canary(r)


def test_secret_values_are_redacted_from_every_text_of_the_record(cpu_config, canary_env, tmp_path):
    """Whatever channel a secret took (a file the candidate could read, its own printing), its
    value never leaves the engine: here the candidate raises with the value in its message."""
    leak = tmp_path / "leak.py"
    leak.write_text(
        "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    pass\n\n"
        f"raise RuntimeError('found {CANARY} somewhere')\n"
    )
    r = evaluate(ADD_ONE, leak, cpu_config)
    assert r.status is Status.RUNTIME_ERROR and "[redacted]" in r.error_log
    assert_no_canary(r)


def test_the_record_is_typed_an_unknown_key_is_an_error():
    from kernelwright.core.record import EvalResult

    good = EvalResult(status=Status.PASSED).to_dict()
    assert EvalResult.from_dict(good).status is Status.PASSED
    with pytest.raises(ValueError, match="speedupp"):
        EvalResult.from_dict(dict(good, speedupp=2.0))


def test_files_planted_where_outputs_go_are_replaced_not_blamed_on_the_engine(cpu_config, canary_env):
    r = run(cpu_config, "preplanted_output_files.py")
    assert r.status is Status.PASSED, r.error_log  # the engine wrote its own files over them


def test_output_files_grown_to_gigabytes_are_not_read(cpu_config, canary_env):
    t0 = time.monotonic()
    r = run(cpu_config, "grow_output_files.py")
    assert time.monotonic() - t0 < 60  # no 2 GiB read
    # the thread races the judge: a file it grew before the judge read it is refused by size
    # (a file read before it grew was the engine's own, and judged as it was); a thread still
    # growing files when the evaluation's guards look is itself failed (`background_threads`)
    # (the judge's input files lie in the same directory: a grown one breaks only the candidate's own read)
    assert r.status in (Status.PASSED, Status.INCORRECT, Status.RUNTIME_ERROR), r.error_log
    assert (
        r.status is Status.PASSED
        or "over the" in r.error_log
        or "does not match its header" in r.error_log
        or r.metadata["guards"]["failed"] == ["background_threads"]
    ), r.error_log
    assert_no_canary(r)


def test_inputs_made_easier_in_the_candidates_process_change_nothing(cpu_config):
    """The runner draws no inputs (the judge hands them over as data) and holds no problem module:
    a patched torch.randn is reported and undone, and the kernel that skips relu fails on the judge's inputs."""
    r = run(cpu_config, "easier_inputs.py")
    assert r.status is Status.INCORRECT and not r.correct and r.speedup is None
    assert "torch.randn" in r.flags()["patched_functions"]
    assert not any(t.passed for t in r.trials)
