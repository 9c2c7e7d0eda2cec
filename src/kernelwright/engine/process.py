"""Running the evaluation child: its own process group, per-stage deadlines, and a verdict for every death.

The child announces each stage on a pipe; the parent applies that stage's deadline from the
moment it starts and kills the whole process group past it. Whatever the child sent before it
died (a partial record) is kept. A child that dies without its final record is `crashed`
(signal, `os._exit`, abort), one killed at a deadline is `timeout`.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kernelwright.core.config import StageTimeouts

LOG_TAIL_LINES = 40


@dataclass
class ChildOutcome:
    """What the parent saw of one child run."""

    record: dict[str, Any] | None  # final record, or the last partial one
    final: bool  # the child sent its final record
    exit_code: int | None
    timed_out_stage: str | None
    last_stage: str | None
    stage_started: dict[str, float] = field(default_factory=dict)  # stage -> wall time it began
    log_tail: str = ""
    wall_s: float = 0.0


def _kill_group(proc: subprocess.Popen) -> None:
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
    """A started evaluation child: its process, the read end of its report pipe, its log."""

    proc: subprocess.Popen
    read_fd: int
    workdir: Path
    log_path: Path
    started: float  # time.monotonic() at spawn
    pending: bytes = b""  # report lines read before `watch` (by `wait_ready`)
    isolation: Any = None  # [isolation hook] engine.isolation.Isolation, cleaned up when the child ends

    def wait_ready(self, timeout: float) -> bool:
        """Block until a spare has started up (True), died or `timeout` passed (False)."""
        end = time.monotonic() + timeout
        while b'"type": "ready"' not in self.pending:
            remaining = end - time.monotonic()
            if remaining <= 0 or self.read_fd < 0:
                return False
            ready, _, _ = select.select([self.read_fd], [], [], min(remaining, 0.5))
            if ready:
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    return False
                self.pending += chunk
            elif self.proc.poll() is not None:
                return False
        return True


def spawn(argv: list[str], job: dict[str, Any], workdir: Path, env: dict[str, str], *, spare: bool = False,
          isolation: Any = None) -> Child:
    """Start the child on `job` (written to workdir/job.json).

    A `spare` child starts up (python, torch, CUDA) and then waits for a line on its stdin; the
    job file is re-read then, so the job can be written after the start (see `go`).
    """
    read_fd, write_fd = os.pipe()
    job = dict(job, fd=write_fd)
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    log_path = workdir / "child.log"
    argv = argv + (["--spare"] if spare else []) + [str(job_path)]
    if isolation is not None:  # [isolation hook] PID namespace prefix, marker variable
        argv, env = isolation.command(argv), isolation.environment(env)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=str(workdir),
            env=env,
            stdin=subprocess.PIPE if spare else subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            start_new_session=True,  # own process group: killpg reaches the compiler and any child it spawns
            preexec_fn=isolation.preexec if isolation is not None else None,  # [isolation hook] rlimits, pdeathsig, cgroup
        )
    os.close(write_fd)
    return Child(proc, read_fd, workdir, log_path, time.monotonic(), isolation=isolation)


def go(child: Child, job: dict[str, Any]) -> bool:
    """Hand a spare its job; False when it is gone (then start a fresh one)."""
    if child.proc.poll() is not None or child.proc.stdin is None:
        return False
    current = json.loads((child.workdir / "job.json").read_text())
    (child.workdir / "job.json").write_text(json.dumps(dict(job, fd=current["fd"])))
    try:
        child.proc.stdin.write(b"go\n")
        child.proc.stdin.close()  # the candidate reads EOF from stdin, as from /dev/null
    except (BrokenPipeError, OSError):
        return False
    return True


def discard(child: Child) -> None:
    """Stop a child that will not be used (a spare nobody took)."""
    _kill_group(child.proc)
    try:
        child.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    if child.isolation is not None:  # [isolation hook] what escaped the process group
        child.isolation.cleanup()
    for f in (child.proc.stdin,):
        try:
            if f:
                f.close()
        except OSError:
            pass
    if child.read_fd >= 0:
        try:
            os.close(child.read_fd)
        except OSError:
            pass
        child.read_fd = -1


def run_child(
    argv: list[str],
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    timeouts: StageTimeouts,
    on_stage: Callable[[str], None] | None = None,
) -> ChildOutcome:
    """Start the child on `job`, watch its stages, and return what it reported."""
    return watch(spawn(argv, job, workdir, env), timeouts, on_stage)


def watch(child: Child, timeouts: StageTimeouts, on_stage: Callable[[str], None] | None = None) -> ChildOutcome:
    """Follow a started child's stages to its end, applying each stage's deadline.

    The start-up deadline runs from the child's spawn: a spare that is still starting when its
    job comes gets what is left of it.
    """
    proc, read_fd = child.proc, child.read_fd
    t_start = time.monotonic()
    record: dict[str, Any] | None = None
    final = False
    stage = "startup"
    stage_started = {stage: time.time() - (t_start - child.started)}
    deadline = child.started + timeouts.startup
    timed_out: str | None = None
    buf = child.pending
    if on_stage:
        on_stage(stage)
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ)
    try:
        eof = False
        while not eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = stage
                _kill_group(proc)
                break
            events = sel.select(timeout=min(remaining, 1.0))
            if not events:
                if proc.poll() is not None:
                    break  # child gone; a grandchild may still hold the pipe open
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                eof = True
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # not ours: a candidate writing on our fd gets ignored
                kind = msg.get("type")
                if kind == "stage":
                    new_stage = str(msg.get("stage"))
                    if new_stage == stage:
                        continue  # a spare's start-up, announced at its spawn
                    stage = new_stage
                    stage_started[stage] = time.time()
                    deadline = time.monotonic() + float(getattr(timeouts, stage, timeouts.correctness))
                    if on_stage:
                        on_stage(stage)
                elif kind in ("partial", "final") and isinstance(msg.get("record"), dict):
                    record = msg["record"]
                    final = final or kind == "final"
    finally:
        sel.close()
        os.close(read_fd)
        child.read_fd = -1
    try:
        exit_code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        exit_code = proc.wait()
    _kill_group(proc)  # anything the child left behind in its group
    if child.isolation is not None:  # [isolation hook] what escaped the group: cgroup, marker sweep
        child.isolation.cleanup()
    return ChildOutcome(
        record=record,
        final=final,
        exit_code=exit_code,
        timed_out_stage=timed_out,
        last_stage=stage,
        stage_started=stage_started,
        log_tail=_tail(child.log_path, LOG_TAIL_LINES),
        wall_s=time.monotonic() - t_start,
    )


def _tail(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-n:])


def child_argv() -> list[str]:
    """The child's command line: this interpreter, unbuffered, on the child's entry module."""
    return [sys.executable, "-u", "-m", "kernelwright.engine.child.main"]


def describe_signal(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
