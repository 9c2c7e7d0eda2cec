"""Prebuilding candidates on the CPU while the GPU evaluates: `BuildPool(max_workers).submit(...)`.

With the trusted cache (`BuildConfig.trusted_cache`, the default), a prebuild is the trusted
builder (`engine/extensions/trusted_builds.py`): the candidate's statically known `load_inline` calls are
built into the shared cache by a child that never imports the candidate; a call it cannot resolve
is left to the evaluation (which builds it privately), and the prebuild says so (`ok` False).
Without it, a prebuild is the evaluation child in `build_only` mode: it imports the candidate (so
every `load_inline` it makes is built into the content-hashed build cache) and stops. It runs with no
GPU visible (`CUDA_VISIBLE_DEVICES=""`) and `TORCH_CUDA_ARCH_LIST` set to the GPU's own arch, the
value the evaluation child sets, so the cache key matches and the later evaluation of the same
candidate finds its extensions built. Compilation needs no GPU, so builds of queued candidates
overlap with the GPU evaluation of the previous one.

A prebuild is best effort: a candidate that fails to build (or touches CUDA at import) is simply
built again, and judged, by its evaluation.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernelwright.core import formats
from kernelwright.core.config import EvalConfig
from kernelwright.engine import process
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.engine.extensions import trusted_builds
from kernelwright.engine.extensions.build_arch import detect_arch_list
from kernelwright.engine.isolation import leftovers, sandbox
from kernelwright.engine.isolation.environment import candidate_writable, child_env


@dataclass
class PrebuildResult:
    ok: bool  # every extension built (or was already in the cache)
    builds: list[dict[str, Any]] = field(default_factory=list)  # the child's build log
    build_s: float | None = None  # the child's build stage (import of the candidate)
    wall_s: float = 0.0
    error: str = ""  # first line of what went wrong, when not ok
    memo: dict[str, Any] | None = None  # the trusted builds, for `trusted_builds.adopt` in an evaluation's process


def prebuild(problem: str | Path, candidate_text: str, config: EvalConfig, arch_list: str | None) -> PrebuildResult:
    """Build a candidate's extensions into the cache in a CPU-only child; never raises for the candidate."""
    t0 = time.monotonic()
    try:
        prob = formats.load_problem(problem)
        formats.check_candidate_text(candidate_text, "candidate")
    except (FileNotFoundError, formats.FormatError) as exc:
        return PrebuildResult(ok=False, error=str(exc).splitlines()[0], wall_s=time.monotonic() - t0)
    cache_dir = Path(config.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    workdir = leftovers.make_dir("kw-prebuild-")
    try:
        (workdir / "tmp").mkdir()
        cand = workdir / "candidate.py"
        cand.write_text(candidate_text)
        prob_copy = workdir / "problem.py"
        shutil.copyfile(prob.path, prob_copy)
        env = child_env(config, workdir / "tmp")
        env["CUDA_VISIBLE_DEVICES"] = ""
        if arch_list:
            env["TORCH_CUDA_ARCH_LIST"] = arch_list
        if config.build.trusted_cache:
            trusted = trusted_builds.build(
                candidate_text,
                config,
                workdir / "trusted-build",
                env,
                arch_list,
                record=True,
                problem_text=_read(prob.path),
            )  # calls computed at run time too (at import, in __init__, at the first call): recorded off the GPU's path
            failed = [b for b in trusted.builds if not b.get("ok")]
            err = (
                trusted.error
                or (failed[0].get("error", "the build failed") if failed else "")
                or (f"left to the evaluation: {trusted.private[0]}" if trusted.private else "")
            )
            return PrebuildResult(
                ok=not err,
                builds=trusted.builds,
                build_s=sum(b.get("build_s") or 0.0 for b in trusted.builds),
                wall_s=time.monotonic() - t0,
                error=err[:300],
                memo=trusted.memo,
            )
        # the candidate runs here: it writes its own directory and the shared builds, nothing else of the cache
        argv = sandbox.wrap(process.child_argv(), config.sandbox, workdir, candidate_writable(config))
        cfg = replace(config, device="cpu").to_dict()
        job = {"problem_path": str(prob_copy), "candidate_path": str(cand), "config": cfg, "mode": "build_only"}
        msgs, timed_out, log_tail, build_s = _run_build(
            argv, job, workdir, env, config.timeouts.startup + config.timeouts.build
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    builds = next((m.get("builds") for m in msgs if m.get("type") == "build"), None) or []
    ok = any(m.get("type") == "built" for m in msgs) and all(isinstance(b, dict) and b.get("ok") for b in builds)
    err = ""
    if not ok:
        fail: dict[str, Any] = next((m for m in msgs if m.get("type") == "failure"), {})
        log = (str(fail.get("log") or "") or log_tail or "").strip()
        err = log.splitlines()[0][:300] if log else ("timed out" if timed_out else "no report")
    return PrebuildResult(ok=ok, builds=builds, build_s=build_s, wall_s=time.monotonic() - t0, error=err)


def _run_build(argv, job, workdir, env, limit_s: float):
    """Run a build_only runner to its end or `limit_s`: (its reports, timed out, log tail, build seconds)."""
    done = process.run_to_end(argv, job, workdir, env, limit_s, name="prebuild")
    return done.messages, done.timed_out, done.log_tail, None


class BuildPool:
    """A pool of CPU build workers. `submit(problem, candidate_text) -> Future[PrebuildResult]`.

    Workers are threads, each waiting on its own build child process, so `max_workers` builds
    (each using up to `config.build.max_jobs` compiler jobs) run at once.

    `cpus`: the cores the build children run on (each worker thread pins itself; the children it
    starts inherit that), so builds stay off the cores that feed a GPU being timed. `before`: called
    in the worker before each build starts, e.g. to hold builds back while a GPU is being timed.
    """

    def __init__(
        self,
        max_workers: int = 2,
        config: EvalConfig | None = None,
        arch_list: str | None = "auto",
        cpus: set[int] | None = None,
        before: Callable[[], object] | None = None,
    ):
        self.config = config or resolve_config(EvalConfig())
        self.arch_list = detect_arch_list() if arch_list == "auto" else arch_list
        self.before = before
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="kw-build", initializer=_pin_thread, initargs=(cpus,)
        )

    def submit(self, problem: str | Path, candidate_text: str, on_start: Callable[[], None] | None = None) -> Future:
        """`on_start`: called in the pool's thread when this build starts (after `before`)."""
        return self._pool.submit(self._build, problem, candidate_text, on_start)

    def _build(
        self, problem: str | Path, candidate_text: str, on_start: Callable[[], None] | None = None
    ) -> PrebuildResult:
        if self.before is not None:
            self.before()
        if on_start is not None:
            on_start()
        return prebuild(problem, candidate_text, self.config, self.arch_list)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> BuildPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown(wait=True)


def _pin_thread(cpus: set[int] | None) -> None:
    """Pin the calling thread (Linux: affinity is per thread, and inherited by the processes it starts)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _read(problem: str | Path) -> str | None:
    try:
        return Path(problem).read_text()
    except OSError:
        return None
