"""Without bubblewrap too, a candidate cannot read the evaluator's secrets, kill it, outlive its
evaluation or take the machine's memory (engine/isolation/containment.py; attacks in tests/fixtures/host_attacks/)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import kernelwright
from conftest import ADD_ONE, EXAMPLES, FIXTURES
from kernelwright.core.record import Stage, Status
from kernelwright.engine import evaluate
from kernelwright.engine.isolation import containment

ATTACKS = FIXTURES / "host_attacks"
EVALUATOR = Path(__file__).resolve().parent / "helpers" / "evaluator.py"
PACKAGE_ROOT = str(Path(kernelwright.__file__).resolve().parent.parent)


def _attack(name: str, **fill: object) -> str:
    text = (ATTACKS / f"{name}.py").read_text()
    for key, value in fill.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    assert "__" + "MARKER__" not in text and "__SOCKET__" not in text, "a placeholder was left unfilled"
    return text


def _evaluate_in_a_process(
    cfg, candidate: Path, extra_env: dict[str, str]
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Evaluate in a separate evaluator process started with `extra_env` in its environment."""
    env = {**os.environ, **extra_env, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, str(EVALUATOR), str(ADD_ONE), str(candidate), json.dumps(cfg.to_dict())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = out.stdout.strip().splitlines()
    try:
        return out, json.loads(lines[-1]) if lines else None
    except ValueError:
        return out, None


def _no_namespace_no_cgroup(monkeypatch, cfg=None):
    """Take away the PID namespace and the cgroup, as on a host that allows neither: the sweep is left.
    (There a forked runner's zygote finds its confinement refused and runners are exec'd: `cfg`'s
    runners are exec'd here.)"""
    if cfg is not None:
        cfg.fork_runner = False
    monkeypatch.setattr(containment, "pid_namespace_prefix", lambda: ([], "disabled by the test"))
    monkeypatch.setattr(containment, "_cgroup_parents", lambda: ([], "disabled by the test"))


def test_the_evaluators_environment_cannot_be_read(cpu_config, tmp_path):
    canary = f"canary-{uuid.uuid4().hex}"
    cpu_config.sandbox, cpu_config.time_candidate, cpu_config.keep_workdir = "none", False, True
    cand = tmp_path / "read_parent_environ.py"
    cand.write_text(_attack("read_parent_environ"))
    tmp = tmp_path / "evaluator-tmp"  # its own TMPDIR: the directories it keeps are this test's alone
    tmp.mkdir()
    out, rec = _evaluate_in_a_process(cpu_config, cand, {"OPENAI_API_KEY": canary, "TMPDIR": str(tmp)})
    new_workdirs = set(glob.glob(os.path.join(str(tmp), "kw-eval-*")))
    try:
        assert rec is not None, out.stderr[-2000:]
        text = json.dumps(rec)
        for form in (canary, canary.encode().hex()):
            assert form not in text
        assert new_workdirs, "the evaluator kept no working directory: nothing was checked"
        for d in new_workdirs:
            for f in Path(d).rglob("*"):
                if f.is_file():
                    data = f.read_bytes()
                    assert canary.encode() not in data and canary.encode().hex().encode() not in data, f
        assert rec["status"] == "passed", rec["error_log"]  # it found nothing to steal, so it just worked
        assert rec["metadata"]["isolation"]["pid_namespace"] is True
    finally:
        for d in new_workdirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_the_evaluator_survives_a_candidate_that_kills_its_parent(cpu_config, tmp_path):
    cpu_config.sandbox, cpu_config.time_candidate = "none", False
    cand = tmp_path / "kill_parent.py"
    cand.write_text(_attack("kill_parent"))
    out, rec = _evaluate_in_a_process(cpu_config, cand, {})
    assert out.returncode == 0 and rec is not None, f"the evaluator died: {out.returncode} {out.stderr[-2000:]}"
    assert rec["status"] == "passed", rec["error_log"]


def _processes_with(token: str) -> list[int]:
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if token.encode() in Path(path).read_bytes():
                found.append(int(path.split("/")[2]))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("containment", ["default", "sweep only"])
def test_no_process_outlives_the_evaluation(cpu_config, tmp_path, monkeypatch, containment):
    if containment == "sweep only":
        _no_namespace_no_cgroup(monkeypatch, cpu_config)
    marker, token = tmp_path / "escaped", f"kw-escape-{uuid.uuid4().hex}"
    cpu_config.sandbox, cpu_config.time_candidate = "none", False
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("setsid_grandchild", marker=marker, token=token))
    assert r.status is Status.PASSED, r.error_log
    iso = r.metadata["isolation"]
    assert iso["pid_namespace"] is (containment == "default")
    left = _processes_with(token)
    assert not left, f"processes left after the evaluation: {left}"
    time.sleep(5)  # the grandchild would have written its marker by now
    assert not marker.exists()
    if containment == "sweep only":
        assert iso["swept_processes"] >= 1 and any("no PID namespace" in n for n in iso["notes"])


@pytest.mark.slow
def test_a_memory_hog_runs_into_the_limit(cpu_config):
    cpu_config.sandbox, cpu_config.time_candidate, cpu_config.memory_limit_mb = "none", False, 2048
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("memory_hog", gib=4))
    assert r.status is Status.RUNTIME_ERROR and r.error_stage is Stage.BUILD, r.error_log
    assert r.error_log.startswith("The evaluation's memory limit is 2048 MiB"), r.error_log
    assert r.metadata["isolation"]["memory_limit_mb"] == 2048
    assert r.metadata["isolation"]["rlimits"]["RLIMIT_AS"] == 2048 << 20


@pytest.mark.slow
def test_a_memory_hog_is_stopped_by_the_cgroup_where_no_rlimit_applies(cpu_config, monkeypatch):
    """A CUDA evaluation has no RLIMIT_AS (the driver reserves huge address space): the cgroup limits it."""
    parents, why = containment._cgroup_parents()
    if not any(kind in ("v2", "memory") for kind, _ in parents):
        pytest.skip(f"no writable memory cgroup here: {why or 'only pids'}")
    prepare = containment.prepare
    monkeypatch.setattr(containment, "prepare", lambda device, kind, limit: prepare("cuda", kind, limit))
    cpu_config.sandbox, cpu_config.time_candidate, cpu_config.memory_limit_mb = "none", False, 1536
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("memory_hog", gib=4))
    assert "RLIMIT_AS" not in r.metadata["isolation"]["rlimits"]
    assert r.metadata["isolation"]["memory_mechanism"] == "cgroup"
    assert r.status is Status.CRASHED and r.exit_code == -9, r.error_log
    assert r.error_log.startswith("The evaluation's memory limit is 1536 MiB (cgroup"), r.error_log


def test_a_cuda_evaluation_without_a_cgroup_says_it_has_no_memory_limit(monkeypatch):
    monkeypatch.setattr(containment, "_cgroup_parents", lambda: ([], "disabled by the test"))
    iso = containment.prepare("cuda", "none", 4096)
    facts = iso.describe()
    assert facts["memory_limit_mb"] is None and "RLIMIT_AS" not in facts["rlimits"]
    assert any("no memory limit" in n for n in facts["notes"])
    assert facts["rlimits"]["RLIMIT_CORE"] == 0 and facts["rlimits"]["RLIMIT_FSIZE"] > 0


def test_a_killed_process_is_still_reported_with_its_signal(cpu_config):
    """The namespace's init reports a signal as 128+N; the record still names the signal."""
    cpu_config.sandbox, cpu_config.time_candidate = "none", False
    text = (
        "import os, signal\nimport torch\nimport torch.nn as nn\nos.kill(os.getpid(), signal.SIGSEGV)\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x) + 1.0\n"
    )
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.CRASHED and r.exit_code == -11, (r.exit_code, r.error_log)
    assert "SIGSEGV" in r.error_log and r.metadata["isolation"]["pid_namespace"] is True


def _bwrap_ok() -> bool:
    from kernelwright.engine.isolation import sandbox

    try:
        return sandbox.resolve("bwrap") == "bwrap"
    except sandbox.SandboxUnavailable:
        return False


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode", ["none", pytest.param("bwrap", marks=pytest.mark.skipif(not _bwrap_ok(), reason="no bubblewrap"))]
)
def test_a_cuda_evaluation_passes_under_the_isolation(cuda_config, mode):
    cuda_config.sandbox = mode
    example = EXAMPLES / "cuda_swish"
    r = evaluate(example / "problem.py", example / "candidate.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    iso = r.metadata["isolation"]
    assert iso["pid_namespace"] and iso["pdeathsig"] and "RLIMIT_AS" not in iso["rlimits"]  # CUDA: no RLIMIT_AS
    assert iso["memory_mechanism"] in ("cgroup", "none"), iso
    if iso["memory_mechanism"] == "none":
        assert any("no memory limit" in n for n in iso["notes"]), iso
