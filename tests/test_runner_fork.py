"""CPU runners forked from the runner's zygote (`engine/runner_fork.py`, `engine/child/confine.py`):
the same verdicts as exec'd runners, and nothing of one evaluation within another's reach."""

from __future__ import annotations

import dataclasses
import glob
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_sandbox import needs_bwrap

from conftest import ADD_ONE, CANDIDATES, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate, runner_fork
from kernelwright.engine.child import confine

SANDBOXES = [pytest.param("bwrap", marks=needs_bwrap), "none"]


def _attack(name: str, **fill: object) -> str:
    text = (FIXTURES / "host_attacks" / f"{name}.py").read_text()
    for key, value in fill.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    return text


def _until_forked(cfg) -> None:
    """Evaluations until one's runner was forked (the first starts the zygote and waits for its import,
    unless that outlasts `zygote_client.READY_WAIT_S`)."""
    for _ in range(20):
        r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cfg)
        assert r.status is Status.PASSED, r.error_log
        if r.metadata["runner_process"] == "forked":
            return
        for s in list(runner_fork._SETS.values()):
            for z in s.zygotes:
                z.is_ready(60)
    raise AssertionError(f"no runner was forked in 20 evaluations: {runner_fork.broken()}")


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_forked_and_started_runners_give_the_same_verdicts(cpu_config, sandbox):
    cpu_config.sandbox, cpu_config.time_candidate = sandbox, False
    _until_forked(cpu_config)
    started_cfg = dataclasses.replace(cpu_config, fork_runner=False)
    for name in ("py_correct", "py_wrong", "py_segfault"):
        forked = evaluate(ADD_ONE, CANDIDATES / f"{name}.py", cpu_config)
        started = evaluate(ADD_ONE, CANDIDATES / f"{name}.py", started_cfg)
        assert (forked.metadata["runner_process"], started.metadata["runner_process"]) == ("forked", "started")
        assert forked.status is started.status, (name, forked.error_log, started.error_log)
        assert forked.error_stage == started.error_stage, name
        iso = forked.metadata["isolation"]
        assert iso["pid_namespace"] and iso["caps_dropped"], iso
    assert forked.status is Status.CRASHED


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_forked_runner_sees_nothing_of_the_other_evaluations(cpu_config, sandbox):
    """One after the other (the second looks for what the first planted, and for its torch) and two
    at once (each looks for the other): their directories, /dev/shm, /proc, the zygote's memory."""
    cpu_config.sandbox, cpu_config.time_candidate = sandbox, False
    _until_forked(cpu_config)
    text = _attack("forked_sibling_peek")
    for _ in range(2):
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
        assert r.metadata["runner_process"] == "forked"
        assert r.status is Status.PASSED, r.error_log
    for _round in range(2):  # the first round starts a second zygote; in the second both runners are forked
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda _: evaluate(ADD_ONE, None, cpu_config, candidate_text=text), range(2)))
        # an exec'd runner without bubblewrap sees the host's /tmp and /dev/shm (`--sandbox none`)
        forked = [r for r in both if r.metadata["runner_process"] == "forked"]
        assert all(r.status is Status.PASSED for r in forked), [r.error_log for r in forked]
        for s in list(runner_fork._SETS.values()):
            for z in s.zygotes:
                z.is_ready(60)
    assert [r.metadata["runner_process"] for r in both] == ["forked", "forked"]


def test_a_forked_runners_grandchild_in_its_own_session_dies_with_it(cpu_config, tmp_path):
    marker, token = tmp_path / "escaped", f"kw-escape-{uuid.uuid4().hex}"
    cpu_config.sandbox, cpu_config.time_candidate = "none", False  # its marker is the test's to see
    _until_forked(cpu_config)
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("setsid_grandchild", marker=marker, token=token))
    assert r.status is Status.PASSED and r.metadata["runner_process"] == "forked", r.error_log
    left = [p for p in glob.glob("/proc/[0-9]*/cmdline") if token.encode() in _read(p)]
    assert not left, f"processes left after the evaluation: {left}"
    time.sleep(5)  # the grandchild would have written its marker by now
    assert not marker.exists()


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def test_a_confinement_the_kernel_refuses_is_reported_not_run(tmp_path):
    """The zygote's probe: a fork that cannot confine itself says why, and runs nothing after."""
    missing = tmp_path / "missing"
    why = confine.probe({"covers": [[str(missing), [str(missing / "dir")]]], "proc": "try", "network": False})
    assert why and "missing" in why, why


def test_the_bases_of_a_configuration_put_aside_for_newer_ones_are_removed_at_exit(cpu_config, tmp_path, monkeypatch):
    """A process that evaluates under more configurations than it keeps zygotes for (`MAX_KEYS`) puts
    the oldest aside; its base folders (one of them on /dev/shm, memory) went only with the two-hour
    sweep of leftovers (one CI run of these tests: ten on /dev/shm, from the pytest workers). Now they
    go at the process's exit as the kept ones do, where the evaluations in them removed their own."""
    monkeypatch.setattr(runner_fork, "_SETS", {})
    monkeypatch.setattr(runner_fork, "_RETIRED", [], raising=False)
    bases: list[Path] = []
    for i in range(runner_fork.MAX_KEYS + 1):
        cfg = dataclasses.replace(cpu_config, cache_dir=str(tmp_path / f"cache{i}"))
        d = runner_fork.workdir(cfg)
        assert d is not None
        bases += [b for b in runner_fork.bases() if b not in bases]
        d.rmdir()  # the evaluation removed its own directory
    assert len(runner_fork._SETS) == runner_fork.MAX_KEYS  # the first configuration's set was put aside
    assert len(bases) >= runner_fork.MAX_KEYS + 1 and all(b.is_dir() for b in bases)
    runner_fork.close_all()
    assert [b for b in bases if b.exists()] == []
