"""A Ray cluster: `RayExecutor(config, address="ray://head:10001")` (None: a local Ray, started on demand).

    submit(task) -> a build as a CPU task (`num_cpus=1`: a CPU-only child fills that node's build
                    cache) -> the first free evaluation actor (`num_gpus=1`, one per GPU of the
                    cluster) -> Future[EvalResult] on the driver, profiler files copied back

A **worker** here is a Ray actor: one per GPU, holding an `engine.WarmEvaluator`; Ray pins it to
its GPU (`CUDA_VISIBLE_DEVICES`, which it hands on to its children as `EvalConfig.visible_devices`),
and each evaluation still runs in the engine's own fresh child, with the engine's scrubbed
environment. An actor runs one evaluation at a time, so two timed evaluations never share a GPU.
The problem and the candidate travel as text, so the driver's files need not exist on the nodes.

A worker that dies (`ray.kill`, its process killed, its node lost) is replaced by a new actor,
the children it left running on its node are killed (best effort: a lost node took them along),
and its task is run once more on another actor; the retry is recorded in
`result.metadata["executor"]`, and a task whose retry dies too resolves with `WorkerLost`.

Builds help only where the evaluation finds them: on one node, or with `cache_dir` on a file
system all nodes share. Elsewhere the evaluation builds again (correct, slower).

Ray is an optional extra: without it, constructing this executor raises a one-line `EngineError`
that says `pip install 'kernelwright[ray]'`.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult
from kernelwright.engine import EngineError
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.executors import orphans
from kernelwright.executors.dispatch import Job, SlotQueue, safe_stage
from kernelwright.executors.interface import WORKER_RETRIES, EvalTask, WorkerLost
from kernelwright.executors.placement import TimingGate

INSTALL_HINT = "--executor ray needs Ray, which is not installed; install it with: pip install 'kernelwright[ray]'"
MAX_ARTEFACT_BYTES = 256 << 20  # profiler files copied back per evaluation


def import_ray():
    try:
        import ray
    except ImportError:
        raise EngineError(INSTALL_HINT) from None
    return ray


# ---- what runs on the cluster ----------------------------------------------------------------


class EvalActor:
    """One GPU's evaluation worker (decorated with `ray.remote` by `RayExecutor`)."""

    def __init__(self, config: dict[str, Any], tag: str):
        import ray

        from kernelwright.engine import WarmEvaluator

        os.environ[orphans.TAG_VAR] = tag  # handed to every child (pass_env), so a dead actor's are found
        self.gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or None  # Ray's choice for this actor
        self.config = self._pin(EvalConfig.from_dict(config))
        self.warm = WarmEvaluator(self.config)
        self.info = {
            "host": socket.gethostname(),
            "gpu": self.gpu,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }
        try:
            self.warm.prestart()
        except EngineError:
            pass

    def _pin(self, cfg: EvalConfig) -> EvalConfig:
        pass_env = cfg.pass_env if orphans.TAG_VAR in cfg.pass_env else (*cfg.pass_env, orphans.TAG_VAR)
        return replace(cfg, visible_devices=self.gpu, pass_env=pass_env)

    def where(self) -> dict[str, Any]:
        return self.info

    def evaluate(self, job: dict[str, Any]):
        """A generator: {"stage": ...} for each stage, then {"result": ..., "files": ...} or {"engine_error": ...}."""
        from kernelwright.executors.interface import run_task

        work = Path(tempfile.mkdtemp(prefix="kw-ray-"))
        try:
            problem = work / job["problem_name"]
            problem.write_text(job["problem_text"])
            report = work / "report" if job.get("report_dir") else None
            cfg = self._pin(EvalConfig.from_dict(job["config"]))
            task = EvalTask(
                key=job["key"], problem=problem, candidate_text=job["candidate_text"], config=cfg, report_dir=report
            )
            stages: queue.Queue = queue.Queue()

            def run() -> None:
                try:
                    result = run_task(self.warm.evaluate, task, self.config, lambda s: stages.put({"stage": s}))
                    stages.put({"result": result.to_dict(), "files": _collect(report)})
                except EngineError as exc:
                    stages.put({"engine_error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
                except BaseException as exc:
                    stages.put({"engine_error": f"{type(exc).__name__}: {exc}"})

            threading.Thread(target=run, daemon=True).start()
            while True:
                msg = stages.get()
                yield msg
                if "stage" not in msg:
                    return
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _collect(report: Path | None) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    if report is None or not report.is_dir():
        return files
    for path in sorted(report.rglob("*")):
        if path.is_file():
            total += path.stat().st_size
            if total > MAX_ARTEFACT_BYTES:
                break
            files[str(path.relative_to(report))] = path.read_bytes()
    return files


def ray_prebuild(
    problem_name: str, problem_text: str, candidate_text: str, config: dict[str, Any], arch_list: str | None
) -> dict[str, Any]:
    """A build as a CPU task: fills this node's build cache; a summary for the record."""
    from kernelwright.engine.extensions.prebuild import prebuild

    work = Path(tempfile.mkdtemp(prefix="kw-ray-build-"))
    try:
        problem = work / problem_name
        problem.write_text(problem_text)
        pre = prebuild(problem, candidate_text, EvalConfig.from_dict(config), arch_list)
        return {
            "ok": pre.ok,
            "wall_s": round(pre.wall_s, 3),
            "build_s": pre.build_s,
            "error": pre.error or None,
            "host": socket.gethostname(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ray_reap(tag: str) -> list[int]:
    return orphans.kill_tagged(tag)


# ---- the driver ------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    actor: Any = None
    tag: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    thread: threading.Thread | None = None


class RayExecutor(SlotQueue):
    """One evaluation actor per GPU of a Ray cluster, builds as CPU tasks.

    `address`: an existing cluster (`ray://...` or `auto`); None starts a local Ray, unless this
    process already joined one. `workers`: number of actors (None: one per GPU the cluster has;
    on a CPU evaluation with no GPU in the cluster, one). `build`: prebuild each candidate first.
    """

    kind = "ray"

    def __init__(
        self,
        config: EvalConfig | None = None,
        address: str | None = None,
        workers: int | None = None,
        build: bool = True,
        gpus_per_worker: float = 1.0,
    ):
        ray = self.ray = import_ray()
        self.config = resolve_config(config or EvalConfig())  # on the driver: every node runs what it chose
        self._owns_ray = False
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, runtime_env=_runtime_env())
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise EngineError(
                    f"cannot reach the Ray cluster at {address or 'a new local Ray'} "
                    f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                    "check --ray-address"
                ) from None
            self._owns_ray = True
        resources = ray.cluster_resources()
        n_gpus = int(resources.get("GPU", 0))
        self.gpus_per_worker = gpus_per_worker if n_gpus else 0.0
        if self.config.device == "cuda" and not n_gpus:
            raise EngineError(
                "--executor ray with --device cuda, but the Ray cluster has no GPU; add GPU nodes or use --device cpu"
            )
        n = workers or max(1, int(n_gpus // gpus_per_worker) if n_gpus else 1)
        self.gate = TimingGate(active=resources.get("CPU", 0) < 2 * n + 2)  # a small cluster: builds wait for timing
        self._actor_cls = ray.remote(num_cpus=0, num_gpus=self.gpus_per_worker, max_restarts=0)(EvalActor)
        self._build = ray.remote(num_cpus=1, num_gpus=0)(ray_prebuild) if build else None
        self._reap = ray.remote(num_cpus=0)(ray_reap)
        self._arch = None
        if build and self.config.device != "cpu":
            from kernelwright.engine.extensions.build_arch import detect_arch_list

            self._arch = detect_arch_list()
        self._builds = (
            cf.ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="kw-ray-build") if build else None
        )
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._inflight = 0
        self._running: dict[str, int] = {}  # task key -> actor slot
        self._closing = self._closed = False
        self._slots = [_Slot(i) for i in range(n)]
        for slot in self._slots:
            self._start_actor(slot)
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._serve, args=(slot,), name=f"kw-ray-{slot.index}", daemon=True)
            slot.thread.start()

    @property
    def workers(self) -> int:
        return len(self._slots)

    # -- the Executor interface --
    def submit(self, task: EvalTask, on_stage: Callable[[str], None] | None = None) -> cf.Future[EvalResult]:
        if self._closing:
            raise RuntimeError("this executor is closed; submit before close()")
        fut: cf.Future[EvalResult] = cf.Future()
        fut.set_running_or_notify_cancel()
        job = Job(task, fut, on_stage)
        with self._cv:
            self._queue.append(job)
        if self._builds is not None:
            if on_stage:
                safe_stage(on_stage, "prebuild")
            self._builds.submit(self._prebuild, job)
        else:
            self._mark_ready(job, None)
        return fut

    def close(self, cancel: bool = False) -> None:
        if self._closed:
            return
        if cancel:  # Ctrl-C: nothing queued starts; the actors (and what they run) are killed below
            self._cancel()
            for slot in self._slots:
                if slot.actor is not None:
                    try:
                        self.ray.kill(slot.actor)
                    except Exception:
                        pass
        self._drain()
        if self._builds is not None:
            self._builds.shutdown(wait=not cancel, cancel_futures=cancel)
        for slot in self._slots:
            if slot.actor is not None:
                try:
                    self.ray.kill(slot.actor)  # its spare child goes with it (bwrap), or is reaped:
                    self._reap_on(slot)
                except Exception:
                    pass
        if self._owns_ray:
            self.ray.shutdown()
        self._closed = True

    # -- for tests and benchmarks --
    def running(self) -> dict[str, int]:
        """What runs now: task key -> actor slot."""
        with self._cv:
            return dict(self._running)

    def actor(self, index: int):
        return self._slots[index].actor

    def placement(self, index: int) -> dict[str, Any]:
        return dict(self._slots[index].info)

    # -- builds --
    def _prebuild(self, job: Job) -> None:
        summary = None
        began = None
        try:
            self.gate.wait_clear()
            began = time.monotonic()
            if job.on_stage:
                safe_stage(job.on_stage, "building")
            t = job.task
            cfg = (t.config or self.config).to_dict()
            build = self._build
            assert build is not None, "prebuilds are submitted only with builds on"
            summary = self.ray.get(
                build.remote(Path(t.problem).name, Path(t.problem).read_text(), t.candidate_text, cfg, self._arch)
            )
        except Exception as exc:  # best effort: the evaluation builds and judges
            summary = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        finally:
            if isinstance(summary, dict) and began is not None:  # its wait for a builder (suites/accounting.py)
                summary["waited_s"] = round(began - job.submitted, 3)
            if job.on_stage:
                safe_stage(job.on_stage, "built")
            self._mark_ready(job, summary)

    # -- actors --
    def _start_actor(self, slot: _Slot) -> None:
        slot.tag = f"ray-{os.getpid()}-{slot.index}-{uuid.uuid4().hex[:8]}"
        slot.actor = self._actor_cls.remote(self.config.to_dict(), slot.tag)
        slot.info = self.ray.get(slot.actor.where.remote())

    def _reap_on(self, slot: _Slot) -> None:
        """Kill the children a dead actor left on its node (best effort: the node may be gone)."""
        node = slot.info.get("node")
        if not node:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            ref = self._reap.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                slot.tag
            )
            self.ray.get(ref, timeout=30)
        except Exception:
            pass

    # -- queue and dispatch --
    def _run(self, slot: _Slot, job: Job) -> None:
        from ray.exceptions import RayActorError, RayError, RayTaskError

        job.attempts += 1
        if slot.actor is None:
            self._start_actor(slot)
        t = job.task
        msg_job = {
            "key": t.key,
            "problem_name": Path(t.problem).name,
            "problem_text": Path(t.problem).read_text(),
            "candidate_text": t.candidate_text,
            "config": (t.config or self.config).to_dict(),
            "report_dir": str(t.report_dir) if t.report_dir else None,
        }
        stage, timing, started = "startup", False, time.monotonic()
        info = dict(slot.info)
        with self._cv:
            self._running[t.key] = slot.index
        try:
            for ref in slot.actor.evaluate.remote(msg_job):
                msg = self.ray.get(ref)
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
                    if t.report_dir is not None:
                        _write_files(Path(t.report_dir), msg.get("files") or {})
                    result.metadata["executor"] = {
                        "kind": self.kind,
                        "host": info.get("host"),
                        "gpu": info.get("gpu"),
                        "worker": f"actor{slot.index}/pid{info.get('pid')}",
                        "node": info.get("node"),
                        "attempts": job.attempts,
                        "retried_after": list(job.retried_after) or None,
                        "prebuild": job.prebuild,
                        "queued_s": round(started - job.submitted, 3),
                        "wall_s": round(time.monotonic() - started, 3),
                    }
                    job.future.set_result(result)
                    return
                elif "engine_error" in msg:
                    job.future.set_exception(EngineError(msg["engine_error"]))
                    return
            raise EngineError(f"{t.key}: the evaluation actor ended without a result")
        except RayTaskError as exc:  # our actor code raised: a bug, not a death
            job.future.set_exception(EngineError(f"{t.key}: evaluation actor failed: {str(exc).splitlines()[0]}"))
            return
        except (RayActorError, RayError) as exc:
            how = type(exc).__name__
        finally:
            if timing:
                self.gate.leave()
            with self._cv:
                self._running.pop(t.key, None)
        # the actor (or its node) is gone mid-task
        self._reap_on(slot)
        slot.actor = None
        note = (
            f"worker actor{slot.index}/pid{info.get('pid')} on {info.get('host')} (gpu {info.get('gpu')}) "
            f"died ({how}) during stage '{stage}'"
        )
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
            self._queue.insert(0, job)
            self._cv.notify_all()


def _runtime_env() -> dict[str, Any]:
    """Workers of a local Ray import this kernelwright (a source checkout need not be installed)."""
    import kernelwright

    root = str(Path(kernelwright.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {"env_vars": {"PYTHONPATH": root + (os.pathsep + path if path else "")}}


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        dest = (folder / rel).resolve()
        if folder.resolve() not in dest.parents:
            continue  # a name that climbs out of the report folder
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
