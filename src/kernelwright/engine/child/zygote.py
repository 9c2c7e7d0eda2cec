"""The judge's zygote: a process that has imported torch and the judge once, and forks a judge per
evaluation (a fresh judge's start is a torch import: 1.5 s of CPU on a 2-core machine, once per
evaluation, and as much for the runner beside it).

    python -m kernelwright.engine.child.zygote SOCKET_FD

Trusted code only: the zygote never runs candidate code and never sees a job (the judge's job
comes on the forked judge's own stdin, after the fork). It serves one parent (`engine/zygote.py`)
over a SOCK_SEQPACKET socket: each request is a JSON object `{"argv": [...], "cwd": ..., "env":
{...}}` with four descriptors (the judge's stdin, its log, its report pipe, a status pipe) and
optionally a fifth (the hand-off socket); the answer is `{"pid": N}`. The forked judge starts a
session of its own (the parent kills its group as it kills an exec'd child's), takes the request's
directory and environment, and runs `judge.main`. When a judge ends, the zygote writes its exit
code (as `subprocess.Popen.returncode` has it) on its status pipe. The zygote ends when its
parent closes the socket (or dies: it asks for SIGKILL then).

Where it is used: the judges of CPU evaluations. A GPU judge is not forked (CUDA must not be
initialised before a fork, and a GPU evaluation's judge starts as a spare, off the path); the
runner is never forked from a shared process (under bubblewrap it starts in a sandbox of its own).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

MAX_FDS = 5


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket, others: list[int]) -> None:
    """In the forked judge: never returns. `others`: the other judges' status pipes (the zygote's)."""
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
        os.dup2(stdin_r, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (stdin_r, log_fd):
            if fd > 2:
                os.close(fd)
        os.set_inheritable(report_w, False)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the judge's own now
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the judge's stdin for its life
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        from kernelwright.engine.child import judge

        argv = [str(a) for a in request["argv"]]
        sys.argv = ["kernelwright.engine.child.judge", *argv]
        code = judge.main(argv) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    sock = socket.socket(fileno=int(argv[0]))
    import torch  # noqa: F401 - what every judge would import: once, here

    from kernelwright.engine.child import judge  # noqa: F401

    try:
        sock.send(b'{"ready": true}')  # until this comes, the parent execs its judges (it never waits for us)
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
            if len(fds) < 4:
                raise ValueError(f"{len(fds)} descriptors, 4 needed")
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            _answer(sock, {"error": str(exc)})
            continue
        if len(fds) > 4:  # the hand-off socket: the judge is told its number, as an exec'd judge is
            request["argv"] = [f"--handoff={fds[4]}" if str(a).startswith("--handoff=") else a for a in request["argv"]]
        # the report descriptor's number in the judge: the judge reads it from its argv (the last item)
        request["argv"] = list(request["argv"][:-1]) + [str(fds[2])]
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock, [*status.values(), wake_r, wake_w])
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
