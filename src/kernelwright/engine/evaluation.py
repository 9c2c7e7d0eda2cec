"""The engine's front door: `evaluate(problem, candidate, config) -> EvalResult`.

Never raises for anything the candidate does: every failure becomes a verdict. It raises only
when the evaluation itself cannot run (missing problem, a problem that is not in the format,
an unavailable device or sandbox), with a one-line message naming the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelwright.core import formats
from kernelwright.core.config import EvalConfig
from kernelwright.core.printable import printable
from kernelwright.core.record import EvalResult, Stage, Status
from kernelwright.core.settings_file import protection_lowered
from kernelwright.engine import draws, nsight, process, runner_fork, sanitizer, zygote_client
from kernelwright.engine.child import gpu_turn, protocol
from kernelwright.engine.compile_watch import CompileWatch, jit_dirs
from kernelwright.engine.config_resolution import check_device, resolve_config
from kernelwright.engine.errors import EngineError
from kernelwright.engine.extensions import build_arch, trusted_builds
from kernelwright.engine.isolation import containment as isolation
from kernelwright.engine.isolation import environment, leftovers, sandbox


def evaluate(
    problem: str | Path,
    candidate: str | Path | None = None,
    config: EvalConfig | None = None,
    *,
    candidate_text: str | None = None,
    on_stage: Callable[[str], None] | None = None,
    spare: Spare | None = None,
    on_children: Callable[[Spare], None] | None = None,
    more_spares: Callable[[], Spare | None] | None = None,
) -> EvalResult:
    """Evaluate a candidate (a file, or its text) against a KernelBench problem in a fresh child.

    `config`: resolved at the entry point (`engine/config_resolution.py`: no "auto" device or sandbox here);
    None: the defaults, resolved.

    `spare`: a child started ahead of time by `prestart` for a compatible configuration (same
    device, cache, environment and sandbox); it is used for this evaluation (or stopped, when it
    does not fit or has died) and must not be used again. See `WarmEvaluator`.

    `on_children`: called with the runner and judge the evaluation runs on (the spare, or those it
    started), once they exist: a caller that must stop it early kills their process groups.

    `more_spares`: where the later draws' children come from (`config.timing.draws` > 1), one call a
    draw: a pool's spares, started up while nothing was timed (executors/warm_pool.py). A spare that
    does not fit, or None, and the draw starts children of its own.
    """
    config = config or _defaults()
    leftovers.sweep_once()  # directories of evaluators that were killed outright
    try:
        _validate(config)
        try:
            prob = formats.load_problem(problem)
        except (FileNotFoundError, formats.FormatError) as exc:
            raise EngineError(str(exc)) from None
        check_device(config.device)
    except EngineError:
        if spare is not None:
            spare.discard()
        raise
    spare = _fitting(spare, config)
    workdir = spare.workdir if spare else _new_workdir(config)
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
            return EvalResult(
                status=Status.FORMAT_ERROR,
                error_log=printable(str(exc)),
                error_stage=Stage.STARTUP,
                atol=config.atol,
                rtol=config.rtol,
                seed=config.seed,
                sandbox=config.sandbox,
            )
        result = _run(prob.path, cand_path, config, workdir, on_stage, spare, on_children)
        spare = None  # _run took it
        if config.timing.draws > 1:
            result = _more_draws(result, prob.path, candidate_text, config, on_stage, on_children, more_spares)
        return result
    finally:
        if spare is not None:
            spare.discard(remove_workdir=False)
        if not config.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _more_draws(
    first: EvalResult,
    problem_path: Path,
    candidate_text: str,
    config: EvalConfig,
    on_stage: Callable[[str], None] | None,
    on_children: Callable[[Spare], None] | None,
    more_spares: Callable[[], Spare | None] | None = None,
) -> EvalResult:
    """`config.timing.draws` whole evaluations of a passed candidate, each in children of its own and
    a working directory of its own, one record (engine/draws.py). The profile and the sanitizer ran
    with the first; the others do every check again. Their children come from `more_spares` (ready
    ones, started while nothing was timed), else start together once the first draw is done: no
    start-up beside a measurement, and one start-up's wait for all of them."""
    results = [first]
    asked = config.timing.draws
    again = dataclasses.replace(config, sanitize=False, profile=dataclasses.replace(config.profile, enabled=False))
    spares: list[Spare] = []
    try:
        if draws.wanted(results, asked):
            for _ in range(asked - 1):  # one by one: those taken or started stop below if the next cannot start
                spares.append(_fitting(more_spares() if more_spares else None, again) or prestart(again))
            for spare in spares:
                spare.wait_ready(float(again.timeouts.startup))  # one that is not: _run starts fresh children
        while draws.wanted(results, asked):
            spare = spares.pop(0)
            try:
                path = spare.workdir / "candidate.py"
                path.write_text(candidate_text)
                if on_stage:
                    on_stage(f"draw {len(results) + 1} of {asked}")
                results.append(_run(problem_path, path, again, spare.workdir, on_stage, spare, on_children))
            finally:
                if not config.keep_workdir:
                    shutil.rmtree(spare.workdir, ignore_errors=True)
    finally:
        for spare in spares:  # not needed: a draw failed
            spare.discard()
    return draws.combine(results, asked)


def _fitting(spare: Spare | None, config: EvalConfig) -> Spare | None:
    """`spare` where it serves `config` and lives; else None (it is stopped)."""
    if spare is not None and (spare.key != _spawn_key(config) or not spare.alive()):
        spare.discard()
        return None
    return spare


# ---- spare children -------------------------------------------------------------------------


def _spawn_key(config: EvalConfig) -> str:
    """What a child is started with: a spare serves only evaluations that agree on all of it."""
    return json.dumps(
        [
            config.device,
            str(Path(config.cache_dir).resolve()),
            list(config.pass_env),
            config.build.max_jobs,
            config.sandbox,
            float(config.timeouts.startup),  # 120 and 120.0 alike (a configuration read back from JSON)
            config.visible_devices,
            config.memory_limit_mb,  # limits are set at the spawn
            config.device_handoff,  # its socket too
            config.build.trusted_cache,
        ]
    )  # the build cache's mount; a spare is pinned to its GPU


@dataclass
class Spare:
    """An evaluation started ahead of its job: a runner and a judge with python, torch and the CUDA
    context up. Neither has run anything of a problem or a candidate; both wait on stdin. A spare
    serves one evaluation, so every candidate still gets fresh processes."""

    runner: process.Child
    judge: process.Child
    key: str
    workdir: Path
    judge_dir: Path
    env: dict[str, str]
    out_dir: Path  # where the runner writes its outputs (memory-backed where the machine has room)

    def alive(self) -> bool:
        return self.runner.alive() and self.judge.alive()

    def wait_ready(self, timeout: float) -> bool:
        """Block until both have started up (True), or one died or `timeout` passed (False)."""
        end = time.monotonic() + timeout
        return self.runner.wait_ready(timeout) and self.judge.wait_ready(max(0.0, end - time.monotonic()))

    def discard(self, remove_workdir: bool = True) -> None:
        self.runner.stop()
        self.judge.stop()
        shutil.rmtree(self.judge_dir, ignore_errors=True)
        _remove_out_dir(self.out_dir, self.workdir)
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def prestart(config: EvalConfig | None = None) -> Spare:
    """Start a spare evaluation (runner and judge) for `config` now: they start up while the caller
    does other work."""
    config = config or _defaults()
    _validate(config)
    leftovers.sweep_once()
    spare = _start_spare(config, _new_workdir(config))
    try:  # after the spawn: the children start up while this process imports torch to look for the GPU
        check_device(config.device)
    except EngineError:
        spare.discard()
        raise
    return spare


def _start_spare(config: EvalConfig, workdir: Path) -> Spare:
    judge_dir = leftovers.make_dir("kw-judge-")
    out_dir = runner_fork.out_dir(config, workdir) or _out_dir(workdir)
    job = {"problem_path": "", "candidate_path": "", "config": config.to_dict()}
    runner, judge, env = _spawn_pair(config, workdir, job, judge_dir, out_dir, spare=True)
    return Spare(runner, judge, _spawn_key(config), workdir, judge_dir, env, out_dir)


def _forks_children(config: EvalConfig) -> bool:
    """Whether an evaluation's runner or judge is forked from a zygote (a CPU evaluation, by default)."""
    return config.device == "cpu" and (config.fork_judge or runner_fork.applies(config))


def _start_zygotes(config: EvalConfig, workdir: Path) -> None:
    """The zygotes this evaluation's children are forked from, started now where none is alive:
    they import torch while the caller does other work. Variables set per child (TMPDIR, the JIT
    caches) are not in a zygote's key, so the environment of any evaluation directory will do."""
    env = environment.child_env(config, workdir / "tmp")
    if runner_fork.applies(config):
        runner_fork.start(config, env, _read_only_for_candidates(config))
    if config.fork_judge:
        zygote_client.start(environment.judge_env(env, config, workdir))


def _spawn_pair(
    config: EvalConfig,
    workdir: Path,
    job: dict,
    judge_dir: Path,
    out_dir: Path,
    spare: bool = False,
) -> tuple[process.Child, process.Child, dict[str, str]]:
    """Runner and judge, with a socket between them for device outputs where the device is a GPU
    (`device_handoff`: the runner's CUDA outputs reach the judge without a trip through host memory)."""
    # the pair's socket: the judge's timing windows (their regions' descriptors) and, on a GPU,
    # the runner's device outputs
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ends: tuple[int | None, int | None] = (a.detach(), b.detach())
    try:
        runner, env = _spawn_runner(config, workdir, job, spare=spare, out_dir=out_dir, handoff_fd=ends[0])
    except BaseException:
        for fd in ends:
            if fd is not None:
                os.close(fd)
        raise
    try:
        judge = _spawn_judge(config, judge_dir, env, spare=spare, handoff_fd=ends[1])
    except BaseException:
        if ends[1] is not None:
            os.close(ends[1])
        runner.stop()
        raise
    return runner, judge, env


def _copy_without_links(src_dir: Path, dst_dir: Path, name: str) -> bool:
    """Copy `name` from `src_dir` to `dst_dir`, both the candidate's to write (the runner's output
    directory and its own): no link is followed at either end, nor a linked directory, and only a
    regular file is read. A link the candidate left would otherwise make this process (the user's
    rights, no sandbox) overwrite the file it names, or read the user's file into the directory the
    next child of this candidate sees. False where nothing was copied."""
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fds: list[int] = []
    try:
        src = os.open(src_dir, flags_dir)
        fds.append(src)
        dst = os.open(dst_dir, flags_dir)
        fds.append(dst)
        inp = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
        fds.append(inp)
        if not stat.S_ISREG(os.fstat(inp).st_mode):
            return False
        try:
            os.unlink(name, dir_fd=dst)
        except FileNotFoundError:
            pass
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
        with os.fdopen(out, "wb") as w, os.fdopen(os.dup(inp), "rb") as r:
            shutil.copyfileobj(r, w)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


SHM = Path("/dev/shm")
SHM_MIN_FREE = 8 << 30  # a memory-backed output directory only where this much is free


def _new_workdir(config: EvalConfig) -> Path:
    """An evaluation's directory: where its runner can be forked from a zygote, inside that zygote's base."""
    return runner_fork.workdir(config) or leftovers.make_dir("kw-eval-")


def _out_dir(workdir: Path) -> Path:
    """The runner's output directory: on /dev/shm where it has room (an output file is written and
    read once: on a disk-backed /tmp, writing a 128 MB output took 0.3 s, on tmpfs 0.04 s), else in
    the evaluation's directory. The runner spills to `workdir/out` when the memory is full."""
    try:
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize >= SHM_MIN_FREE and os.access(SHM, os.W_OK):
            return leftovers.make_dir("kw-out-", SHM)
    except OSError:
        pass
    return workdir / "out"


def _remove_out_dir(out_dir: Path, workdir: Path) -> None:
    if out_dir != workdir / "out":
        shutil.rmtree(out_dir, ignore_errors=True)


class WarmEvaluator:
    """`evaluate` with the next evaluation's child started as soon as the previous one ends.

    The forge loop spends seconds to minutes in the Judge and the Coder between two evaluations;
    a spare child started at the end of one evaluation has imported torch and initialised CUDA
    by the time the next candidate comes, which takes the child's start-up (about 5 s on an H100
    machine) off every round's critical path. A spare is started only after an evaluation has
    finished (never while one is being measured) and stopped by `close`.
    """

    def __init__(self, config: EvalConfig | None = None, keep_warm: bool = True):
        self.config = config or _defaults()
        self.keep_warm = keep_warm
        self._spare: Spare | None = None

    def prestart(self, config: EvalConfig | None = None) -> None:
        if self._spare is not None and self._spare.alive():
            return
        if self._spare is not None:
            self._spare.discard()
        self._spare = prestart(config or self.config)

    def evaluate(
        self, problem: str | Path, candidate: str | Path | None = None, config: EvalConfig | None = None, **kwargs
    ) -> EvalResult:
        config = config or self.config
        spare, self._spare = self._spare, None
        try:
            return evaluate(problem, candidate, config, spare=spare, **kwargs)
        finally:
            if self.keep_warm:
                try:
                    self.prestart(config)
                except EngineError:
                    pass  # the next evaluation starts its own child and reports the problem

    def close(self) -> None:
        if self._spare is not None:
            self._spare.discard()
            self._spare = None

    def __enter__(self) -> WarmEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _defaults() -> EvalConfig:
    """No configuration given: the defaults, resolved (engine/config_resolution.py)."""
    return resolve_config(EvalConfig())


def _validate(config: EvalConfig) -> None:
    """A valid configuration, resolved at the entry point (no "auto" reaches the engine)."""
    try:
        config.validate()
        config.check_resolved()
    except ValueError as exc:
        raise EngineError(str(exc)) from None


def _read_only_for_candidates(config: EvalConfig) -> list[Path]:
    """What a sandboxed child that runs candidate code reads but never writes in the cache directory
    (its writable part is the candidate's own caches): the shared builds, which only the trusted
    builder writes, and the judge's compiler caches (`environment.judge_env`). Created here: bwrap
    binds only what exists."""
    read_only = [Path(config.cache_dir) / environment.JUDGE_CACHE_SUBDIR]
    if config.build.trusted_cache:
        read_only.append(trusted_builds.cache_root(config))
    for d in read_only:
        d.mkdir(parents=True, exist_ok=True)
    return read_only


def _spawn_runner(
    config: EvalConfig,
    workdir: Path,
    job: dict,
    spare: bool = False,
    out_dir: Path | None = None,
    handoff_fd: int | None = None,
):
    """Start the runner in `workdir` (its TMPDIR inside it; its outputs in `out_dir`, by default
    inside it too): (child, environment)."""
    cache_dir = Path(config.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("tmp", "out"):
        (workdir / sub).mkdir(exist_ok=True)
    env = environment.child_env(config, workdir / "tmp")
    read_only = _read_only_for_candidates(config)
    extra = [out_dir] if out_dir is not None and out_dir != workdir / "out" else []
    writable = [*environment.candidate_writable(config), *extra]
    argv = sandbox.wrap(process.child_argv("runner"), config.sandbox, workdir, writable, read_only)
    iso = isolation.prepare(config.device, config.sandbox, config.memory_limit_mb)

    def forker(args: list[str], child_env: dict[str, str], log_fd: int, report_w: int):
        out = out_dir or workdir / "out"
        return runner_fork.spawn(config, workdir, out, child_env, read_only, args, log_fd, report_w, handoff_fd, iso)

    child = process.spawn(
        argv,
        job,
        workdir,
        env,
        name="runner",
        spare=spare,
        isolation=iso,
        handoff_fd=handoff_fd,
        forker=forker if runner_fork.applies(config) else None,
    )
    return child, env


def _spawn_judge(
    config: EvalConfig,
    judge_dir: Path,
    env: dict[str, str],
    spare: bool = False,
    handoff_fd: int | None = None,
) -> process.Child:
    """Start the judge: it runs no candidate code, gets its job on stdin, and keeps its files in a
    directory of its own (none of them in the runner's reach under bubblewrap)."""
    return process.spawn(
        process.child_argv("judge") + [config.device],
        None,
        judge_dir,
        environment.judge_env(env, config, judge_dir),
        name="judge",
        spare=spare,
        handoff_fd=handoff_fd,
        # a CPU judge forks from a process that imported torch once (a GPU judge starts as a spare, off the path)
        fork=config.fork_judge and config.device == "cpu",
    )


def _run(
    problem_path: Path,
    cand_path: Path,
    config: EvalConfig,
    workdir: Path,
    on_stage: Callable[[str], None] | None,
    spare: Spare | None = None,
    on_children: Callable[[Spare], None] | None = None,
) -> EvalResult:
    from kernelwright.engine.coordinator import coordinate

    # The runner never sees the problem: the judge holds it and hands the runner its inputs as data.
    (workdir / "out").mkdir(exist_ok=True)
    phases: dict[str, float] = {}  # the engine's own time, by phase (metadata["engine_phases_s"])
    t_phase = time.monotonic()
    # CPU children forked from zygotes: the zygotes import torch while the trusted builder works, and
    # the children are forked after it (a fork waits for its zygote's import, zygote_client.READY_WAIT_S).
    # Exec'd children start up (python, torch, CUDA) while it works.
    own_spare = spare is None
    fork_after_build = own_spare and _forks_children(config)
    if fork_after_build:
        _start_zygotes(config, workdir)
    elif spare is None:
        spare = _start_spare(config, workdir)
        phases["spawn"] = time.monotonic() - t_phase
        t_phase = time.monotonic()
    if on_children is not None and spare is not None:
        on_children(spare)
    trusted = None
    if config.build.trusted_cache:  # build what can be built without running the candidate
        tdir = workdir / "trusted-build"
        trusted_span = [time.time()]
        try:
            trusted = trusted_builds.build(
                cand_path.read_text(),
                config,
                tdir,
                environment.child_env(config, tdir / "tmp"),
                build_arch.arch_list_for_config(config),
                on_stage=on_stage,
            )
        except BaseException:
            if spare is not None:
                spare.discard(remove_workdir=False)
            raise
        trusted_span.append(time.time())
        phases["trusted_build"] = time.monotonic() - t_phase
        t_phase = time.monotonic()
    if spare is None:
        spare = _start_spare(config, workdir)
        phases["spawn"] = time.monotonic() - t_phase  # with the wait for a zygote still importing torch
        t_phase = time.monotonic()
        if on_children is not None:
            on_children(spare)
    out_dir = spare.out_dir
    # the candidate's source, read once by the parent before its runner starts: what the judge's job and
    # the coordinator learn of it
    source = cand_path.read_text(errors="replace")
    files = {"out_dir": str(out_dir), "spill_dir": str(workdir / "out")}
    job = {"problem_path": "", "candidate_path": str(cand_path), "config": config.to_dict(), **files}
    job.update(trusted_builds.job_fields(trusted, workdir))
    judge_job = protocol.JudgeJob(
        config=config.to_dict(),
        problem_source=Path(problem_path).read_text(),
        problem_name=str(problem_path),
        out_dir=files["out_dir"],
        spill_dir=files["spill_dir"],
        # read here, by the parent: a candidate that compiles at its first call gets the JIT allowance
        candidate_jit=formats.compiles_at_first_call(source),
        candidate_clocks=formats.clocks_read(source),
    ).to_json()
    env, judge_dir = spare.env, spare.judge_dir
    if process.go(spare.runner, job) and spare.judge.alive():
        runner, judge = spare.runner, spare.judge
    else:  # it died while waiting: fresh children, as without a spare
        spare.runner.stop()
        spare.judge.stop()
        runner, judge, env = _spawn_pair(config, workdir, job, judge_dir, out_dir)
    phases["start" if runner is not spare.runner else "hand_over"] = time.monotonic() - t_phase
    t_phase = time.monotonic()
    iso = runner.isolation
    init_reports = config.sandbox == "bwrap" or (iso is not None and iso.pid_namespace)  # an init reports 128+N
    try:
        outcome = coordinate(
            runner,
            judge,
            judge_job,
            config.timeouts,
            on_stage=on_stage,
            exit_code_of=sandbox.child_exit_code if init_reports else (lambda c: c),
            watch=CompileWatch(runner.proc.pid, jit_dirs(env)),
            jit_out_of_sight=formats.compiles_out_of_sight(source),
        )
    finally:
        runner.stop()
        judge.stop()
        zygote_client.warm()  # its children are done: a judge zygote's one-time warm-up runs beside none of them
        if config.profile.enabled or config.sanitize:  # the judge's first inputs, for ncu / compute-sanitizer
            for name in ("in_init.kwt", "in_000.kwt"):
                _copy_without_links(Path(out_dir), workdir, name)
        _remove_out_dir(out_dir, workdir)
        if not config.keep_workdir:
            shutil.rmtree(judge_dir, ignore_errors=True)
    phases["evaluation"] = outcome.wall_s
    phases["verdict_after_runner"] = outcome.judge_tail_s
    phases["runner_clocks_paused"] = outcome.runner_clocks_paused_s  # the judge at work (not the runner's budget)
    phases["stop"] = time.monotonic() - t_phase - outcome.wall_s
    result = _record(outcome, config)
    if outcome.compile_seen:  # what held the JIT allowance open (engine/compile_watch.py)
        result.metadata["compile_seen"] = outcome.compile_seen
    if own_spare:  # "prestarted" tells of a spare the caller started ahead, not of this overlap
        result.metadata.pop("prestarted", None)
    result.metadata["engine_phases_s"] = {k: round(v, 4) for k, v in phases.items()}
    result.metadata["judge_process"] = "forked" if type(judge.proc).__name__ == "ForkedJudge" else "started"
    result.metadata["runner_process"] = "forked" if type(runner.proc).__name__ == "ForkedJudge" else "started"
    isolation.annotate(result, iso)  # metadata["isolation"], the memory-limit note
    result.metadata["settings"] = {"file": config.settings_file or None, "lowers": protection_lowered(config)}
    if trusted is not None:
        result.metadata["trusted_build"] = trusted.describe()
        result.stage_times.spans["trusted_build"] = [round(t, 3) for t in trusted_span]
        if trusted.builds and not trusted.remembered:  # compiled before the child's clock: its build stage
            st = result.stage_times
            st.build_s = (st.build_s or 0.0) + trusted.wall_s
            st.total_s = (st.total_s or 0.0) + trusted.wall_s
    if result.status is Status.PASSED and (config.profile.enabled or config.sanitize):
        _after_the_judge(result, config, workdir, env, job, on_stage)
    return _redacted(result)


def _after_the_judge(
    result: EvalResult,
    config: EvalConfig,
    workdir: Path,
    env: dict[str, str],
    job: dict[str, Any],
    on_stage: Callable[[str], None] | None,
) -> None:
    """A passed candidate's profile under Nsight Compute and its forward under compute-sanitizer, on
    the judge's first trial inputs (the first two wire files the judge wrote, kept above), in the
    GPU's turn (engine/child/gpu_turn.py): no other evaluation times its windows beside their replays."""
    job = dict(job, init_path=str(workdir / "in_init.kwt"), inputs_path=str(workdir / "in_000.kwt"))
    turn = gpu_turn.after_the_judge(result.metadata.get("gpu_turn"), config.timing.gpu_turn_wait_s)
    try:
        if config.profile.enabled:
            if on_stage:
                on_stage("profile")
            profile_began = time.time()
            nsight.attach(
                result,
                config,
                workdir,
                env,
                job,
                wrap=lambda a, *report_dir: sandbox.wrap(
                    a,
                    config.sandbox,
                    workdir,
                    [*environment.candidate_writable(config), *report_dir],
                    _read_only_for_candidates(config),
                ),
            )
            profiled = time.time()
            result.stage_times.spans["profile"] = [round(profile_began, 3), round(profiled, 3)]
            result.stage_times.profile_s = (result.stage_times.profile_s or 0.0) + profiled - profile_began
        if config.sanitize:  # one forward under memcheck (engine/sanitizer.py)
            sanitizer.attach(
                result,
                config,
                workdir,
                env,
                job,
                wrap=lambda a: sandbox.wrap(
                    a,
                    config.sandbox,
                    workdir,
                    environment.candidate_writable(config),
                    _read_only_for_candidates(config),
                ),
            )
    finally:
        if turn is not None:
            turn.release()
            facts = result.metadata.get("gpu_turn")
            if isinstance(facts, dict):
                facts["after_the_judge"] = {
                    "held": turn.held,
                    "waited_s": round(turn.waited_s, 3),
                    "none": turn.why_none,
                }


def _record(outcome, config: EvalConfig) -> EvalResult:
    """The judge's record, typed (an unknown key is the engine's error), with the parent's facts."""
    result = None
    if outcome.record is not None:
        try:
            result = EvalResult.from_dict(outcome.record)
        except (TypeError, ValueError, KeyError) as exc:
            outcome.judge_problem = f"the judge's record does not fit EvalResult: {exc}"
    if result is None:
        result = EvalResult(
            status=Status.ENGINE_ERROR,
            atol=config.atol,
            rtol=config.rtol,
            seed=config.seed,
            error_log=f"The engine failed, not the candidate: {outcome.judge_problem}.",
        )
        if outcome.judge_log.strip():
            result.metadata["engine_log"] = outcome.judge_log
    result.sandbox = config.sandbox
    result.exit_code = outcome.runner_exit
    result.stage_times.total_s = outcome.wall_s
    result.stage_times.spans = dict(outcome.spans)  # the parent's clock, whatever the judge's record held
    if result.status in (Status.CRASHED, Status.TIMEOUT, Status.RUNTIME_ERROR) and outcome.runner_log.strip():
        if "Process output (end)" not in result.error_log:
            result.error_log += "\n\nProcess output (end):\n" + outcome.runner_log
    return result


def _redacted(result: EvalResult) -> EvalResult:
    """The record with every value of the caller's secret-looking variables blanked out, and every
    control character written out (`core/printable.py`: much of its text is the candidate's)."""
    return EvalResult.from_dict(printable(environment.redact(result.to_dict(), environment.secret_values())))
