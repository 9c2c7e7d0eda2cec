"""The engine's front door: `evaluate(problem, candidate, config) -> EvalResult`.

Never raises for anything the candidate does: every failure becomes a verdict. It raises only
when the evaluation itself cannot run (missing problem, a problem that is not in the format,
an unavailable device or sandbox), with a one-line message naming the fix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import kernelwright
from kernelwright import formats
from kernelwright.config import EvalConfig
from kernelwright.engine import environment, process, sandbox
from kernelwright.result import EvalResult, Stage, StageTimes, Status


class EngineError(RuntimeError):
    """The evaluation could not run at all (not a verdict on the candidate). One line, names the fix."""


_STAGE_KEYS = {
    "startup": "startup_s", "build": "build_s", "init": "init_s",
    "correctness": "correctness_s", "timing": "timing_s", "profile": "profile_s",
}


def _package_root() -> str:
    return str(Path(kernelwright.__file__).resolve().parent.parent)


def check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EngineError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or run on a GPU machine")


def evaluate(
    problem: str | Path,
    candidate: str | Path | None = None,
    config: EvalConfig | None = None,
    *,
    candidate_text: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> EvalResult:
    """Evaluate a candidate (a file, or its text) against a KernelBench problem in a fresh child."""
    config = config or EvalConfig()
    try:
        config.validate()
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    try:
        prob = formats.load_problem(problem)
    except (FileNotFoundError, formats.FormatError) as exc:
        raise EngineError(str(exc)) from None
    check_device(config.device)
    try:
        sandbox_kind = sandbox.resolve(config.sandbox)
    except sandbox.SandboxUnavailable as exc:
        raise EngineError(str(exc)) from None

    workdir = Path(tempfile.mkdtemp(prefix="kw-eval-"))
    try:
        if candidate_text is None:
            if candidate is None:
                raise EngineError("no candidate given; pass a candidate file")
            cpath = Path(candidate)
            if not cpath.is_file():
                raise EngineError(f"candidate file not found: {cpath}; check the path")
            candidate_text = cpath.read_text()
        cand_path = workdir / "candidate.py"
        cand_path.write_text(candidate_text)
        try:
            formats.check_candidate_text(candidate_text, candidate or "candidate")
        except formats.FormatError as exc:
            return EvalResult(status=Status.FORMAT_ERROR, error_log=str(exc), error_stage=Stage.STARTUP,
                              atol=config.atol, rtol=config.rtol, seed=config.seed, sandbox=sandbox_kind)
        return _run(prob.path, cand_path, config, workdir, sandbox_kind, on_stage)
    finally:
        if not config.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(problem_path: Path, cand_path: Path, config: EvalConfig, workdir: Path, sandbox_kind: str,
         on_stage: Callable[[str], None] | None) -> EvalResult:
    cache_dir = Path(config.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / "tmp"
    tmp.mkdir()
    # The problem is copied in too: the child reads only its own directory and the cache.
    prob_copy = workdir / "problem.py"
    shutil.copyfile(problem_path, prob_copy)
    env = child_env(config, tmp)
    argv = sandbox.wrap(process.child_argv(), sandbox_kind, workdir, [cache_dir])
    job = {
        "problem_path": str(prob_copy),
        "candidate_path": str(cand_path),
        "config": config.to_dict(),
    }
    outcome = process.run_child(argv, job, workdir, env, config.timeouts, on_stage=on_stage)
    if sandbox_kind == "bwrap":
        outcome.exit_code = sandbox.child_exit_code(outcome.exit_code)
    result = _verdict(outcome, config, sandbox_kind)
    if config.profile.enabled and result.status is Status.PASSED:
        from kernelwright.engine import ncu

        if on_stage:
            on_stage("profile")
        report_dir = Path(config.profile.report_dir) if config.profile.report_dir else cache_dir
        ncu.attach(result, config, workdir, env, job,
                   wrap=lambda a: sandbox.wrap(a, sandbox_kind, workdir, [cache_dir, report_dir]))
    return result


def child_env(config: EvalConfig, tmp: Path) -> dict[str, str]:
    """The scrubbed environment of an evaluation (or prebuild) child; `tmp` is its TMPDIR."""
    cache_dir = Path(config.cache_dir)
    env = environment.child_environment(
        extra_names=config.pass_env,
        overrides={
            "PYTHONPATH": _package_root(),
            "TMPDIR": str(tmp),
            "TRITON_CACHE_DIR": str(cache_dir / "triton"),
            "CUDA_CACHE_PATH": str(cache_dir / "nv"),  # the CUDA JIT cache: $HOME is read-only in the sandbox
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONFAULTHANDLER": "1",
        },
    )
    # ninja's parallelism: every core unless the config or the caller's MAX_JOBS says otherwise
    if config.build.max_jobs > 0:
        env["MAX_JOBS"] = str(config.build.max_jobs)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    return env


def _verdict(outcome: process.ChildOutcome, config: EvalConfig, sandbox_kind: str) -> EvalResult:
    rec = outcome.record or {}
    if rec:
        result = EvalResult.from_dict({**rec, "status": rec.get("status", Status.RUNTIME_ERROR.value)})
    else:
        result = EvalResult(status=Status.CRASHED)
    result.atol, result.rtol, result.seed = config.atol, config.rtol, config.seed
    result.sandbox = sandbox_kind
    result.exit_code = outcome.exit_code
    times = result.stage_times or StageTimes()
    times.total_s = outcome.wall_s
    result.stage_times = times

    if outcome.final:
        return result
    # The child did not finish: a deadline, or a death. Keep what it measured before.
    stage = outcome.last_stage or "startup"
    try:
        result.error_stage = Stage(stage)
    except ValueError:
        result.error_stage = None
    result.correct = False
    if outcome.timed_out_stage:
        limit = getattr(config.timeouts, outcome.timed_out_stage, None)
        result.status = Status.TIMEOUT
        result.error_log = (
            f"Timed out in stage '{outcome.timed_out_stage}' after {limit:g} s; the process group was killed "
            "(a kernel or loop that never returns, or a build that is too slow)."
        )
    else:
        result.status = Status.CRASHED
        how = process.describe_signal(outcome.exit_code)
        result.error_log = (
            f"The evaluation process {how} during stage '{stage}' without reporting a result "
            "(a segfault, abort, os._exit or sys.exit in the candidate, or the process ran out of memory)."
        )
    if outcome.log_tail.strip():
        result.error_log += "\n\nProcess output (end):\n" + outcome.log_tail
    # a partial record's later measurements (timing) must not outlive a failed stage
    if result.status is not Status.PASSED:
        result.candidate_ms = result.speedup = None
    return result
