"""Runners of CPU evaluations forked from a zygote that imported torch once, inside their sandbox.

An exec'd runner imports torch at every evaluation (1.1-1.6 s of a small CPU evaluation's 1.6-2.9 s
on a 2-core machine). Here a zygote (`engine/child/zygote.py`, entry `runner`) starts once per
sandbox configuration, wrapped as an exec'd runner is (bubblewrap, or none), with two base folders
writable: one holding the forked runners' directories, one (on /dev/shm where there is room) their
output directories. Each evaluation's directories are made inside those bases (`workdir`,
`out_dir`), and the fork hides both bases behind empty mounts with only its own directories bound
back (`engine/child/confine.py`: its own user, mount, PID, IPC, network and UTS namespaces, no
capabilities, not dumpable). Before the fork goes on, it says its process id (the kernel attaches
it) and is placed in the evaluation's cgroup.

Candidates never share a zygote's fork, and a zygote has at most one fork alive: a second runner
asked for while it has one comes from a second zygote (`PER_KEY`), else it is exec'd as before.
Where the zygote's probe finds the confinement refused (no user namespaces, or no private /proc
without bubblewrap), forking is given up for the process and runners are exec'd.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.engine import zygote_client as zygotes
from kernelwright.engine.isolation import containment, environment, leftovers, sandbox

PER_KEY = 2  # zygotes per sandbox configuration (a running evaluation and a spare beside it)
MAX_KEYS = 2  # configurations with zygotes at once (each zygote holds an imported torch)
# set in the fork: one zygote serves every evaluation (the JIT caches lie in each evaluation's TMPDIR)
_PER_RUNNER = ("TMPDIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", containment.MARKER_VAR)
SHM = Path("/dev/shm")
SHM_MIN_FREE = 8 << 30

_LOCK = threading.Lock()
_BROKEN: list[str] = []  # why forking runners was given up in this process


@dataclass
class _Set:
    """The zygotes of one sandbox configuration and the base folders their forks' directories lie in."""

    work_base: Path
    out_base: Path | None
    zygotes: list[zygotes._Zygote] = field(default_factory=list)
    cache_writable: list[Path] = field(default_factory=list)  # environment.candidate_writable
    used: float = field(default_factory=time.monotonic)

    @property
    def writable(self) -> list[Path]:
        return [*self.cache_writable, *([self.out_base] if self.out_base is not None else [])]

    def close(self, now: bool = True) -> None:
        """`now` (the process is ending): the zygotes are killed; else each ends once its fork has
        (an evaluation of this configuration may still be running)."""
        for z in self.zygotes:
            try:
                z.close(now=now)
            except OSError:
                pass
        self.zygotes.clear()


_SETS: dict[tuple, _Set] = {}
_RETIRED: list[_Set] = []  # sets put aside for newer configurations: their bases are removed at exit too


def _key(config: EvalConfig) -> tuple:
    return (config.sandbox, str(Path(config.cache_dir).resolve()), config.build.trusted_cache, config.memory_limit_mb)


def applies(config: EvalConfig) -> bool:
    return config.fork_runner and config.device == "cpu" and not _BROKEN


def _set_for(config: EvalConfig) -> _Set:
    key = _key(config)
    stale = []
    with _LOCK:
        s = _SETS.get(key)
        if s is None:
            out_base = None
            try:
                st = os.statvfs(SHM)
                if st.f_bavail * st.f_frsize >= SHM_MIN_FREE and os.access(SHM, os.W_OK):
                    out_base = leftovers.make_dir("kw-out-", SHM)
            except OSError:
                pass
            writable = environment.candidate_writable(config)
            s = _SETS[key] = _Set(leftovers.make_dir("kw-eval-"), out_base, cache_writable=writable)
            while len(_SETS) > MAX_KEYS:
                oldest = min(_SETS, key=lambda k: _SETS[k].used)
                stale.append(_SETS.pop(oldest))
        s.used = time.monotonic()
    for old in stale:
        old.close(now=False)  # an evaluation in its bases may still be running: they go at exit
    with _LOCK:
        _RETIRED.extend(stale)
    return s


def workdir(config: EvalConfig) -> Path | None:
    """A fresh evaluation directory inside the forked runners' base (None: runners are exec'd)."""
    if not applies(config):
        return None
    s = _set_for(config)
    return Path(leftovers.make_dir("kw-eval-", s.work_base))


def out_dir(config: EvalConfig, workdir: Path) -> Path | None:
    """The runner's output directory for an evaluation directory made by `workdir` (None: the caller's)."""
    s = _SETS.get(_key(config))
    if s is None or workdir.parent != s.work_base:
        return None
    if s.out_base is None:
        return workdir / "out"
    return Path(leftovers.make_dir("kw-out-", s.out_base))


def spawn(
    config: EvalConfig,
    workdir: Path,
    out_dir: Path,
    env: dict[str, str],
    read_only: list[Path],
    argv: list[str],
    log_fd: int,
    report_w: int,
    handoff_fd: int | None,
    iso: containment.Isolation,
) -> Any | None:
    """A runner forked for this evaluation (a `ForkedJudge`, which stands in for its Popen), or None
    (the caller execs it): forking does not apply, the directories are not the base's, every
    zygote of this configuration is busy, or forking was given up. A zygote still importing torch
    is waited for, `zygote_client.READY_WAIT_S` at most: the first evaluation of a configuration
    starts one (or `start` did) and waits for it, where an exec'd runner would import torch too."""
    if not applies(config):
        return None
    s = _SETS.get(_key(config))
    if s is None or workdir.parent != s.work_base:
        return None
    covers: list[list[Any]] = [[str(s.work_base), [str(workdir)]]]
    if s.out_base is not None:
        if out_dir.parent != s.out_base:
            return None
        covers.append([str(SHM), [str(out_dir)]])  # and a /dev/shm of its own
    base_env = {k: v for k, v in env.items() if k not in _PER_RUNNER}
    bwrap = config.sandbox == "bwrap"
    spec = {
        "covers": covers,
        "rlimits": dict(iso.rlimits),
        "proc": "try" if bwrap else "required",  # confine.py says why
        "network": bwrap,  # without a sandbox an exec'd runner has the host's network: so does a fork
        "sockets": sandbox.sockets_to_cover(s.work_base, s.writable, read_only) if bwrap else [],
    }
    targets = {"report": report_w, **({"handoff": handoff_fd} if handoff_fd is not None else {})}
    try:
        with _LOCK:
            z = next((z for z in s.zygotes if z.proc.poll() is None and not z.busy()), None)
            if z is None:
                s.zygotes = [z for z in s.zygotes if z.proc.poll() is None]
                if len(s.zygotes) >= PER_KEY:
                    return None
                z = zygotes._on_owner_thread(lambda: _start(config, s, base_env, read_only))
                s.zygotes.append(z)
            z.reserved = True  # this thread's until its fork is made (or not)
        try:
            # still importing torch after the wait: this runner is exec'd
            if not z.is_ready(zygotes.READY_WAIT_S):
                return None
            if z.env != base_env:  # a configuration the key does not tell apart: not this zygote's
                return None
            child = z.spawn(
                argv,
                workdir,
                env,
                log_fd,
                report_w,
                handoff_fd,
                extra={"confine": spec, "fd_targets": targets},
                place=lambda pid: _place(iso, pid),
            )
        finally:
            z.reserved = False
    except (OSError, ValueError) as exc:
        _BROKEN.append(f"{type(exc).__name__}: {exc}")
        return None
    iso.pid_namespace = iso.caps_dropped = True  # its own (confine.py), whatever `prepare` found
    iso.notes = [n for n in iso.notes if not n.startswith("no PID namespace")]
    iso.notes.append("runner forked from a zygote that imported torch once, confined in namespaces of its own")
    return child


def start(config: EvalConfig, env: dict[str, str], read_only: list[Path]) -> None:
    """Start a zygote for this configuration's runners now, where it has none alive, without
    waiting for it: it imports torch while the caller does other work (an evaluation's trusted
    build). `env`: a runner's environment (`environment.child_env`)."""
    if not applies(config):
        return
    s = _set_for(config)
    base_env = {k: v for k, v in env.items() if k not in _PER_RUNNER}
    try:
        with _LOCK:
            if any(z.proc.poll() is None for z in s.zygotes):
                return
            s.zygotes = [z for z in s.zygotes if z.proc.poll() is None]
            s.zygotes.append(zygotes._on_owner_thread(lambda: _start(config, s, base_env, read_only)))
    except (OSError, ValueError) as exc:
        _BROKEN.append(f"{type(exc).__name__}: {exc}")


def _start(config: EvalConfig, s: _Set, base_env: dict[str, str], read_only: list[Path]) -> zygotes._Zygote:
    writable = s.writable
    env = dict(base_env, TMPDIR=str(s.work_base))
    z = zygotes._Zygote(
        env,
        entry="runner",
        argv_wrap=lambda a: sandbox.wrap(a, config.sandbox, s.work_base, writable, read_only, nested_user=True),
        cwd=s.work_base,
        extra_args=("try" if config.sandbox == "bwrap" else "required",),
    )
    z.env = base_env
    return z


def _place(iso: containment.Isolation, pid: int) -> None:
    """The fork's cgroups (the evaluation's), before anything of it runs."""
    for cg in iso.cgroups:
        fd = os.open(os.path.join(cg, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)


def close_all() -> None:
    with _LOCK:
        sets = [*_SETS.values(), *_RETIRED]
        _SETS.clear()
        _RETIRED.clear()
    for s in sets:
        s.close()
        for base in (s.work_base, s.out_base):  # evaluations remove their own directories (or keep them: kept)
            if base is not None:
                try:
                    base.rmdir()
                except OSError:
                    pass


def bases() -> list[Path]:
    """The base folders this process made for its forked runners' directories."""
    with _LOCK:
        return [b for s in _SETS.values() for b in (s.work_base, s.out_base) if b is not None]


def broken() -> list[str]:
    return list(_BROKEN)


atexit.register(close_all)
