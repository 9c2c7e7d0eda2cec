"""The executor interface: evaluation tasks in, futures of records out.

    with SerialExecutor(config) as ex:
        fut = ex.submit(EvalTask(key="add_one/abc123", problem=path, candidate_text=code))
        result = fut.result()          # an EvalResult; never raises for anything the candidate does

An executor decides where a task runs (this process's engine, one worker per GPU, a Ray cluster)
and nothing else: every task is still evaluated by `kernelwright.engine.evaluate` in a fresh,
isolated child. `submit` returns at once; `close` waits for what was submitted and stops workers.
A task that the engine cannot run at all (an `EngineError`) resolves its future with that error.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult
from kernelwright.engine import EngineError
from kernelwright.engine.config_resolution import resolve_config

# A task whose worker dies (process killed, node lost) is run again elsewhere this many times.
WORKER_RETRIES = 1


class WorkerLost(EngineError):
    """A task's worker died on every attempt (the first and its retry): no verdict on the candidate."""


@dataclass(frozen=True)
class EvalTask:
    """One evaluation: a candidate's text against a problem file, under a configuration.

    `key` names the task in its batch (e.g. problem name + candidate hash); `config` None means the
    executor's own; `report_dir` receives raw profiler files; `tags` is carried through untouched.
    """

    key: str
    problem: Path
    candidate_text: str
    config: EvalConfig | None = None
    report_dir: Path | None = None
    tags: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Executor(Protocol):
    """`submit` returns at once; the future resolves to the task's record, or raises `EngineError`
    (the task cannot run) or `WorkerLost`. Executors that place work record it in
    `result.metadata["executor"]`: kind, host, gpu, worker, attempts, retried_after."""

    def submit(self, task: EvalTask, on_stage: Callable[[str], None] | None = None) -> cf.Future[EvalResult]: ...

    def close(self, cancel: bool = False) -> None:
        """Wait for everything submitted, then stop; `cancel` (Ctrl-C): stop at once, the tasks
        not yet done resolve with `Interrupted`."""
        ...


class Interrupted(Exception):
    """A task the executor was closed with `cancel=True` before it had finished."""


class SerialExecutor:
    """Evaluates each task when it is submitted, in this machine's engine, keeping a child warm."""

    def __init__(self, config: EvalConfig | None = None, warm: bool = True):
        import threading

        from kernelwright.engine import WarmEvaluator

        self.config = resolve_config(config or EvalConfig())  # "auto" made concrete once (engine/config_resolution.py)
        self._warm = WarmEvaluator(self.config, keep_warm=warm)
        self._lock = threading.Lock()  # submits from several threads take turns

    def submit(self, task: EvalTask, on_stage: Callable[[str], None] | None = None) -> cf.Future[EvalResult]:
        fut: cf.Future[EvalResult] = cf.Future()
        fut.set_running_or_notify_cancel()
        try:
            with self._lock:
                result = run_task(self._warm.evaluate, task, self.config, on_stage)
            result.metadata["executor"] = placement("serial", (task.config or self.config).visible_devices)
            fut.set_result(result)
        except BaseException as exc:  # EngineError (the task cannot run), or an interrupt
            fut.set_exception(exc)
            if isinstance(exc, KeyboardInterrupt):
                raise
        return fut

    def close(self, cancel: bool = False) -> None:
        self._warm.close()  # its tasks ran in submit(): nothing is left to cancel

    def __enter__(self) -> SerialExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_task(
    evaluate: Callable[..., EvalResult],
    task: EvalTask,
    default: EvalConfig,
    on_stage: Callable[[str], None] | None = None,
) -> EvalResult:
    """Run one task through an `evaluate`-like callable (engine.evaluate or WarmEvaluator.evaluate)."""
    from dataclasses import replace

    from kernelwright.core.record import Stage, Status

    cfg = task.config or default
    if task.report_dir is not None and cfg.profile.enabled:
        cfg = replace(cfg, profile=replace(cfg.profile, report_dir=str(task.report_dir)))
    result = evaluate(task.problem, None, cfg, candidate_text=task.candidate_text, on_stage=on_stage)
    if result.status is Status.CRASHED and result.error_stage is Stage.STARTUP:
        # the child died before the candidate was imported: the machine's fault, not the candidate's
        # (seen rarely on a loaded machine); evaluated once more, and the record says so
        first = result.error_log.strip().splitlines()[0] if result.error_log.strip() else "crashed in start-up"
        result = evaluate(task.problem, None, cfg, candidate_text=task.candidate_text, on_stage=on_stage)
        result.metadata["retried_after"] = first
    return result


def placement(kind: str, gpu: str | None, **more: Any) -> dict[str, Any]:
    """`metadata["executor"]` of a record evaluated in this process's engine, one attempt."""
    import os
    import socket

    return {
        "kind": kind,
        "host": socket.gethostname(),
        "gpu": gpu or os.environ.get("CUDA_VISIBLE_DEVICES"),
        "worker": f"pid{os.getpid()}",
        "attempts": 1,
        "retried_after": None,
        **more,
    }
