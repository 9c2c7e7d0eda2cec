"""Every GPU of this machine: `LocalExecutor(config, gpus=["0", "1"])`.

    submit(task) -> prebuild on the CPU pool (BuildPool: CPU-only children fill the build cache)
                 -> queued for the first free GPU worker -> evaluated there -> Future[EvalResult]

A **worker** here is a process (`executors.worker`), one per GPU, started with
`CUDA_VISIBLE_DEVICES` set to its GPU; it keeps one `engine.WarmEvaluator`, so each candidate is
still evaluated in its own fresh, isolated child, pinned to that GPU (`EvalConfig.visible_devices`).
One thread per worker here hands it tasks and reads its stages and results.

A worker that dies (its process killed; a candidate's crash is the child's, and is a verdict)
is replaced by a fresh process, the children it left running are killed (`orphans`), and its task
is run once more on another worker (the same GPU's fresh worker when there is only one). The
retry is recorded in `result.metadata["executor"]`; a task whose retry dies too resolves with
`WorkerLost`. Every submitted task resolves exactly once.

Timing stays honest (`placement`): one evaluation per GPU at a time; the GPU workers' own cores
are kept free of builds where the machine has cores to spare, else new builds wait while any
GPU is in its timing stage.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import kernelwright
from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult
from kernelwright.engine import EngineError
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.executors import orphans
from kernelwright.executors.dispatch import Job, SlotQueue, safe_stage
from kernelwright.executors.interface import WORKER_RETRIES, EvalTask, Interrupted, WorkerLost
from kernelwright.executors.placement import (
    CorePlan,
    TimingGate,
    default_build_workers,
    detect_gpus,
    plan_cores,
    refuse_unseen,
)


class _Worker:
    """One worker process, pinned to one GPU (and to its cores, when it has its own)."""

    def __init__(
        self,
        slot: int,
        gpu: str | None,
        config: EvalConfig,
        cpus: set[int] | None,
        spares: int = 2,
        startup_cpus: set[int] | None = None,
    ):
        self.tag = f"{os.getpid()}-{slot}-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ)
        root = str(Path(kernelwright.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[orphans.TAG_VAR] = self.tag
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "kernelwright.executors.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes (above)
        self._to_worker: IO[str] = self.proc.stdin
        self._from_worker: IO[str] = self.proc.stdout
        if cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(self.proc.pid, cpus)  # before its first child: they inherit it
            except OSError:
                pass
        self.name = f"gpu{gpu if gpu is not None else '-'}/pid{self.proc.pid}"
        self.send(
            {
                "config": config.to_dict(),
                "spares": spares,
                "startup_cpus": sorted(startup_cpus) if cpus and startup_cpus else None,
                "home_cpus": sorted(cpus) if cpus and startup_cpus else None,
            }
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, msg: dict[str, Any]) -> bool:
        try:
            self._to_worker.write(json.dumps(msg) + "\n")
            self._to_worker.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def read(self) -> dict[str, Any] | None:
        """The next message; None when the worker is gone."""
        while True:
            try:
                line = self._from_worker.readline()
            except (OSError, ValueError):
                return None
            if not line:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue

    def reap(self) -> str:
        """After a death: wait for the process, kill what it left running; how it ended, in words."""
        from kernelwright.engine.process import describe_signal

        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        left = orphans.kill_tagged(self.tag)
        return describe_signal(code) + (f"; {len(left)} orphaned process(es) killed" if left else "")

    def stop(self) -> None:
        try:
            self._to_worker.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        orphans.kill_tagged(self.tag)


@dataclass
class _Slot:
    index: int
    gpu: str | None
    cpus: set[int] | None
    worker: _Worker | None = None
    thread: threading.Thread | None = None


class LocalExecutor(SlotQueue):
    """One evaluation worker per GPU of this machine, and a CPU pool that builds ahead.

    `gpus`: CUDA_VISIBLE_DEVICES entries, one worker each (None: every visible GPU; none visible,
    e.g. `device="cpu"`: one unpinned worker). `build_workers`: concurrent prebuilds (0: none; None:
    sized to the machine, `placement.default_build_workers`). `cores_per_gpu`: cores kept for each
    GPU worker when the machine has enough. `spares`: warm evaluations kept ready per GPU worker
    (`warm_pool.WarmPool`; they start up on the build cores where there are some).
    """

    kind = "local"

    def __init__(
        self,
        config: EvalConfig | None = None,
        gpus: list[str] | None = None,
        build_workers: int | None = None,
        cores_per_gpu: int = 2,
        plan: CorePlan | None = None,
        spares: int = 2,
    ):
        self.config = resolve_config(config or EvalConfig())  # "auto" made concrete once, for every worker
        if gpus is None:
            gpus = detect_gpus() if self.config.device != "cpu" else []
        elif self.config.device != "cpu":  # (on the CPU, --gpus names slots that share its cores)
            refuse_unseen(gpus)
        slots: list[str | None] = list(gpus) or [None]
        self.plan = plan or plan_cores(len(slots), cores_per_gpu)
        self.gate = TimingGate(active=self.plan.scarce)
        self.host = socket.gethostname()
        self._slots = [
            _Slot(i, g, self.plan.workers[i] if i < len(self.plan.workers) else None) for i, g in enumerate(slots)
        ]
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._inflight = 0
        self._running: dict[str, tuple[int, int, str]] = {}  # key -> (slot, worker pid, worker tag)
        self._closing = False
        self._closed = False
        self._builds = None
        self.spares = spares
        n_builds = default_build_workers(self.plan) if build_workers is None else build_workers
        if n_builds > 0:
            from kernelwright.engine.extensions.prebuild import BuildPool

            bcfg = self.config
            if self.plan.builds:  # builds have cores of their own: share them out
                bcfg = replace(bcfg, build=replace(bcfg.build, max_jobs=max(1, len(self.plan.builds) // n_builds)))
            self._builds = BuildPool(n_builds, bcfg, cpus=self.plan.builds, before=self.gate.wait_clear)
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._serve, args=(slot,), name=f"kw-gpu-{slot.gpu}", daemon=True)
            slot.thread.start()

    @property
    def gpus(self) -> list[str | None]:
        return [s.gpu for s in self._slots]

    # -- the Executor interface --
    def submit(self, task: EvalTask, on_stage: Callable[[str], None] | None = None) -> cf.Future[EvalResult]:
        if self._closing:
            raise RuntimeError("this executor is closed; submit before close()")
        fut: cf.Future[EvalResult] = cf.Future()
        fut.set_running_or_notify_cancel()
        job = Job(task, fut, on_stage)
        same_cache = task.config is None or task.config.cache_dir == self.config.cache_dir
        with self._cv:
            self._queue.append(job)
        if self._builds is not None and same_cache:
            if on_stage:
                safe_stage(on_stage, "prebuild")
            self._builds.submit(
                task.problem, task.candidate_text, on_start=functools.partial(self._building, job)
            ).add_done_callback(functools.partial(self._built, job))
        else:
            self._mark_ready(job, None)
        return fut

    def close(self, cancel: bool = False) -> None:
        """Wait for everything submitted, then stop the workers and the build pool. `cancel`
        (Ctrl-C): queued tasks never start, running ones are stopped with their worker (its
        evaluation's processes go with it), and each resolves with `Interrupted`."""
        if self._closed:
            return
        if cancel:
            self._cancel()
            for slot in self._slots:
                if slot.worker is not None and slot.worker.alive():
                    slot.worker.proc.kill()  # its `_run` sees the worker gone and gives the task up
        self._drain()
        for slot in self._slots:
            if slot.worker is not None:
                slot.worker.stop()
                slot.worker = None
        if self._builds is not None:
            self._builds.shutdown(wait=not cancel)
        self._closed = True

    # -- for tests and benchmarks --
    def running(self) -> dict[str, tuple[int, int, str]]:
        """What runs now: task key -> (GPU slot, worker pid, worker tag)."""
        with self._cv:
            return dict(self._running)

    # -- queue --
    def _building(self, job: Job) -> None:
        job.build_began = time.monotonic()
        if job.on_stage:
            safe_stage(job.on_stage, "building")

    def _built(self, job: Job, fut: cf.Future) -> None:
        try:
            pre = fut.result()
            summary = {"ok": pre.ok, "wall_s": round(pre.wall_s, 3), "build_s": pre.build_s, "error": pre.error or None}
            job.memo = pre.memo
        except BaseException as exc:  # a prebuild is best effort: the evaluation builds and judges
            summary = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if job.build_began is not None:  # how long it waited for a builder (the builds ahead of it)
            summary["waited_s"] = round(job.build_began - job.submitted, 3)
            to_wall = time.time() - time.monotonic()
            summary["span"] = [round(job.build_began + to_wall, 3), round(time.monotonic() + to_wall, 3)]
        if job.on_stage:
            safe_stage(job.on_stage, "built")
        self._mark_ready(job, summary)

    # -- the slot's worker --
    def _warm_up(self, slot: _Slot) -> None:
        """The worker, started with the executor: its python, torch and first spares start up while
        the driver reads its problems and the first builds run, not on the first task's path."""
        with self._cv:
            if self._closing:
                return
        self._worker(slot)

    def _worker(self, slot: _Slot) -> _Worker:
        """The slot's live worker, started (again, after a death) where there is none."""
        if slot.worker is None or not slot.worker.alive():
            if slot.worker is not None:
                slot.worker.reap()
            slot.worker = _Worker(
                slot.index, slot.gpu, self._pinned(self.config, slot), slot.cpus, self.spares, self.plan.builds
            )
        return slot.worker

    # -- one attempt of one task on one worker --
    def _run(self, slot: _Slot, job: Job) -> None:
        job.attempts += 1
        cfg = self._pinned(job.task.config or self.config, slot)
        worker = self._worker(slot)
        t = job.task
        with self._cv:
            self._running[t.key] = (slot.index, worker.pid, worker.tag)
        sent = worker.send(
            {
                "key": t.key,
                "problem": str(Path(t.problem).resolve()),
                "candidate_text": t.candidate_text,
                "config": cfg.to_dict(),
                "report_dir": str(t.report_dir) if t.report_dir else None,
                "trusted_memo": job.memo,
            }
        )
        stage, timing, started = "startup", False, time.monotonic()
        try:
            while sent:
                msg = worker.read()
                if msg is None:
                    break
                if "stage" in msg:
                    stage = str(msg["stage"])
                    if stage == "timing" and not timing:
                        self.gate.enter()
                        timing = True
                    elif timing and stage != "timing":
                        self.gate.leave()
                        timing = False
                    if job.on_stage:
                        safe_stage(job.on_stage, stage)
                elif "result" in msg:
                    result = EvalResult.from_dict(msg["result"])
                    result.metadata["executor"] = self._placement(slot, worker, job, started)
                    job.future.set_result(result)
                    return
                elif "engine_error" in msg:
                    job.future.set_exception(EngineError(msg["engine_error"]))
                    return
        finally:
            if timing:
                self.gate.leave()
            with self._cv:
                self._running.pop(t.key, None)
        # the worker is gone mid-task
        how = worker.reap()
        slot.worker = None
        if self._cancelled:
            job.future.set_exception(Interrupted(f"{t.key}: interrupted during stage '{stage}'"))
            return
        note = f"worker {worker.name} on {self.host} {how} during stage '{stage}'"
        if job.attempts > WORKER_RETRIES:
            job.future.set_exception(
                WorkerLost(
                    f"{t.key}: {note}, after a retry ({'; '.join(job.retried_after)}); the task was not evaluated"
                )
            )
            return
        job.retried_after.append(note)
        job.avoid.add(slot.index)
        with self._cv:
            self._queue.insert(0, job)  # first in line for another worker
            self._cv.notify_all()

    def _pinned(self, cfg: EvalConfig, slot: _Slot) -> EvalConfig:
        pass_env = cfg.pass_env if orphans.TAG_VAR in cfg.pass_env else (*cfg.pass_env, orphans.TAG_VAR)
        return replace(cfg, visible_devices=slot.gpu, pass_env=pass_env)

    def _placement(self, slot: _Slot, worker: _Worker, job: Job, started: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "gpu": slot.gpu,
            "worker": worker.name,
            "attempts": job.attempts,
            "retried_after": list(job.retried_after) or None,
            "cpus": sorted(slot.cpus) if slot.cpus else None,
            "prebuild": job.prebuild,
            "queued_s": round(started - job.submitted, 3),
            "wall_s": round(time.monotonic() - started, 3),
        }
