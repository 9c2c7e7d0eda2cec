"""Judges forked from a zygote that imported torch once (`engine/child/zygote.py`), for CPU evaluations.

A CPU evaluation starts two children, each importing torch (1.5 s of CPU each on a 2-core machine):
the runner, which runs the candidate (forked in its sandbox by `engine/runner_fork.py`, or exec'd),
and the judge, which runs no candidate code and can be forked from a process that has imported it
already. One zygote per parent process and judge environment, started at the first CPU judge (or
ahead of it, `start`) and stopped with the parent (`close_all`, at exit; it also dies with its
parent). `spawn` returns a `ForkedJudge`, which stands in for the `subprocess.Popen` of an exec'd
judge wherever `process.Child` uses one.

`EvalConfig.fork_judge` (on by default) switches it; a zygote that cannot start or answer is given
up for the rest of the process, and judges are exec'd as before.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

# variables that differ from one evaluation (or configuration) to the next and are read when used,
# not at import: set in the forked judge, not in the zygote (one zygote serves them all)
_PER_JUDGE = ("TMPDIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR", "MAX_JOBS")
# A judge or runner to be forked waits this long for a zygote still importing torch, rather than being
# exec'd beside it: an exec'd child imports torch too, so it is not ready much sooner, and the two
# imports share the cores. A zygote that once kept a caller waiting this long is not waited for again
# (`_Zygote.is_ready`).
READY_WAIT_S = 20.0
MAX_ZYGOTES = 2  # one per judge environment, the least recently used stopped beyond this (each holds torch)
_ZYGOTES: dict[tuple[tuple[str, str], ...], _Zygote] = {}
_LOCK = threading.Lock()
_BROKEN: list[str] = []  # why forking was given up in this process (then judges are exec'd)


class ForkedJudge:
    """The parts of `subprocess.Popen` that `process.Child` and the coordinator use, for a judge the
    zygote forked: its exit code comes on a status pipe the zygote writes when it reaps it."""

    def __init__(self, pid: int, stdin: IO[bytes], status_fd: int):
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.returncode: int | None = None
        self._status_fd = status_fd
        self.args = ["judge", str(pid)]

    def _read_status(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._status_fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self._status_fd, 4)
        os.close(self._status_fd)
        self._status_fd = -1
        if len(data) == 4:
            self.returncode = struct.unpack("i", data)[0]
        elif not _alive(self.pid):  # the zygote is gone, and so is the judge
            self.returncode = -signal.SIGKILL
        return self.returncode  # None: the zygote is gone, the judge is not (`poll` asks the kernel from now on)

    def poll(self) -> int | None:
        if self._status_fd < 0 and self.returncode is None:
            return None if _alive(self.pid) else self._lost()
        return self._read_status(0)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            code = self._read_status(left) if self._status_fd >= 0 else self.poll()
            if code is not None:
                return code
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            if self._status_fd < 0:
                time.sleep(0.05)

    def _lost(self) -> int:
        self.returncode = -signal.SIGKILL
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _placed(creds: socket.socket, place: Callable[[int], None]) -> int:
    """The fork's process id as this process sees it (the kernel's, attached to its first word on
    `creds`), after `place(pid)`; then the fork is told to go on."""
    creds.settimeout(30)
    data, ancdata, _, _ = creds.recvmsg(16, socket.CMSG_SPACE(12))
    pid = 0
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
            pid = struct.unpack("3i", payload[:12])[0]
    if data != b"pid" or pid <= 0:
        raise OSError("the fork ended before it was confined")
    place(pid)
    creds.send(b"go")
    return pid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class _Zygote:
    """One zygote process: `entry` "judge" (exec'd as it is) or "runner" (`argv_wrap`: its sandbox)."""

    def __init__(
        self,
        env: dict[str, str],
        entry: str = "judge",
        argv_wrap: Callable[[list[str]], list[str]] | None = None,
        cwd: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = parent_end
        self.lock = threading.Lock()
        fd = child_end.fileno()
        argv = [sys.executable, "-u", "-m", "kernelwright.engine.child.zygote", str(fd), entry, *extra_args]
        self.proc = subprocess.Popen(
            argv_wrap(argv) if argv_wrap is not None else argv,
            env=env,
            cwd=str(cwd) if cwd is not None else None,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # never the caller's terminal: a zygote in trouble is one that is
            stderr=subprocess.DEVNULL,  # not ready, and its children are exec'd
            start_new_session=True,
        )
        child_end.close()
        self.ready = False
        self.slow = False  # it once kept a caller waiting READY_WAIT_S: not waited for again
        self.used = time.monotonic()
        self.env = dict(env)  # what its forks share (a runner zygote's: without the per-runner variables)
        self.current: ForkedJudge | None = None  # a runner zygote's one fork at a time
        self.warm_asked = False  # a judge zygote asked to warm its flop counter (`warm`)
        self.reserved = False  # a runner is being forked from it

    def is_ready(self, wait_s: float = 0.0) -> bool:
        """Has it imported torch and its entry (its first message)? Waits up to `wait_s` for it,
        without the lock (a child asked for meanwhile with no wait is exec'd, never held back)."""
        if not self.ready and wait_s > 0 and not self.slow:
            self.slow = not select.select([self.sock], [], [], wait_s)[0]
        if not self.ready:
            with self.lock:
                if not self.ready and select.select([self.sock], [], [], 0)[0]:
                    first = json.loads(self.sock.recv(1 << 16) or b"{}")
                    self.ready = first.get("ready") is True
                    if not self.ready:
                        raise OSError(f"the zygote cannot serve: {first.get('why') or 'it ended before it was ready'}")
        return self.ready

    def busy(self) -> bool:
        return self.reserved or (self.current is not None and self.current.poll() is None)

    def spawn(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log_fd: int,
        report_w: int,
        handoff_fd: int | None,
        extra: dict | None = None,
        place: Callable[[int], None] | None = None,
    ) -> ForkedJudge:
        """A fork running `argv`. `place` (a runner): the fork first says its process id on a socket
        of its own (the kernel attaches it, as this process sees it), `place(pid)` runs, then the
        fork goes on; the returned child's pid is that one."""
        stdin_r, stdin_w = os.pipe()
        status_r, status_w = os.pipe()
        names = ["handoff"] if handoff_fd is not None else []
        fds = [stdin_r, log_fd, report_w, status_w] + ([handoff_fd] if handoff_fd is not None else [])
        creds = theirs = None
        if place is not None:
            creds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            creds.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            names.append("creds")
            fds.append(theirs.fileno())
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "fd_names": names, **(extra or {})}).encode()
        try:
            with self.lock:
                self.sock.sendmsg(
                    [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
                )
                ready, _, _ = select.select([self.sock], [], [], 60)
                answer = json.loads(self.sock.recv(1 << 16) or b"{}") if ready else {}
        finally:
            os.close(stdin_r)
            os.close(status_w)
            if theirs is not None:
                theirs.close()
        pid = answer.get("pid")
        try:
            if not isinstance(pid, int) or pid <= 0:
                raise OSError(f"the zygote did not fork: {answer.get('error') or 'no answer'}")
            if creds is not None and place is not None:
                pid = _placed(creds, place)
        except BaseException:
            os.close(stdin_w)
            os.close(status_r)
            raise
        finally:
            if creds is not None:
                creds.close()
        child = ForkedJudge(pid, open(stdin_w, "wb"), status_r)  # noqa: SIM115 - the child's stdin for its life
        if place is not None:
            self.current = child
        return child

    def close(self, now: bool = True) -> None:
        """No more judges from it. `now` (this process is ending): it is killed, and the judges it
        forked with it; else it ends by itself once they have."""
        try:
            self.sock.close()
        finally:
            if now:
                self.proc.kill()
                self.proc.wait()


_OWNER: list[tuple[threading.Thread, queue.Queue]] = []


def _on_owner_thread(make: Callable[[], _Zygote]) -> _Zygote:
    """`make()` run on the one long-lived thread that starts every zygote of this process. A zygote
    dies with the *thread* that started it (its parent-death signal): one started by a thread that
    then ended, as a Ray actor's task thread does, took every judge it had forked with it (judges
    killed by SIGKILL without a record, `test_ray_executor_...`)."""
    with _LOCK:
        if not _OWNER or not _OWNER[0][0].is_alive():
            jobs: queue.Queue = queue.Queue()

            def serve() -> None:
                while True:
                    fn, box, done = jobs.get()
                    try:
                        box.append(fn())
                    except BaseException as exc:  # handed back to the caller
                        box.append(exc)
                    done.set()

            owner = threading.Thread(target=serve, name="kw-zygote-owner", daemon=True)
            owner.start()
            _OWNER[:] = [(owner, jobs)]
        jobs = _OWNER[0][1]
    box: list = []
    done = threading.Event()
    jobs.put((make, box, done))
    done.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _zygote_for(env: dict[str, str]) -> _Zygote:
    """The zygote for a judge environment, started now where there is none (it imports torch
    meanwhile); the least recently used beyond `MAX_ZYGOTES` is stopped."""
    base = {k: v for k, v in env.items() if k not in _PER_JUDGE}
    key = tuple(sorted(base.items()))
    stale = []
    with _LOCK:
        zygote = _ZYGOTES.get(key)
        make = zygote is None or zygote.proc.poll() is not None
    if make:
        zygote_env = dict(base, TMPDIR=tempfile.gettempdir())
        made = _on_owner_thread(lambda: _Zygote(zygote_env))
        with _LOCK:
            zygote = _ZYGOTES.get(key)
            if zygote is None or zygote.proc.poll() is not None:
                zygote = _ZYGOTES[key] = made
            else:  # another thread made one meanwhile
                made.close()
    with _LOCK:
        assert zygote is not None
        zygote.used = time.monotonic()
        while len(_ZYGOTES) > MAX_ZYGOTES:
            oldest = min(_ZYGOTES, key=lambda k: _ZYGOTES[k].used)
            stale.append(_ZYGOTES.pop(oldest))
    for z in stale:
        z.close(now=False)  # a judge it forked may still be running
    return zygote


def start(env: dict[str, str]) -> None:
    """Start the zygote for judges of this environment now, without waiting for it: it imports
    torch while the caller does other work (an evaluation's trusted build), and the judge forked
    from it later waits less or not at all."""
    if _BROKEN:
        return
    try:
        _zygote_for(env)
    except (OSError, ValueError) as exc:
        _BROKEN.append(f"{type(exc).__name__}: {exc}")


def spawn(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    log_fd: int,
    report_w: int,
    handoff_fd: int | None,
) -> ForkedJudge | None:
    """A judge forked with `argv` (judge.py's own arguments, the report descriptor last); None
    where forking is given up in this process, or its zygote is still importing torch after
    `READY_WAIT_S` (the caller then execs the judge). The first judge of an environment starts its
    zygote and waits for it, as every later one would for a zygote still importing: an exec'd judge
    imports torch too, on the same cores, and is ready no sooner."""
    if _BROKEN:
        return None
    try:
        zygote = _zygote_for(env)
        # still importing torch after the wait: this judge is exec'd
        if not zygote.is_ready(READY_WAIT_S):
            return None
        return zygote.spawn(argv, cwd, env, log_fd, report_w, handoff_fd)
    except (OSError, ValueError) as exc:
        _BROKEN.append(f"{type(exc).__name__}: {exc}")
        return None


def warm() -> None:
    """Ask each ready judge zygote, once, to warm its flop counter (`evidence.warm_flop_counter`):
    called by the evaluator after an evaluation, once its children are stopped, so the import runs
    beside none of them, and the next judge is forked when it is done. Never while the zygote is
    still importing torch: its first judge would wait behind it, and a process that evaluates once
    (one `kernelwright eval`) needs the warm-up only where its problem's work is not counted yet,
    which that judge then does for itself, in a thread."""
    with _LOCK:
        zygotes = [z for z in _ZYGOTES.values() if z.ready and not z.warm_asked and z.proc.poll() is None]
    for z in zygotes:
        with z.lock:
            if z.warm_asked:
                continue
            z.warm_asked = True
            try:
                z.sock.send(json.dumps({"warm": True}).encode())
            except OSError:
                pass  # a zygote that is gone is found so at its next judge


def close_all() -> None:
    with _LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for z in zygotes:
        try:
            z.close()
        except OSError:
            pass


atexit.register(close_all)
