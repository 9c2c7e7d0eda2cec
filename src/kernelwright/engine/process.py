"""Child processes of the engine: started in their own session, logged through the parent's own
descriptor, and killed with their whole group.

A child writes JSON lines on a pipe whose write end it inherits (`fd` in its job) and reads
commands on its stdin. Its stdout and stderr go to a log file that the parent creates (never
following a link) and keeps open: the parent reads the log back through that descriptor, never
by its path, so a child that replaces the file with a link to a secret reads nothing back.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelwright.core.jsonlines import LineReader

LOG_TAIL_BYTES = 64 * 1024
LOG_TAIL_LINES = 40


def kill_group(proc: Any) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


@dataclass
class Child:
    """A started child: its process, the read end of its report pipe, its log descriptor."""

    proc: Any  # subprocess.Popen, or zygote_client.ForkedJudge (the same interface, as used here)
    read_fd: int
    log_fd: int
    workdir: Path
    started: float  # time.monotonic() at spawn, or when a spare got its job (`go`): the budgets' origin
    reader: LineReader = field(default_factory=LineReader)
    pending: list[dict[str, Any]] = field(default_factory=list)  # messages read while waiting for `ready`
    ready: bool = False  # its `ready` came (`wait_ready`, which may be asked again)
    stdin_open: bool = True
    isolation: Any = (
        None  # engine.isolation.containment.Isolation: cleaned up (cgroup, marker sweep) when the child ends
    )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_messages(self, timeout: float) -> tuple[list[dict[str, Any]], bool]:
        """(messages, eof): what the child sent within `timeout` seconds."""
        if self.read_fd < 0:
            return [], True
        ready, _, _ = select.select([self.read_fd], [], [], max(0.0, timeout))
        if not ready:
            return [], False
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            return [], True
        return self.reader.feed(chunk), False

    def wait_ready(self, timeout: float) -> bool:
        """Block until a spare has started up (True), died or `timeout` passed (False). Asked again
        once it has, True at once: a spare's two children are waited for in turn, one slice at a
        time (warm_pool.py), and the `ready` read in an earlier slice is not sent twice."""
        if self.ready:
            return True
        end = time.monotonic() + timeout
        while not any(m.get("type") == "ready" for m in self.pending):
            remaining = end - time.monotonic()
            if remaining <= 0:
                return False
            msgs, eof = self.read_messages(min(remaining, 0.5))
            self.pending += msgs
            if eof or (not msgs and not self.alive()) or self.reader.overflow:
                return False
        self.pending = [m for m in self.pending if m.get("type") != "ready"]
        self.ready = True
        return True

    def send(self, line: str) -> bool:
        """A command line on the child's stdin; False when it is gone."""
        if not self.stdin_open or self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            self.stdin_open = False
            return False

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and self.stdin_open:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self.stdin_open = False

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        return read_tail(self.log_fd, n)

    def stop(self) -> int | None:
        """Kill the child's group, reap it, close everything; its exit code."""
        kill_group(self.proc)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        if self.isolation is not None:  # what escaped the process group: cgroup kill, marker sweep
            try:
                self.isolation.cleanup()
            except Exception:
                pass
            self.isolation = None
        self.close_stdin()
        for attr in ("read_fd", "log_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, attr, -1)
        return code


def read_tail(fd: int, n: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last lines of a file the parent holds open (read by position, never by path)."""
    if fd < 0:
        return ""
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, min(max_bytes, size), start)
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return "\n".join(text.rstrip().splitlines()[-n:])


def _create_log(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o600)


SPAWN_FIELDS = ("fd", "handoff_fd")  # a job file's descriptors: fixed at the spawn, kept by `go`


def spawn(
    argv: list[str],
    job: dict[str, Any] | None,
    workdir: Path,
    env: dict[str, str],
    *,
    name: str = "runner",
    spare: bool = False,
    isolation: Any = None,
    handoff_fd: int | None = None,
    fork: bool = False,
    forker: Callable[[list[str], dict[str, str], int, int], Any] | None = None,
) -> Child:
    """Start a child on `job` (written to workdir/NAME_job.json). A `spare` starts up and waits
    for a line on its stdin; its job file is re-read then, so the job can be written later.
    With `job` None no file is written: the child gets its report descriptor as its last argument
    and its job on stdin (the judge, whose job must not lie where the runner could change it).
    `handoff_fd`: its end of the socket on which device outputs pass from runner to judge
    (inherited; closed here after the spawn). `fork`: a judge (`job` None, no isolation) forked from
    the zygote that imported torch once (`engine/zygote_client.py`), where it can; else exec'd as any
    child. `forker`: a runner forked from its zygote (`engine/runner_fork.py`), called with the
    child's own arguments, its environment, its log and its report descriptor; where it returns
    None, the child is exec'd."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, False)
    log_fd = _create_log(workdir / f"{name}.log")
    argv = argv + (["--spare"] if spare else [])
    extra = {"handoff_fd": handoff_fd} if handoff_fd is not None else {}
    if job is None:
        argv = argv + ([f"--handoff={handoff_fd}"] if handoff_fd is not None else []) + [str(write_fd)]
    else:
        job_path = workdir / f"{name}_job.json"
        job_path.write_text(json.dumps(dict(job, fd=write_fd, **extra)))
        argv = argv + [str(job_path)]
    proc: Any = None
    if forker is not None and job is not None:
        own_env = isolation.environment(env) if isolation is not None else env
        proc = forker(own_arguments(argv, name), own_env, log_fd, write_fd)
    if isolation is not None:  # PID namespace prefix, the evaluation's marker variable
        argv, env = isolation.command(argv), isolation.environment(env)
    if fork and job is None and isolation is None:
        from kernelwright.engine import zygote_client

        proc = zygote_client.spawn(
            argv[len(child_argv("judge")) :],
            workdir,
            env,
            log_fd,
            write_fd,
            handoff_fd,
        )
    proc = proc or subprocess.Popen(
        argv,
        cwd=str(workdir),
        env=env,
        stdin=subprocess.PIPE,
        stdout=log_fd,
        stderr=log_fd,
        pass_fds=(write_fd,) + ((handoff_fd,) if handoff_fd is not None else ()),
        start_new_session=True,  # own session and group: killpg reaches the compiler and its children
        preexec_fn=isolation.preexec if isolation is not None else None,  # rlimits, pdeathsig, cgroup
    )
    os.close(write_fd)
    if handoff_fd is not None:
        os.close(handoff_fd)
    return Child(proc, read_fd, log_fd, workdir, time.monotonic(), isolation=isolation)


def go(child: Child, job: dict[str, Any], name: str = "runner") -> bool:
    """Hand a spare its job; False when it is gone (then start a fresh one)."""
    if not child.alive():
        return False
    job_path = child.workdir / f"{name}_job.json"
    try:
        current = json.loads(job_path.read_text())
        current["fd"]  # a job file without its report descriptor is not a spare's
        _write_whole(job_path, json.dumps(dict(job, **{k: current[k] for k in SPAWN_FIELDS if k in current})))
    except (OSError, ValueError, KeyError):
        return False
    child.started = time.monotonic()  # its budgets run from its job, not from its spawn
    return child.send("go")


def own_arguments(argv: list[str], entry: str) -> list[str]:
    """The child's own arguments in a command line that may be wrapped (bwrap ... -- python -m ...)."""
    module = f"kernelwright.engine.child.{entry}"
    at = max(i for i, a in enumerate(argv) if a == module)
    return argv[at + 1 :]


def _write_whole(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all for a reader at any moment: a forked spare reads its
    job file milliseconds after its spawn, as its real job is being written over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def child_argv(entry: str = "runner") -> list[str]:
    """A child's command line: this interpreter, unbuffered, on the child's entry module."""
    return [sys.executable, "-u", "-m", f"kernelwright.engine.child.{entry}"]


def describe_signal(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Finished:
    """What a child that runs to its end (a build) reported."""

    messages: list[dict[str, Any]]
    timed_out: bool
    exit_code: int | None
    log_tail: str


def run_to_end(
    argv: list[str],
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    limit_s: float,
    *,
    name: str,
    isolation: Any = None,
    max_line: int = 1 << 20,
    max_messages: int = 1000,
    on_message: Callable[[dict[str, Any]], None] | None = None,
) -> Finished:
    """Start a child that needs no commands, collect its reports until it ends or `limit_s` passes
    (`on_message`: each report as it arrives, for a live display)."""
    child = spawn(argv, job, workdir, env, name=name, isolation=isolation)
    child.reader = LineReader(max_line)
    child.close_stdin()
    msgs: list[dict[str, Any]] = []
    end = child.started + limit_s
    timed_out = False
    while True:
        left = end - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        got, eof = child.read_messages(min(left, 0.5))
        msgs += got
        if on_message is not None:
            for m in got:
                on_message(m)
        if eof or child.reader.overflow or len(msgs) > max_messages or (not got and not child.alive()):
            break
    if not timed_out:
        try:
            child.proc.wait(timeout=max(1.0, min(10.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
    log_tail = child.log_tail()
    code = child.stop()
    return Finished(msgs, timed_out, code, log_tail)


def process_tree(pid: int) -> list[tuple[int, list[int]]]:
    """A process and everything it started: (pid, its thread ids) each (Linux /proc; best effort)."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        tasks = Path(f"/proc/{p}/task")
        try:
            tids = [int(t.name) for t in tasks.iterdir()]
        except OSError:
            continue
        out.append((p, tids))
        for tid in tids:
            try:
                todo += [int(c) for c in (tasks / str(tid) / "children").read_text().split()]
            except (OSError, ValueError):
                pass
    return out
