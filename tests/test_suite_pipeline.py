"""A suite at the speed of its GPU work, on the CPU: `suite eval` through the executors (local by
default) with `--json`, `--quiet` and `--config`; no evidence stage unless `--profile` is asked;
the pipeline's states and the GPUs' busy share; warm spares ready before their evaluation; a
prebuild's trusted builds handed to the worker so that no builder starts on the GPU's path."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from conftest import ADD_ONE, CANDIDATES, FIXTURES, make_cpu_config
from kernelwright.cli.main import app
from kernelwright.core.record import Status
from kernelwright.engine.extensions import trusted_builds
from kernelwright.executors.interface import EvalTask
from kernelwright.executors.local import LocalExecutor
from kernelwright.executors.warm_pool import WarmPool
from kernelwright.store import open_store
from kernelwright.suites.pipeline import Pipeline, state_of

SUITE = FIXTURES / "suite"

# A C++ extension with literal arguments: the trusted builder builds it, in the driver's prebuild.
CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = """
#include <torch/extension.h>
torch::Tensor relu_plus_one(torch::Tensor x) { return torch::relu(x) + 1; }
"""
ext = load_inline(name="kw_pipeline_relu_plus_one", cpp_sources=cpp, functions=["relu_plus_one"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_plus_one(x)
'''


def cli(*args: str, code: int = 0):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def _cpu(cache_dir):
    """conftest's cpu_config (its cheaper timing: these tests are about the pipeline, not times), two trials."""
    cfg = make_cpu_config(cache_dir)
    cfg.trials = 2
    return cfg


@pytest.mark.slow
def test_suite_eval_json_config_and_no_evidence_stage(tmp_path, cache_dir, monkeypatch):
    """Two torch-only candidates through the local executor; a settings file sets the trials; the
    records carry no profile stage and no roofline, as no profile was asked."""
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    problems = tmp_path / "level1"
    problems.mkdir()
    for name in ("1_add_one", "2_swish"):
        shutil.copy(SUITE / "level1" / f"{name}.py", problems)
    settings = tmp_path / "kw.toml"
    settings.write_text("[eval]\ntrials = 2\n")
    result = cli(
        "suite",
        "eval",
        str(problems),
        str(SUITE / "candidates"),
        "--device",
        "cpu",
        "--json",
        "--config",
        str(settings),
        "--name",
        "pipe",
        "--out",
        str(tmp_path / "out"),
        "--store",
        str(tmp_path / "kw.db"),
    )
    summary = json.loads(result.stdout)  # stdout holds the JSON and nothing else
    assert sorted(summary["ran"]) == ["level1/1_add_one", "level1/2_swish"] and summary["executor"] == "local"
    assert summary["metrics"]["correct"] == 2 and not summary["failed"]
    with open_store(tmp_path / "kw.db") as db:
        records = [e["record"] for e in db.evaluations(suite="pipe")]
    assert len(records) == 2
    for rec in records:
        assert rec["status"] == "passed"
        assert len(rec["trials"]) == 2  # from the settings file
        assert rec["stage_times"]["profile_s"] is None  # no evidence stage
        assert "roofline" not in rec["metadata"] and "gpu_facts" not in rec["metadata"]
        assert rec["metadata"]["executor"]["kind"] == "local"
    # a rerun with --quiet: one line, and nothing to run
    again = cli(
        "suite",
        "eval",
        str(problems),
        str(SUITE / "candidates"),
        "--device",
        "cpu",
        "--quiet",
        "--config",
        str(settings),
        "--name",
        "pipe",
        "--out",
        str(tmp_path / "out"),
        "--store",
        str(tmp_path / "kw.db"),
    )
    assert "suite pipe: 2/2 correct" in again.output and "ran 0, skipped 2" in again.output


@pytest.mark.slow
def test_eval_without_profile_has_no_evidence_stage(cache_dir, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    out = cli("eval", str(ADD_ONE), str(CANDIDATES / "py_correct.py"), "--device", "cpu", "--trials", "2", "--json")
    rec = json.loads(out.stdout)
    assert rec["status"] == "passed"
    assert rec["stage_times"]["profile_s"] is None and "roofline" not in rec["metadata"]


def test_suite_bad_executor_options_are_one_line_and_exit_2(tmp_path):
    for args, message in [
        (["--executor", "serial", "--gpus", "0,1"], "--executor serial uses one GPU"),
        (["--executor", "slurm"], "--executor must be one of serial, local, ray"),
        (["--gpus", "0,0"], "names a GPU twice"),
    ]:
        out = cli(
            "suite",
            "eval",
            str(SUITE / "level1"),
            str(SUITE / "candidates"),
            "--device",
            "cpu",
            "--store",
            str(tmp_path / "kw.db"),
            *args,
            code=2,
        ).output
        assert message in out and "Traceback" not in out
    bad = tmp_path / "bad.toml"
    bad.write_text("[eval]\ntrails = 2\n")
    out = cli(
        "suite",
        "eval",
        str(SUITE / "level1"),
        str(SUITE / "candidates"),
        "--config",
        str(bad),
        "--store",
        str(tmp_path / "kw.db"),
        code=2,
    ).output
    assert "unknown key 'eval.trails'" in out and "Traceback" not in out


def test_pipeline_states_and_gpu_busy_share():
    assert [state_of(s) for s in ("prebuild", "building", "built", "startup", "correctness", "timing")] == [
        "build queued",
        "building",
        "waiting for a GPU",
        "on the GPU",
        "on the GPU",
        "on the GPU",
    ]
    pipe = Pipeline(gpus=2)
    for key in "abc":
        pipe.queued(key, "build queued")
    pipe.stage("a", "building")
    pipe.stage("b", "timing")
    pipe.done("c", SimpleNamespace(stage_times=SimpleNamespace(correctness_s=0.4, timing_s=0.6)))
    pipe.stage("c", "profile")  # a late stage never takes a finished task back
    assert pipe.counts() == {"build queued": 0, "building": 1, "waiting for a GPU": 0, "on the GPU": 1, "done": 1}
    pipe.t0 = time.monotonic() - 1.0  # one second on two GPUs, one second of GPU work: half busy
    assert pipe.busy_share() == pytest.approx(0.5, rel=0.05)
    assert "GPU busy 50%" in pipe.line()


def test_gpus_free_while_the_only_tasks_left_are_building_make_the_builds_the_bottleneck(monkeypatch):
    """Two GPUs, a clock the test moves: a GPU counts as waiting for builds only while it has no
    task, no task waits for a GPU, and some build is queued or running."""
    import kernelwright.suites.pipeline as pl

    now = [100.0]
    monkeypatch.setattr(pl.time, "monotonic", lambda: now[0])
    pipe = Pipeline(gpus=2)
    for key in "abcd":
        pipe.queued(key, "build queued")  # the suite's start: every candidate builds, both GPUs free
    now[0] += 10.0
    pipe.stage("a", "built")
    pipe.stage("a", "startup")  # one GPU at work, one free, b to d still building: 10 x 2 + 5 x 1
    now[0] += 5.0
    pipe.stage("b", "built")  # waiting for a GPU: nothing starves while a task is ready
    now[0] += 5.0
    pipe.stage("b", "correctness")
    pipe.stage("c", "building")  # two GPUs at work: no GPU free
    now[0] += 20.0
    pipe.done("a")
    pipe.done("b")
    pipe.stage("c", "built")
    pipe.stage("c", "timing")
    pipe.stage("d", "built")
    pipe.stage("d", "timing")
    now[0] += 10.0
    pipe.done("c")
    pipe.done("d")
    assert pipe.starved_s == pytest.approx(25.0)
    assert pipe.starved_share() == pytest.approx(25.0 / (50.0 * 2))
    line = pipe.bottleneck()
    assert line.startswith("builds were the bottleneck") and "25%" in line and "--build-workers" in line
    quick = Pipeline(gpus=2)  # builds done before the GPUs were free: no line
    quick.queued("a")
    now[0] += 30.0
    quick.done("a")
    assert quick.starved_s == 0.0 and quick.bottleneck() == ""


def test_evaluations_that_wait_for_their_spares_are_named_as_the_bottleneck(monkeypatch):
    """A GPU worker whose spares are never seen ready: every evaluation waits 30 s, then runs 5 s;
    the suite's closing line says so. Each GPU's first wait is its first spare starting up alone,
    on the path by design: left out."""
    import kernelwright.suites.pipeline as pl

    now = [100.0]
    monkeypatch.setattr(pl.time, "monotonic", lambda: now[0])

    def record(wait: float) -> SimpleNamespace:
        return SimpleNamespace(
            stage_times=SimpleNamespace(correctness_s=2.0, timing_s=2.0), metadata={"spare_wait_s": wait}
        )

    stuck = Pipeline(gpus=1)
    for key in "abcd":
        now[0] += 35.0
        stuck.done(key, record(30.0))
    waited, share = stuck.spare_wait_share()
    assert waited == pytest.approx(90.0) and share == pytest.approx(90.0 / 140.0)
    line = stuck.bottleneck()
    assert "waited for a spare still starting up 64%" in line and "spare_wait_s" in line, line
    assert not line.startswith("builds")  # no build held it back
    warm = Pipeline(gpus=2)  # each GPU's first spare took 9 s; every later one was ready
    for key, wait in zip("abcdef", [9.0, 8.5, 0.0, 0.0, 0.0, 0.2], strict=True):
        now[0] += 3.0
        warm.done(key, record(wait))
    assert warm.spare_wait_share()[0] == pytest.approx(0.2) and warm.bottleneck() == ""
    bare = Pipeline(gpus=1)  # records without the field (the serial executor's): nothing waited
    now[0] += 5.0
    bare.done("a", SimpleNamespace(stage_times=SimpleNamespace(correctness_s=1.0, timing_s=1.0)))
    assert bare.spare_wait_share() == (0.0, 0.0)


def test_an_in_order_driver_counts_the_waits_it_measured():
    pipe = Pipeline(gpus=1)
    pipe.in_order = True
    pipe.queued("a", "build queued")
    pipe.queued("b", "build queued")
    pipe.waited_for_build(0.5)
    pipe.stage("a", "startup")
    assert pipe.starved_s == pytest.approx(0.5)  # the states alone add nothing in order


@pytest.mark.slow
def test_warm_pool_keeps_two_spares_and_hands_a_ready_one_over(cache_dir):
    cfg = _cpu(cache_dir)
    text = (CANDIDATES / "py_correct.py").read_text()
    with WarmPool(cfg, size=2) as pool:
        pool.prestart()
        deadline = time.monotonic() + 60
        while pool.spares() < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.spares() == 2
        for spare in list(pool._spares):  # they start up (python, torch) before the first candidate comes
            assert spare.wait_ready(120)  # (a fixed sleep was too short beside other tests on two cores)
        first = pool.evaluate(ADD_ONE, None, cfg, candidate_text=text)
        second = pool.evaluate(ADD_ONE, None, cfg, candidate_text=text)
        deadline = time.monotonic() + 60
        while pool.spares() < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.spares() == 2 and pool.started == 4  # refilled after each take
    assert first.status is Status.PASSED and second.status is Status.PASSED
    # the second evaluation's spare had started up while the first ran: it waited for its job
    assert second.metadata["prestarted"]["idle_s"] > 0.0, second.metadata["prestarted"]
    assert pool.spares() == 0  # closed: every spare stopped


@pytest.mark.slow
def test_local_executor_hands_the_prebuild_to_the_worker(cache_dir):
    """The driver's prebuild built the extension; the worker's evaluation starts no builder."""
    cfg = _cpu(cache_dir)
    trusted_builds.forget()
    stages: list[str] = []
    with LocalExecutor(cfg, gpus=["0"], build_workers=1) as ex:
        result = ex.submit(
            EvalTask(key="add_one/cpp", problem=ADD_ONE, candidate_text=CPP), on_stage=stages.append
        ).result(timeout=600)
    assert result.status is Status.PASSED, result.error_log
    assert result.metadata["executor"]["prebuild"]["ok"]
    assert result.metadata["trusted_build"].get("remembered") is True  # no builder in the worker
    assert stages[:3] == ["prebuild", "building", "built"] and "correctness" in stages
    # without the hand-over (a fresh process that has learned nothing), a builder would run
    assert replace(cfg).build.trusted_cache


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client")
def test_suite_optimize_on_two_fake_gpus_runs_two_problems_at_once(tmp_path, cache_dir, monkeypatch):
    """`suite optimize --executor local --gpus 0,1`: the two problems run at once, each evaluation
    placed on a GPU worker; the verdicts are the serial run's (tests/test_suite_optimize.py)."""
    from helpers import suite_models
    from helpers.chat_server import ChatServer

    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with ChatServer({}, respond=suite_models.respond) as server:
        result = cli(
            "suite",
            "optimize",
            str(SUITE / "level1"),
            "--only",
            "1_add_one",
            "--only",
            "3_scale_shift",
            "--coder",
            suite_models.CODER,
            "--judge",
            suite_models.JUDGE,
            "--base-url",
            server.base_url,
            "--rounds",
            "2",
            "--device",
            "cpu",
            "--backend",
            "cpp",
            "--trials",
            "2",
            "--no-profile",
            "--retries",
            "1",
            "--executor",
            "local",
            "--gpus",
            "0,1",
            "--json",
            "--name",
            "opt2",
            "--out",
            str(tmp_path / "out"),
            "--store",
            str(tmp_path / "kw.db"),
        )
    summary = json.loads(result.stdout)
    assert sorted(summary["ran"]) == ["level1/1_add_one", "level1/3_scale_shift"] and summary["executor"] == "local"
    with open_store(tmp_path / "kw.db") as db:
        evs = db.evaluations(suite="opt2")
        assert db.store.integrity_check() == "ok"
    got = {(e["problem"], e["round_idx"], e["record"]["status"]) for e in evs}
    assert got == {
        ("1_add_one", 0, "incorrect"),
        ("1_add_one", 1, "passed"),
        ("3_scale_shift", 0, "runtime_error"),
        ("3_scale_shift", 1, "passed"),
    }
    placed = [e["record"]["metadata"]["executor"] for e in evs]
    assert all(p["kind"] == "local" for p in placed) and {p["gpu"] for p in placed} <= {"0", "1"}


def test_spares_are_paused_while_an_evaluation_is_timed_where_cores_are_scarce(cache_dir):
    """No cores of their own (as on a 2-core machine): the spares still starting up are stopped
    (SIGSTOP) while the evaluation is timed, and resumed after."""
    from kernelwright.engine.process import process_tree

    cfg = _cpu(cache_dir)
    seen: list[set[str]] = []

    def states(pool) -> set[str]:
        out = set()
        for spare in list(pool._spares):
            for pid, _ in process_tree(spare.runner.proc.pid):
                try:
                    out.add(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
        return out

    text = (CANDIDATES / "py_correct.py").read_text()
    with WarmPool(cfg, size=1) as pool:
        assert pool.pause_while_timing  # no startup cores given
        pool.prestart()
        # two evaluations first, the pool refilled after each: the spare started while the third is
        # timed is then in the pool to be seen. In a process's first evaluations a spare waits for
        # its zygotes (the second runner zygote's start, the judge zygote's one warm-up), and one
        # still being asked for is not in the pool yet (it is paused as it joins: `_start_spares`)
        for _ in range(2):
            assert pool.evaluate(ADD_ONE, None, cfg, candidate_text=text).status is Status.PASSED
            with pool._cv:
                assert pool._cv.wait_for(lambda: pool._spares, timeout=120)
            time.sleep(1.0)

        def on_stage(s: str) -> None:
            if s == "timing":
                time.sleep(0.3)  # a signal is delivered asynchronously
                seen.append(states(pool))

        result = pool.evaluate(ADD_ONE, None, cfg, candidate_text=text, on_stage=on_stage)
        after = states(pool)
    assert result.status is Status.PASSED
    assert pool.pauses == 3 and seen and seen[0] == {"T"}  # every process of the spare stopped while timed
    assert "T" not in after  # resumed once the timing ended


def test_a_pool_whose_spares_cannot_start_does_not_hold_evaluations_back(cache_dir, monkeypatch):
    """prestart raising EngineError (say, a sandbox that went missing): each evaluation starts its
    own child at once instead of waiting for a spare that never comes."""
    from kernelwright.engine import EngineError, evaluation

    def broken(config=None):
        raise EngineError("no spare today")

    monkeypatch.setattr(evaluation, "prestart", broken)
    cfg = _cpu(cache_dir)
    with WarmPool(cfg, size=2) as pool:
        pool.prestart()
        time.sleep(0.5)
        t0 = time.monotonic()
        assert pool._take() is None
        assert time.monotonic() - t0 < 5


@pytest.mark.gpu
@pytest.mark.parametrize("worker", [False, True], ids=["in-process", "gpu-worker"])
def test_on_the_gpu_each_evaluation_after_the_first_gets_a_spare_that_was_ready(
    tmp_path, cache_dir, monkeypatch, worker
):
    """The issue's finding was a spare idle 0.0 s (never ready before its job): with two warm
    spares, every evaluation after the first finds one that waited for it. Through a GPU worker
    (`--gpus`: its first spare starts up alone), no evaluation after the first waits for a spare:
    a judge ready after its runner once left each one waiting 30 s for a spare started long before."""
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    # the first GPU this test was given (--gpus takes CUDA_VISIBLE_DEVICES' own entries)
    gpus = ["--gpus", (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]] if worker else []
    problems, cands = tmp_path / "level1", tmp_path / "cands"
    problems.mkdir()
    cands.mkdir()
    for i in range(1, 5):
        shutil.copy(ADD_ONE, problems / f"{i}_add_one.py")
        shutil.copy(CANDIDATES / "py_correct.py", cands / f"{i}_add_one.py")
    result = cli(
        "suite",
        "eval",
        str(problems),
        str(cands),
        "--device",
        "cuda",
        "--json",
        "--name",
        "gpu-pipe",
        "--out",
        str(tmp_path / "out"),
        "--store",
        str(tmp_path / "kw.db"),
        *gpus,
    )
    assert json.loads(result.stdout)["metrics"]["correct"] == 4
    with open_store(tmp_path / "kw.db") as db:
        records = sorted(
            (e["record"] for e in db.evaluations(suite="gpu-pipe")), key=lambda r: r["metadata"]["executor"]["queued_s"]
        )
    assert all(r["stage_times"]["profile_s"] is None for r in records)  # no evidence stage
    if not gpus:  # a worker's spares start one after another (the first alone): not always ready in time
        assert all((r["metadata"].get("prestarted") or {}).get("idle_s", 0) > 0 for r in records[1:]), [
            r["metadata"].get("prestarted") for r in records
        ]
    assert all(r["metadata"].get("spare_wait_s", 0) < 5 for r in records[1:]), [
        r["metadata"].get("spare_wait_s") for r in records
    ]


def test_a_nested_setting_counts_as_given(tmp_path):
    """`[eval.profile] roofline = true` in the settings file keeps the roofline on where no
    --profile is given (eval and suite eval turn it off only when nobody asked for it)."""
    from kernelwright.core.settings_file import load_settings

    f = tmp_path / "kw.toml"
    f.write_text("[eval.profile]\nroofline = true\n")
    s = load_settings(f, search=False)
    assert s.given("eval.profile.roofline") and s.given("eval.profile") and not s.given("eval.profile.enabled")
    assert not load_settings(None, search=False).given("eval.profile.roofline")
