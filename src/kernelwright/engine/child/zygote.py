"""A zygote: a process that has imported torch once and forks a judge or a runner per evaluation
(a fresh child's start is a torch import: 1.5 s of CPU on a 2-core machine, twice per evaluation).

    python -m kernelwright.engine.child.zygote SOCKET_FD [judge|runner [required|try]]

It serves one parent (`engine/zygote_client.py`) over a SOCK_SEQPACKET socket: each request is a JSON
object `{"argv": [...], "cwd": ..., "env": {...}, "fd_names": [...]}` with four descriptors (the
child's stdin, its log, its report pipe, a status pipe) and those `fd_names` names (`handoff`: the
pair's socket; `creds`: the runner's hand-shake); the answer is `{"pid": N}`. The fork starts a
session of its own (the parent kills its group as it kills an exec'd child's), takes the request's
directory and environment, and runs the entry's `main`. When it ends, the zygote writes its exit
code (as `subprocess.Popen.returncode` has it) on its status pipe. The zygote ends when its
parent closes the socket (or dies: it asks for SIGKILL then).

`judge` (trusted code only): the judges of CPU evaluations. Asked to (`{"warm": true}`, no
descriptors, no answer), the zygote also imports what a judge's flop counter imports at its first
use (torch._dynamo: `evidence.warm_flop_counter`, 3-4 s of CPU on a 2-core machine), once, so that
no later forked judge pays it at the first evaluation of each new problem; its parent asks after
an evaluation, once its children are stopped, and never while the zygote still imports torch (a
judge whose problem's work is not counted yet warms itself, in a thread, as an exec'd judge does).
A GPU judge is not forked (CUDA must not be initialised before a fork; a GPU evaluation's judge
starts as a spare, off the path).

`runner`: the runners of CPU evaluations. This zygote runs inside the runner's sandbox (bubblewrap
or none), never runs candidate code itself and is not dumpable. Each fork says its process id to
the evaluator (`creds`: the kernel attaches it) and confines itself before the runner's code runs
(`confine.enter`: namespaces of its own, the other runners' directories hidden, no capabilities);
the evaluator forks one runner at a time from a zygote, so no two candidates ever share one. At
its start the zygote tries that confinement once (`confine.probe`) and says in its first message
whether it can (`{"ready": false, "why": ...}`: then it ends and runners are exec'd).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

MAX_FDS = 6


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _move_to(fds: dict[str, int], targets: dict[str, int]) -> dict[str, int]:
    """Each descriptor named in `targets` moved to that number (the numbers the runner's job file
    names, as an exec'd runner inherits them), through high numbers so no move clobbers another."""
    high = {name: fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for name, fd in fds.items() if name in targets}
    for name in high:
        os.close(fds[name])
    for name, fd in high.items():
        os.dup2(fd, int(targets[name]))
        os.close(fd)
    return {name: int(targets[name]) for name in high}


def _handshake(sock_fd: int) -> None:
    """A forked runner's first word to the evaluator, on a socket of its own: the kernel attaches
    the sender's process id as the evaluator sees it (its cgroup and its kills need that number);
    the evaluator answers once the fork is placed."""
    s = socket.socket(fileno=sock_fd)
    try:
        s.send(b"pid")
        s.settimeout(60)
        if s.recv(16) != b"go":
            raise OSError("the evaluator did not place this runner")
    finally:
        s.close()


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket, others: list[int], entry: str) -> None:
    """In the fork: never returns. `others`: the other forks' status pipes (the zygote's)."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        sock.close()
        for fd in others:
            os.close(fd)
        _die_with_parent()  # with the zygote, which dies with the evaluator (a fork clears the setting)
        os.setsid()
        stdin_r, log_fd, report_w = fds[0], fds[1], fds[2]
        os.close(fds[3])  # the status pipe is the zygote's to write
        named = dict(zip(request.get("fd_names", []), fds[4:], strict=False))
        os.dup2(stdin_r, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (stdin_r, log_fd):
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        creds = named.pop("creds", None)
        if request.get("confine") is not None:
            from kernelwright.engine.child import confine

            code = confine.CONFINE_FAILED
            # returns in the confined runner (PID 2 of its namespace), placed by the evaluator first
            confine.enter(request["confine"], placed=lambda: _handshake(creds) if creds is not None else None)
            code = 70
        elif creds is not None:
            _handshake(creds)
        if request.get("fd_targets"):
            _move_to({"report": report_w, **named}, dict(request["fd_targets"]))
        else:
            os.set_inheritable(report_w, False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the child's own now
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's stdin for its life
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        argv = [str(a) for a in request["argv"]]
        sys.argv = [f"kernelwright.engine.child.{entry}", *argv]
        if entry == "runner":
            from kernelwright.engine.child import runner

            runner._T0 = time.perf_counter()  # its start-up is the fork's, not the zygote's import
            code = runner.main(argv) or 0
        else:
            from kernelwright.engine.child import judge

            code = judge.main(argv) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from kernelwright.engine.child import heap

    heap.keep_tunables_to_itself()  # (glibc's setting stays with this process; the compilers it starts go without)
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    sock = socket.socket(fileno=int(argv[0]))
    entry = argv[1] if len(argv) > 1 else "judge"
    if entry not in ("judge", "runner"):
        return 2
    import torch  # noqa: F401 - what every child would import: once, here

    if entry == "runner":
        from kernelwright.engine.child import (
            confine,
            runner,  # noqa: F401
        )

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no fork reads or writes us
        why = confine.probe({"proc": argv[2] if len(argv) > 2 else "required"})
    else:
        from kernelwright.engine.child import evidence, judge  # noqa: F401

        why = ""
    try:  # until this comes, the parent execs its children (it never waits for us)
        sock.send(json.dumps({"ready": not why, "why": why}).encode())
        if why:
            return 0
    except OSError:  # the parent is gone already
        return 0
    status: dict[int, int] = {}  # judge pid -> write end of its status pipe
    # a judge's end wakes the select below at once (its exit code is what the parent waits for)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        _reap(status)
        try:
            ready, _, _ = select.select([sock.fileno(), wake_r], [], [], 1.0)
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if sock.fileno() not in ready:
            continue
        try:
            data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(MAX_FDS * 4))
        except InterruptedError:
            continue
        except OSError:  # the parent is gone
            return 0
        if not data:  # the parent closed: no more judges; those still running end as they would
            return _outlive(status)
        fds: list[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4]))
        try:
            request = json.loads(data)
            if entry == "judge" and request == {"warm": True} and not fds:
                # asked for when the parent is idle, and not answered: see `warm` in zygote_client.py
                from kernelwright.engine.child import evidence

                evidence.warm_flop_counter()
                continue
            if len(fds) < 4:
                raise ValueError(f"{len(fds)} descriptors, 4 needed")
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            _answer(sock, {"error": str(exc)})
            continue
        if entry == "judge":
            named = dict(zip(request.get("fd_names", []), fds[4:], strict=False))
            if "handoff" in named:  # the hand-off socket: the judge is told its number, as an exec'd judge is
                request["argv"] = [
                    f"--handoff={named['handoff']}" if str(a).startswith("--handoff=") else a for a in request["argv"]
                ]
            # the report descriptor's number in the judge: the judge reads it from its argv (the last item)
            request["argv"] = list(request["argv"][:-1]) + [str(fds[2])]
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock, [*status.values(), wake_r, wake_w], entry)
        for i, fd in enumerate(fds):
            if i != 3:
                os.close(fd)
        status[pid] = fds[3]
        _answer(sock, {"pid": pid})


def _outlive(status: dict[int, int]) -> int:
    """Stay until the judges this zygote forked have ended (they die with it)."""
    while status:
        _reap(status)
        time.sleep(0.05)
    return 0


def _answer(sock: socket.socket, msg: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:  # the parent is gone: the loop's next receive ends the zygote
        pass


def _reap(status: dict[int, int]) -> None:
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, struct.pack("i", os.waitstatus_to_exitcode(st)))
            except OSError:
                pass
            os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
