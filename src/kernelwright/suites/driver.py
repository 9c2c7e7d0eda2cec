"""Running a suite: every problem evaluated (`run_eval_suite`) or optimised (`run_optimize_suite`),
each into its own run directory under the suite's folder, each indexed into the store as it ends.

    OUT/level1/19_ReLU/      one run directory per problem (the layout `kernelwright optimize` writes)
    STORE                    the run store: the suite, its runs, rounds, evaluations, model calls

A rerun of the same suite skips the problems that are finished and continues the ones that were
cut off (an optimize run resumes after its last finished round; an evaluation is done again).
Evaluations go through an `Executor` (`submit(task) -> Future[EvalResult]`, `close()`). With the
serial one, builds of queued candidates run ahead on the CPU in a `BuildPool` while it evaluates;
with the local or Ray one, every candidate is submitted at once and the executor builds ahead and
places each on a GPU (`suites/pipeline.py` follows where each one is). A suite optimize runs
`parallel` problems at once, each with its own store connection.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelwright.core import run_files
from kernelwright.core.config import EvalConfig, LoopConfig
from kernelwright.core.record import EvalResult, RoundVerdict, Stage, Status
from kernelwright.executors.interface import EvalTask, Executor, SerialExecutor
from kernelwright.loop.history import Progress as LoopProgress
from kernelwright.loop.history import Round, RunState
from kernelwright.store.db import Store, now
from kernelwright.store.indexer import code_hash, finished_rounds, index_run
from kernelwright.store.recorder import IndexingRecorder
from kernelwright.store.rundir import RunDir
from kernelwright.suites.discovery import Candidate, Problem
from kernelwright.suites.pipeline import Pipeline

UNFINISHED = ("coder failed", "error", "interrupted")  # stop reasons a rerun continues


class SuiteProgress(Protocol):
    def start(self, total: int, already_done: int) -> None: ...

    def stage(self, problem: Problem, text: str) -> None: ...

    def done(self, problem: Problem, verdict: str, speedup: float | None) -> None: ...

    def note(self, text: str) -> None: ...


class QuietProgress:
    def start(self, total: int, already_done: int) -> None:
        pass

    def stage(self, problem: Problem, text: str) -> None:
        pass

    def done(self, problem: Problem, verdict: str, speedup: float | None) -> None:
        pass

    def note(self, text: str) -> None:
        pass


@dataclass
class SuiteOutcome:
    name: str
    ran: list[str] = field(default_factory=list)  # problem keys evaluated or optimised now
    skipped: list[str] = field(default_factory=list)  # finished before
    failed: list[str] = field(default_factory=list)  # the engine could not run them (one line each, in notes)
    notes: list[str] = field(default_factory=list)
    bottleneck: str = ""  # where the builds held the GPUs back (`Pipeline.bottleneck`), one line


def register_suite(
    store: Store,
    name: str,
    kind: str,
    problems: list[str],
    out_dir: Path,
    candidates: str | None = None,
    info: dict[str, Any] | None = None,
) -> None:
    """Create the suite, or check that a rerun under this name is the same kind of suite, in the same folder."""
    with store.transaction() as tx:
        row = tx.execute("SELECT kind, out_dir FROM suites WHERE id=?", (name,)).fetchone()
        if row is not None and row["kind"] != kind:
            from kernelwright.suites.discovery import SuiteError

            raise SuiteError(f"suite {name!r} is an {row['kind']} suite (in {row['out_dir']}); pass another --name")
        if row is not None and Path(row["out_dir"]) != out_dir.resolve():
            from kernelwright.suites.discovery import SuiteError

            raise SuiteError(
                f"suite {name!r} has its run directories in {row['out_dir']}; leave --out out (or pass that folder) "
                "to resume it, or pass another --name"
            )
        tx.execute(
            "INSERT INTO suites (id, kind, problems, candidates, out_dir, created, info) VALUES (?,?,?,?,?,?,?)"
            " ON CONFLICT(id) DO UPDATE SET problems=excluded.problems, candidates=excluded.candidates,"
            " info=excluded.info",
            (name, kind, json.dumps(problems), candidates, str(out_dir.resolve()), now(), json.dumps(info or {})),
        )


def suite_dir(store: Store, name: str) -> Path | None:
    """The folder of the suite's run directories, as the store recorded it (None: no such suite):
    a rerun finds them from any working directory."""
    row = store.conn.execute("SELECT out_dir FROM suites WHERE id=?", (name,)).fetchone()
    return Path(row["out_dir"]) if row is not None else None


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / run_files.SUMMARY).read_text())
    except (OSError, ValueError):
        return {}


def is_finished(run_dir: Path) -> bool:
    s = _summary(run_dir)
    return s.get("state") == "finished" and not str(s.get("stop_reason") or "").startswith(UNFINISHED)


def died_before_the_candidate(result: EvalResult) -> bool:
    """The child died in its start-up, before the candidate was imported: the machine's fault, not
    the candidate's (a long suite evaluates such a candidate once more rather than count it)."""
    return result.status is Status.CRASHED and result.error_stage is Stage.STARTUP


def once_more_if_died_early(
    executor: Executor, task: EvalTask, result: EvalResult, on_stage: Callable[[str], None] | None = None
) -> EvalResult:
    if not died_before_the_candidate(result):
        return result
    again = executor.submit(task, on_stage=on_stage).result()
    first = result.error_log.strip().splitlines()[0] if result.error_log.strip() else "crashed in start-up"
    again.metadata["retried_after"] = first
    return again


def needs_build(code: str) -> bool:
    """Does the candidate build an extension when imported (worth a prebuild)?"""
    return "load_inline" in code or "cpp_extension" in code


# ---- suite eval --------------------------------------------------------------------------------


def _evaluated_code(run_dir: Path) -> str | None:
    rounds = finished_rounds(run_dir)
    cand = run_dir / rounds[0][0].name / run_files.CANDIDATE if rounds else None
    return cand.read_text() if cand is not None and cand.is_file() else None


def run_eval_suite(
    pairs: list[tuple[Problem, Candidate]],
    *,
    name: str,
    out_dir: Path,
    store: Store,
    config: EvalConfig,
    executor: Executor | None = None,
    build_workers: int = 1,
    build_pool: Any = None,
    progress: SuiteProgress | None = None,
) -> SuiteOutcome:
    """Evaluate each problem's candidate once (no model). The suite must be registered.

    With a `SerialExecutor` (the default), candidates are evaluated one after the other, their
    builds run ahead in a `BuildPool` of `build_workers`. With any other executor (local, ray),
    every task is submitted at once: the executor builds them all ahead on its CPU pool and
    hands each to the first free GPU whose build is done; records are written as they finish.
    """
    progress = progress or QuietProgress()
    outcome = SuiteOutcome(name)
    todo: list[tuple[Problem, Candidate, Path]] = []
    for prob, cand in pairs:
        run_dir = out_dir / prob.key
        if is_finished(run_dir) and _evaluated_code(run_dir) == cand.text:
            index_run(store, run_dir, suite_id=name, problem=prob.name, level=prob.level, kind="eval")
            outcome.skipped.append(prob.key)
            continue
        todo.append((prob, cand, run_dir))
    progress.start(len(pairs), len(outcome.skipped))
    if not todo:
        return outcome
    own_executor = executor is None
    executor = executor or SerialExecutor(config)
    pipeline = Pipeline(gpus=len(getattr(executor, "_slots", [])) or 1)
    try:
        if isinstance(executor, SerialExecutor):
            pipeline.in_order = True
            _eval_one_by_one(
                todo, executor, store, name, config, outcome, progress, pipeline, build_workers, build_pool
            )
        else:
            _eval_all_at_once(todo, executor, store, name, config, outcome, progress, pipeline)
        outcome.bottleneck = pipeline.bottleneck()
    finally:
        if own_executor:
            executor.close()
    return outcome


def _task(prob: Problem, cand: Candidate) -> EvalTask:
    return EvalTask(key=f"{prob.key}/{code_hash(cand.text)[:12]}", problem=prob.path, candidate_text=cand.text)


def _on_stage(progress: SuiteProgress, pipeline: Pipeline, prob: Problem) -> Callable[[str], None]:
    def stage(s: str) -> None:
        pipeline.stage(prob.key, s)
        progress.stage(prob, s)
        show = getattr(progress, "pipeline", None)
        if show is not None:
            show(pipeline)

    return stage


def _eval_one_by_one(todo, executor, store, name, config, outcome, progress, pipeline, build_workers, build_pool):
    pool = build_pool
    if pool is None and build_workers > 0 and any(needs_build(c.text) for _, c, _ in todo):
        from kernelwright.engine.extensions.prebuild import BuildPool

        pool = BuildPool(max_workers=build_workers, config=config)
    try:
        builds: list[Future | None] = [
            pool.submit(p.path, c.text) if pool is not None and needs_build(c.text) else None for p, c, _ in todo
        ]
        for (prob, _, _), build in zip(todo, builds, strict=False):
            pipeline.queued(prob.key, "build queued" if build is not None else "waiting for a GPU")
        for (prob, cand, run_dir), build in zip(todo, builds, strict=False):
            waited = None
            if build is not None:
                progress.stage(prob, "waiting for its prebuild")
                t_wait = time.monotonic()
                build.result()  # best effort: a failed prebuild is built again, and judged, by the evaluation
                waited = time.monotonic() - t_wait  # the GPU idle, waiting for this build
                pipeline.waited_for_build(waited)
            task = _task(prob, cand)
            fut = executor.submit(task, on_stage=_on_stage(progress, pipeline, prob))
            _record_one(
                prob, cand, run_dir, task, fut, executor, store, name, config, outcome, progress, pipeline, waited
            )
    finally:
        if pool is not None and build_pool is None:
            pool.shutdown(wait=False)


def _eval_all_at_once(todo, executor, store, name, config, outcome, progress, pipeline):
    """Submit every task now (the executor builds ahead and places them); record each as it ends."""
    import concurrent.futures as cf

    futs: dict[Future, tuple[Problem, Candidate, Path, EvalTask]] = {}
    for prob, cand, run_dir in todo:
        task = _task(prob, cand)
        pipeline.queued(prob.key)
        futs[executor.submit(task, on_stage=_on_stage(progress, pipeline, prob))] = (prob, cand, run_dir, task)
    for fut in cf.as_completed(futs):  # the store is written from this thread only
        prob, cand, run_dir, task = futs[fut]
        _record_one(prob, cand, run_dir, task, fut, executor, store, name, config, outcome, progress, pipeline)


def _record_one(
    prob, cand, run_dir, task, fut, executor, store, name, config, outcome, progress, pipeline, build_wait_s=None
) -> None:
    try:
        result = once_more_if_died_early(executor, task, fut.result())
        if build_wait_s is not None and isinstance(result.metadata.get("executor"), dict):
            result.metadata["executor"]["gpu_waited_for_build_s"] = round(build_wait_s, 3)
    except Exception as exc:  # EngineError: the evaluation could not run at all (not a verdict)
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        outcome.failed.append(prob.key)
        outcome.notes.append(f"{prob.key}: {line}")
        pipeline.done(prob.key)
        progress.note(f"{prob.key}: not evaluated: {line}")
        return
    record_evaluation(store, name, prob, cand, run_dir, result, config)
    outcome.ran.append(prob.key)
    pipeline.done(prob.key, result)
    progress.done(prob, result.status.value, result.speedup)
    show = getattr(progress, "pipeline", None)
    if show is not None:
        show(pipeline)


def record_evaluation(
    store: Store, suite: str, prob: Problem, cand: Candidate, run_dir: Path, result: EvalResult, config: EvalConfig
) -> None:
    """One evaluated candidate as a one-round run directory, then indexed."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an evaluation cut off before (or of another candidate): done again, whole
    rd = RunDir(
        run_dir,
        prob.path,
        {
            "kind": "eval",
            "suite": suite,
            "candidate_source": cand.source,
            "device": config.device,
            "trials": config.trials,
            "verdict": config.verdict,
        },
    )
    passed = result.status is Status.PASSED
    rnd = Round(
        index=0,
        kind="given",
        code=cand.text,
        result=result,
        evaluated=result.status is not Status.FORMAT_ERROR,
        became_best=passed,
        best_decision="the given candidate" if passed else "",
        wall_s=round(result.stage_times.total_s or 0.0, 3),
    )
    state = RunState(
        rounds=[rnd], best=rnd if passed else None, stop_reason="evaluated", started=time.monotonic() - rnd.wall_s
    )
    rd.record_round(rnd, state)
    rd.finish(state)
    index_run(store, run_dir, suite_id=suite, problem=prob.name, level=prob.level, kind="eval")


# ---- suite optimize ----------------------------------------------------------------------------


class ExecutorEvaluator:
    """The loop's Evaluator on top of an Executor: one task per candidate, waited for."""

    def __init__(self, executor: Executor, key: str):
        self.executor, self.key = executor, key

    def __call__(
        self, problem: Path, code: str, on_stage: Callable[[str], None], report_dir: Path | None
    ) -> EvalResult:
        task = EvalTask(
            key=f"{self.key}/{code_hash(code)[:12]}", problem=problem, candidate_text=code, report_dir=report_dir
        )
        return once_more_if_died_early(
            self.executor, task, self.executor.submit(task, on_stage=on_stage).result(), on_stage
        )


def run_optimize_suite(
    problems: list[Problem],
    *,
    name: str,
    out_dir: Path,
    store: Store,
    eval_config: EvalConfig,
    loop_config: LoopConfig,
    coder,
    judge,
    device: str,
    run_info: dict[str, Any],
    executor: Executor | None = None,
    progress: SuiteProgress | None = None,
    parallel: int = 1,
) -> SuiteOutcome:
    """The forge loop on every problem; finished problems are skipped, cut-off ones resumed.

    `parallel`: problems optimised at once (each in a thread, with a store connection of its
    own), so that an executor with several GPUs has work for each of them.
    """
    import concurrent.futures as cf
    import threading

    progress = progress or QuietProgress()
    outcome = SuiteOutcome(name)
    todo = []
    for prob in problems:
        run_dir = out_dir / prob.key
        if is_finished(run_dir):
            index_run(store, run_dir, suite_id=name, problem=prob.name, level=prob.level, kind="optimize")
            outcome.skipped.append(prob.key)
        else:
            todo.append((prob, run_dir))
    progress.start(len(problems), len(outcome.skipped))
    own_executor = executor is None
    executor = executor or SerialExecutor(eval_config)
    lock = threading.Lock()

    def one(prob: Problem, run_dir: Path) -> None:
        db = store if parallel <= 1 else Store.open(store.path)
        try:
            _optimize_problem(
                prob,
                run_dir,
                db,
                name=name,
                eval_config=eval_config,
                loop_config=loop_config,
                coder=coder,
                judge=judge,
                device=device,
                run_info=run_info,
                executor=executor,
                progress=progress,
                outcome=outcome,
                lock=lock,
            )
        finally:
            if db is not store:
                db.close()

    try:
        if parallel <= 1:
            for prob, run_dir in todo:
                one(prob, run_dir)
        else:
            with cf.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kw-suite") as pool:
                for fut in [pool.submit(one, prob, run_dir) for prob, run_dir in todo]:
                    fut.result()
    finally:
        if own_executor:
            executor.close()
    return outcome


def _optimize_problem(
    prob: Problem,
    run_dir: Path,
    store: Store,
    *,
    name,
    eval_config,
    loop_config,
    coder,
    judge,
    device,
    run_info,
    executor,
    progress,
    outcome: SuiteOutcome,
    lock,
) -> None:
    from kernelwright.engine import EngineError
    from kernelwright.loop.forge import Forge

    rounds: list[Round] = []
    if (run_dir / run_files.RUN_INFO).is_file():
        rd, rounds = RunDir.reopen(run_dir)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # cut off before its run.json: nothing to keep
        rd = RunDir(run_dir, prob.path, {"kind": "optimize", "suite": name, **run_info})
    recorder = IndexingRecorder(rd, store, suite_id=name, problem=prob.name, level=prob.level, kind="optimize")

    def on_progress(p: LoopProgress) -> None:
        progress.stage(
            prob, f"round {p.round + 1}/{loop_config.rounds}: {p.stage}" + (f" ({p.verdict})" if p.verdict else "")
        )
        if p.stage == "done" and p.judge_error:
            progress.note(f"{prob.key}: round {p.round}: Judge failed: {p.judge_error}")

    forge = Forge(
        prob.path,
        coder,
        judge,
        ExecutorEvaluator(executor, prob.key),
        loop_config,
        device=device,
        recorder=recorder,
        on_progress=on_progress,
    )
    if rounds:
        forge.restore(rounds, wall_s=float(_summary(run_dir).get("wall_s") or 0.0))
        progress.note(f"{prob.key}: resumed after round {len(rounds) - 1}")
    try:
        state = forge.run()
    except EngineError as exc:
        with lock:
            outcome.failed.append(prob.key)
            outcome.notes.append(f"{prob.key}: {exc}")
        progress.note(f"{prob.key}: stopped: {exc}")
        return
    best = state.best
    with lock:
        outcome.ran.append(prob.key)
    progress.done(
        prob,
        RoundVerdict.PASSED if best else (state.rounds[-1].verdict if state.rounds else RoundVerdict.NOT_RUN),
        best.speedup if best else None,
    )
