"""Executors: the local one (a worker process per GPU) and the Ray one give the serial path's
verdicts; a worker killed mid-evaluation has its task retried once elsewhere, and the retry is
recorded; every task resolves exactly once. CPU candidates, fake GPUs."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from dataclasses import replace

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES, make_cpu_config
from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import EngineError
from kernelwright.engine.isolation.environment import child_env, child_environment
from kernelwright.executors import orphans
from kernelwright.executors.factory import make_executor
from kernelwright.executors.interface import EvalTask, SerialExecutor, WorkerLost
from kernelwright.executors.local import LocalExecutor
from kernelwright.executors.placement import (
    TimingGate,
    detect_gpus,
    parse_gpus,
    plan_cores,
    refuse_unseen,
    visible_entries,
)

# Passes only in a child pinned to one of the fake GPUs: the pinning is checked by the verdict.
PINNED = """import os
import torch
import torch.nn as nn

PINNED = os.environ.get("CUDA_VISIBLE_DEVICES") in ("0", "1")


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0.0) + (1.0 if PINNED else 2.0)
"""

# Slow on its first call in a process, so that a worker can be killed while it is being checked.
SLOW_FIRST = """import time
import torch
import torch.nn as nn

CALLS = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        CALLS[0] += 1
        if CALLS[0] == 1:
            time.sleep(2.0)
        return x.clamp_min(0.0) + 1.0
"""

SUITE = {
    name: (CANDIDATES / f"{name}.py").read_text() for name in ("py_correct", "py_wrong", "py_segfault", "py_raises")
}
SUITE["pinned"] = PINNED


def tasks(suite: dict[str, str]) -> list[EvalTask]:
    return [EvalTask(key=f"add_one/{name}", problem=ADD_ONE, candidate_text=text) for name, text in suite.items()]


def run_all(executor, batch: list[EvalTask]) -> dict[str, object]:
    """Submit a batch and collect every resolution, as a run store would: key -> result (or error)."""
    store: dict[str, list] = {}
    lock = threading.Lock()

    def keep(key, fut):
        with lock:
            store.setdefault(key, []).append(fut.exception() or fut.result())

    futs = [executor.submit(t) for t in batch]
    for t, f in zip(batch, futs, strict=True):
        f.add_done_callback(lambda f, key=t.key: keep(key, f))
    for f in futs:
        f.exception(timeout=600)  # waits for it
    time.sleep(0.05)  # done callbacks run on the resolving thread
    assert all(len(v) == 1 for v in store.values()), {k: len(v) for k, v in store.items()}  # each result once
    assert sorted(store) == sorted(t.key for t in batch)
    return {k: v[0] for k, v in store.items()}


@pytest.fixture(scope="module")
def serial_verdicts(cache_dir):
    cfg = _cpu(cache_dir)
    with pytest.MonkeyPatch.context() as mp, SerialExecutor(cfg) as ex:
        mp.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the control: a child pinned to nothing
        out = {t.key: ex.submit(t).result().status for t in tasks(SUITE)}
    assert out["add_one/pinned"] is Status.INCORRECT  # unpinned: the serial path is the control
    return out


def _cpu(cache_dir):
    """The settings of conftest's cpu_config (a module-scoped fixture cannot use that one), its
    cheaper timing included (these tests compare verdicts and placements, not times)."""
    cfg = make_cpu_config(cache_dir)
    cfg.timeouts.correctness = 8
    return cfg


# ---- placement ---------------------------------------------------------------------------------


def test_cores_are_split_only_where_the_machine_has_cores_to_spare():
    plan = plan_cores(2, cores_per_worker=2, available=list(range(16)))
    assert plan.workers == [{0, 1}, {2, 3}] and plan.builds == set(range(4, 16)) and not plan.scarce
    small = plan_cores(2, cores_per_worker=2, available=[0, 1])
    assert small.scarce and small.builds is None and small.workers == [None, None]


def test_the_timing_gate_holds_a_build_while_a_gpu_is_timed():
    gate = TimingGate(active=True)
    gate.enter()
    started = threading.Event()
    t = threading.Thread(target=lambda: (gate.wait_clear(), started.set()))
    t.start()
    assert not started.wait(0.3)  # held while timing
    gate.leave()
    assert started.wait(5)
    t.join()
    assert gate.held_s >= 0.25
    idle = TimingGate(active=False)
    idle.enter()
    assert idle.wait_clear() == 0.0  # cores to spare: never held


def test_gpus_option_is_parsed_and_duplicates_are_refused():
    assert parse_gpus("0, 1,3") == ["0", "1", "3"] and parse_gpus(None) is None
    with pytest.raises(ValueError, match="names a GPU twice"):
        parse_gpus("0,0")


def test_gpus_outside_the_callers_visible_devices_are_refused(monkeypatch):
    # a shell given GPUs 2 and 3 of a shared machine: each worker's CUDA_VISIBLE_DEVICES is its --gpus
    # entry, so "0" would put it on GPU 0, which this shell was not given
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    refuse_unseen(["3"])
    refuse_unseen(["2", "3"])
    with pytest.raises(ValueError, match=r"0 not among this shell's CUDA_VISIBLE_DEVICES \(2,3\).*--gpus 2,3"):
        refuse_unseen(["0", "3"])
    # through the executor, as `--gpus` reaches it (this machine's device check left out: it may have no GPU)
    monkeypatch.setattr("kernelwright.executors.local.resolve_config", lambda config: config)
    with pytest.raises(ValueError, match=r"not among"):
        LocalExecutor(EvalConfig(device="cuda"), gpus=["0"])
    with pytest.raises(ValueError, match=r"not among"):  # `--executor serial --gpus 0`: its child's, alike
        make_executor("serial", EvalConfig(device="cuda"), ["0"])
    LocalExecutor(EvalConfig(device="cpu"), gpus=["0", "1"]).close()  # the CPU's slots: no GPU reached
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none given
    with pytest.raises(ValueError, match="gives no GPU; unset it"):
        refuse_unseen(["0"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # not set: every GPU of the machine is the caller's
    refuse_unseen(["0", "7"])


def test_visible_devices_are_read_as_cuda_reads_them(monkeypatch):
    # CUDA ignores every entry after the first that names no GPU: `1,-1,0` gives this shell GPU 1 alone
    assert visible_entries("1,-1,0") == ["1"]
    assert visible_entries("0, 2,3") == ["0", "2", "3"]
    assert visible_entries("GPU-aa,MIG-bb,x,1") == ["GPU-aa", "MIG-bb"]
    assert visible_entries("-1") == [] and visible_entries("") == [] and visible_entries("0,,1") == ["0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,0")
    refuse_unseen(["1"])
    with pytest.raises(ValueError, match=r"0 not among this shell's CUDA_VISIBLE_DEVICES \(1\)"):
        refuse_unseen(["0"])


def test_child_environment_pins_the_gpu_and_passes_the_nvlink_multicast_switches(tmp_path, monkeypatch):
    switches = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    for k, v in switches.items():
        monkeypatch.setenv(k, v)
    env = child_environment()
    assert {k: env.get(k) for k in switches} == switches
    cfg = _cpu(str(tmp_path))
    assert child_env(replace(cfg, visible_devices="1"), tmp_path)["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert child_env(cfg, tmp_path)["CUDA_VISIBLE_DEVICES"] == "0,1"  # unpinned: the caller's own


# ---- the local executor ------------------------------------------------------------------------


@pytest.mark.slow
def test_local_executor_gives_the_serial_verdicts_on_two_fake_gpus(cache_dir, serial_verdicts):
    cfg = _cpu(cache_dir)
    with LocalExecutor(cfg, gpus=["0", "1"], build_workers=1) as ex:
        assert ex.gate.active  # two cores here: builds wait while a GPU is timed
        build_started_while_timing = []
        original = ex._builds.before
        ex._builds.before = lambda: (original(), build_started_while_timing.append(ex.gate.timing))
        results = run_all(ex, tasks(SUITE))
    got = {k: r.status for k, r in results.items()}
    expected = dict(serial_verdicts, **{"add_one/pinned": Status.PASSED})  # pinned here, not in the serial path
    assert got == expected
    placed = [r.metadata["executor"] for r in results.values()]
    assert {p["gpu"] for p in placed} == {"0", "1"}  # both GPUs used
    assert all(p["kind"] == "local" and p["host"] and p["attempts"] == 1 and not p["retried_after"] for p in placed)
    assert all(p["prebuild"] and p["prebuild"]["ok"] for p in placed if p is not None)
    assert build_started_while_timing and not any(build_started_while_timing)


@pytest.mark.slow
def test_a_killed_local_worker_has_its_task_retried_once_elsewhere(cache_dir):
    cfg = replace(_cpu(cache_dir), sandbox="none")  # no bwrap --die-with-parent: the orphan is ours to stop
    killed: list[tuple[int, int, str]] = []

    def kill_on_correctness(stage: str) -> None:
        if stage == "correctness" and not killed:
            slot, pid, tag = ex.running()["add_one/slow"]
            killed.append((slot, pid, tag))
            time.sleep(0.5)  # the candidate is in its slow first call now
            os.kill(pid, signal.SIGKILL)

    with LocalExecutor(cfg, gpus=["0", "1"], build_workers=0) as ex:
        fut = ex.submit(EvalTask(key="add_one/slow", problem=ADD_ONE, candidate_text=SLOW_FIRST), kill_on_correctness)
        other = ex.submit(EvalTask(key="add_one/correct", problem=ADD_ONE, candidate_text=SUITE["py_correct"]))
        result = fut.result(timeout=300)
        assert other.result(timeout=300).status is Status.PASSED
    assert result.status is Status.PASSED, result.error_log
    placed = result.metadata["executor"]
    slot, pid, tag = killed[0]
    assert placed["attempts"] == 2
    assert len(placed["retried_after"]) == 1
    note = placed["retried_after"][0]
    assert f"pid{pid}" in note and "SIGKILL" in note and "correctness" in note
    assert placed["gpu"] == ["0", "1"][1 - slot]  # elsewhere: the other GPU
    assert orphans.tagged_pids(tag) == []  # the dead worker's evaluation child was stopped


@pytest.mark.slow
def test_a_task_whose_retry_dies_too_resolves_with_worker_lost(cache_dir):
    cfg = replace(_cpu(cache_dir), sandbox="none")
    kills = []

    def kill_every_time(stage: str) -> None:
        if stage == "correctness":
            slot, pid, _ = ex.running()["add_one/slow"]
            kills.append(slot)
            os.kill(pid, signal.SIGKILL)

    with LocalExecutor(cfg, gpus=["0", "1"], build_workers=0) as ex:
        fut = ex.submit(EvalTask(key="add_one/slow", problem=ADD_ONE, candidate_text=SLOW_FIRST), kill_every_time)
        with pytest.raises(WorkerLost, match="after a retry"):
            fut.result(timeout=300)
        # the executor carries on with fresh workers
        assert (
            ex.submit(EvalTask(key="add_one/ok", problem=ADD_ONE, candidate_text=SUITE["py_correct"]))
            .result(timeout=300)
            .status
            is Status.PASSED
        )
    assert sorted(kills) == [0, 1]  # once on each GPU, never twice on one


# ---- the Ray executor --------------------------------------------------------------------------

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs ray (pip install 'kernelwright[ray]'); .ci/run installs it"
)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs and 2 fake GPUs, started by the test (about 10 s)."""
    import ray

    from kernelwright.executors.ray_executor import _runtime_env

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, runtime_env=_runtime_env())
    yield ray
    ray.shutdown()


@pytest.mark.slow
@needs_ray
def test_ray_executor_gives_the_serial_verdicts_and_retries_a_killed_actor(local_ray, cache_dir, serial_verdicts):
    from kernelwright.executors.ray_executor import RayExecutor

    cfg = _cpu(cache_dir)
    killed: list[int] = []

    def kill_actor(stage: str) -> None:
        if stage == "correctness" and not killed:
            slot = ex.running()["add_one/slow"]
            killed.append(slot)
            time.sleep(0.5)
            local_ray.kill(ex.actor(slot))

    with RayExecutor(cfg) as ex:
        assert ex.workers == 2
        results = run_all(ex, tasks(SUITE))
        slow = ex.submit(EvalTask(key="add_one/slow", problem=ADD_ONE, candidate_text=SLOW_FIRST), kill_actor)
        slow_result = slow.result(timeout=300)
    assert {k: r.status for k, r in results.items()} == dict(serial_verdicts, **{"add_one/pinned": Status.PASSED})
    placed = [r.metadata["executor"] for r in results.values()]
    assert {p["gpu"] for p in placed} == {"0", "1"} and all(p["kind"] == "ray" and p["attempts"] == 1 for p in placed)
    assert all(p["prebuild"]["ok"] for p in placed)
    assert slow_result.status is Status.PASSED, slow_result.error_log
    meta = slow_result.metadata["executor"]
    assert meta["attempts"] == 2 and len(meta["retried_after"]) == 1 and "correctness" in meta["retried_after"][0]
    assert meta["worker"].startswith(f"actor{1 - killed[0]}/")  # elsewhere: the other actor


def test_ray_executor_without_ray_is_a_one_line_error_naming_the_install(monkeypatch):
    import sys

    from kernelwright.executors.ray_executor import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(EngineError) as err:
        RayExecutor()
    assert "pip install 'kernelwright[ray]'" in str(err.value) and "\n" not in str(err.value)


def test_cli_executor_ray_without_ray_exits_2_with_the_install_line(monkeypatch, tmp_path):
    import sys

    from typer.testing import CliRunner

    from kernelwright.cli.main import app

    monkeypatch.setitem(sys.modules, "ray", None)
    replay = EXAMPLES / "cuda_swish" / "replay"
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "optimize",
            str(ADD_ONE),
            "--coder",
            f"replay:{replay}",
            "--device",
            "cpu",
            "--executor",
            "ray",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2
    assert "pip install 'kernelwright[ray]'" in result.output and "Traceback" not in result.output
    assert not out.exists()  # nothing started, nothing written
    bad = CliRunner().invoke(
        app,
        [
            "optimize",
            str(ADD_ONE),
            "--coder",
            f"replay:{replay}",
            "--device",
            "cpu",
            "--executor",
            "slurm",
            "--out",
            str(out),
        ],
    )
    assert bad.exit_code == 2 and "--executor must be one of serial, local, ray" in bad.output


# ---- on the GPU machine --------------------------------------------------------------------------

# Passes only where the child sees exactly one GPU (pinned), computing on it.
ONE_GPU = """import torch
import torch.nn as nn

SEEN = torch.cuda.device_count()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + (1.0 if SEEN == 1 else 2.0)
"""


@pytest.mark.gpu
def test_local_executor_pins_one_gpu_per_worker_and_records_it(cuda_config):
    # named as the caller's CUDA_VISIBLE_DEVICES names them (a test worker given GPU 1 alone sees `1`, not `0`)
    gpus = detect_gpus()
    assert gpus, "no GPU named by CUDA_VISIBLE_DEVICES or nvidia-smi on a machine that has one"
    n = len(gpus)
    with LocalExecutor(cuda_config, gpus=gpus) as ex:
        batch = [EvalTask(key=f"add_one/pinned{i}", problem=ADD_ONE, candidate_text=ONE_GPU) for i in range(2 * n)]
        results = run_all(ex, batch)
    assert all(r.status is Status.PASSED for r in results.values()), [r.error_log for r in results.values()]
    assert {r.metadata["executor"]["gpu"] for r in results.values()} == set(gpus)
    assert all(r.device and "cpu" not in r.device.lower() for r in results.values())
