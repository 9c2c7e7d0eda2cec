"""`kernelwright serve`: evaluations handed over by other CLI processes, run on spares already warm.

A fresh `kernelwright eval` starts its runner and judge (python, torch, the CUDA context, the
profiler the guards use) on its own path: several seconds before its first trial, every time. A
server keeps a `WarmPool` (two spares by default) for one device; `kernelwright eval` hands it the
job over a Unix socket and gets the record back, so its own wall is its start-up and the
evaluation itself. Nothing about the evaluation changes: every candidate still gets a fresh runner
and a fresh judge (a spare serves one evaluation), in the same sandbox, under the same budgets.

Trust (`serve_trust.py`): the socket lies in a private folder of the user's that no evaluation's
sandbox binds (not the kernelwright cache), one server per device and cache. The server serves
only its own user in its own namespaces (the peer's uid and pid, `SO_PEERCRED`); the client hands
its job only to a server it verified (uid, namespaces, no evaluation among its ancestors, this
Python running `kernelwright serve`), else says so in one line and evaluates by itself. The server
runs code of the same installation as the client (`code_stamp`: a client built from other code
evaluates by itself), and evaluations are run one at a time, in the order they come. What a job
carries is what `evaluate` takes: the problem's and the candidate's paths (absolute) and the full
configuration. The server's environment is the one the children are started from (the client's
variables do not travel).

Protocol: one JSON line from the client (`stamp`, `problem`, `candidate`, `config`); then lines
from the server, `{"stage": ...}` as the evaluation goes, and last `{"result": <the record>}`,
`{"error": <the engine's one-line error>}` or `{"refused": <why>}`. A server that ends before the
last line (killed, stopped) leaves the client to evaluate by itself. `{"stop": true}` (`kernelwright
serve --stop`) is answered `{"stopped": <pid>}`, and the server stops.

Started by `kernelwright eval` (`start_detached`, `ServeConfig.autostart`): an eval that found no
server for its device starts one after its own evaluation, in a session of its own, which stops
after `ServeConfig.idle_minutes` without a job; its log is next to its socket. A server removes
its socket when it stops, and only while the path is still the socket it bound; a server killed
before it could leaves one that the next server for the path replaces.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernelwright
from kernelwright.core.config import EvalConfig, default_cache_dir
from kernelwright.core.record import EvalResult
from kernelwright.executors import serve_trust

MAX_JOB_BYTES = 1 << 20
_SUN_PATH_MAX = 100  # AF_UNIX paths are limited to 107 bytes


class ServerRefused(RuntimeError):
    """The server answered but would not run this job (another installation's code, another user).
    `stale`: it runs other code of this user's (an upgrade, an edit); `stop_server` may end it."""

    def __init__(self, message: str, stale: bool = False):
        super().__init__(message)
        self.stale = stale


def socket_path(device: str) -> Path:
    """Where the server for `device` ("cuda" or "cpu") and this user's cache listens: in
    `serve_trust.serve_dir()`, out of every sandbox's reach (its log and start file beside it)."""
    digest = hashlib.sha1(os.path.realpath(default_cache_dir()).encode()).hexdigest()[:12]
    path = serve_trust.serve_dir() / f"eval-{device}-{digest}.sock"
    if len(str(path)) <= _SUN_PATH_MAX:
        return path
    return Path("/tmp") / f"kw-serve-{os.getuid()}" / path.name


def code_stamp() -> str:
    """This installation's code (every module's path, size and modification time): a server and a
    client agree on it, or the client does not hand its job over."""
    root = Path(kernelwright.__file__).resolve().parent
    h = hashlib.sha1(kernelwright.__version__.encode())
    for p in sorted(root.rglob("*.py")):
        try:
            st = p.stat()
        except OSError:
            continue
        h.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    conn.sendall(json.dumps(msg, default=str).encode() + b"\n")


def _lines(conn: socket.socket, deadline: float | None = None):
    """The JSON lines the other end sends (a line that is not JSON ends the stream)."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                yield json.loads(line)
            except ValueError:
                return
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([conn], [], [], left)[0]:
                return
        chunk = conn.recv(1 << 16)
        if not chunk:
            return
        buf += chunk
        if len(buf) > MAX_JOB_BYTES:
            return


# ---- the client -----------------------------------------------------------------------------------


def _connect(path: Path) -> socket.socket | None:
    """A connection to the verified server at `path` (2 s to answer); None where no socket is
    there, nobody listens on it (a socket left by a server that is gone), or what listens is not a
    server this client trusts (`serve_trust.verify_server`: one line on stderr says why)."""
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(2.0)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    why = serve_trust.verify_server(conn)
    if why:
        conn.close()
        print(f"kernelwright: ignored what listens on {path} ({why}); evaluating here", file=sys.stderr, flush=True)
        return None
    return conn


def submit(
    problem: Path,
    candidate: Path,
    config: EvalConfig,
    on_stage: Callable[[str], None] | None = None,
    path: Path | None = None,
) -> EvalResult | None:
    """The evaluation, run by the server for `config.device`; None where there is none to run it
    (no socket, nobody listening, or it ended before its answer): the caller then evaluates by
    itself. An engine error the server met is raised as `EngineError`, as `evaluate` raises it;
    a job the server refused raises `ServerRefused`."""
    from kernelwright.engine import EngineError

    conn = _connect(path or socket_path(config.device))
    if conn is None:
        return None
    try:
        conn.settimeout(None)
        job = {
            "stamp": code_stamp(),
            "problem": str(Path(problem).resolve()),
            "candidate": str(Path(candidate).resolve()),
            "config": config.to_dict(),
        }
        try:
            _send(conn, job)
        except OSError:
            return None
        for msg in _lines(conn):
            if not isinstance(msg, dict):
                return None
            if "stage" in msg:
                if on_stage is not None:
                    on_stage(str(msg["stage"]))
            elif "result" in msg:
                return EvalResult.from_dict(msg["result"])
            elif "error" in msg:
                raise EngineError(str(msg["error"]))
            elif "refused" in msg:
                raise ServerRefused(str(msg["refused"]), stale=msg.get("why") == "stamp")
        return None  # the server ended first
    finally:
        conn.close()


def stop_server(device: str, path: Path | None = None, wait_s: float = 10.0) -> int | None:
    """Ask the server for `device` to stop (it answers its own user in its own namespaces only, of
    any code version); its process id once its socket is gone, None where none answered."""
    path = path or socket_path(device)
    conn = _connect(path)
    if conn is None:
        return None
    try:
        try:
            _send(conn, {"stop": True})
        except OSError:
            return None
        answer = next(_lines(conn, deadline=time.monotonic() + wait_s), None)
    finally:
        conn.close()
    if not isinstance(answer, dict) or "stopped" not in answer:
        return None
    end = time.monotonic() + wait_s
    while path.exists() and time.monotonic() < end:  # it closes its spares, then unlinks the socket
        time.sleep(0.05)
    return int(answer["stopped"])


def start_detached(config: EvalConfig, spares: int, idle_s: float) -> Path:
    """A server for `config.device`, started in the background in a session of its own (it outlives
    this process, and stops after `idle_s` without a job); its log's path. A second one started
    beside a running server finds the socket taken and ends at once (its log says so)."""
    path = socket_path(config.device)
    serve_trust.private_dir(path.parent)
    job = path.with_name(path.name.replace(".sock", "") + "-start.json")
    log = path.with_name(path.name.replace(".sock", "") + ".log")
    data = json.dumps({"config": config.to_dict(), "spares": spares, "idle_s": idle_s}).encode()
    fd = os.open(job, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:  # the server gets this process's umask, not one for private files (its children make folders)
        subprocess.Popen(
            [sys.executable, "-m", "kernelwright.executors.eval_server", str(job)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    finally:
        os.close(out)
    return log


def _closed_by_peer(conn: socket.socket) -> bool:
    """Has the client closed its end (or reset it)? It sends nothing after its job line."""
    try:
        if not select.select([conn], [], [], 0)[0]:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _other_namespace(pid: int) -> str:
    """The first of the client's namespaces that is not the server's ('' where all are): a candidate
    of the same uid that reached the socket (`--sandbox none` lets it write the user's folders)
    must not hand over a job with `sandbox: none`. The pid is the kernel's (SO_PEERCRED), taken at
    connect."""
    return serve_trust.other_namespace(pid)


# ---- the server -----------------------------------------------------------------------------------


class EvalServer:
    """Evaluations for one device, one at a time, on a `WarmPool` of `spares`."""

    def __init__(self, config: EvalConfig, path: Path | None = None, spares: int = 2, idle_s: float = 1800.0):
        from kernelwright.executors.warm_pool import WarmPool

        self.config = config
        self.path = path or socket_path(config.device)
        self.idle_s = idle_s
        self.stamp = code_stamp()
        self.served = 0
        self.cancelled = 0  # evaluations stopped because their client went away
        self._stop = threading.Event()
        self._listener = self._bind()
        try:
            # its first spare starts up alone: the first job (often the next eval, seconds after the
            # one that started this server) waits for that one only
            self.pool = WarmPool(config, size=spares, first_alone=True)
            self.pool.prestart()
        except BaseException:  # no server after all: its socket goes with it
            self._listener.close()
            if self._still_ours():
                self.path.unlink(missing_ok=True)
            os.close(self._lock_fd)
            raise

    def _bind(self) -> socket.socket:
        serve_trust.private_dir(self.path.parent)
        # one server per socket path, held for its life: two evals that end together each start one,
        # and the second must not take the path over from the first between its bind and its listen
        lock_path = self.path.with_name(self.path.name + ".lock")
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OSError(f"a server already runs for {self.path} (stop it first, or use it)") from None
            listener = self._listen()
        except BaseException:
            os.close(lock_fd)
            raise
        self._lock_fd = lock_fd
        return listener

    def _listen(self) -> socket.socket:
        if self.path.exists():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(2.0)
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()  # left by a server that is gone
            else:
                raise OSError(f"a server already listens on {self.path} (stop it first, or use it)")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(16)
        self._bound = os.lstat(self.path)
        return listener

    def _still_ours(self) -> bool:
        """Whether the path is still the socket this server bound (not one put there after it)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (self._bound.st_dev, self._bound.st_ino)

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self, on_job: Callable[[dict[str, Any]], None] | None = None) -> int:
        """Serve until `stop`, a signal (SIGTERM, SIGINT) or `idle_s` without a job; the jobs served."""
        last = time.monotonic()
        try:
            while not self._stop.is_set():
                left = self.idle_s - (time.monotonic() - last)
                if left <= 0:
                    break
                if not select.select([self._listener], [], [], min(left, 0.5))[0]:
                    continue
                conn, _ = self._listener.accept()
                try:
                    self._handle(conn, on_job)
                finally:
                    conn.close()
                last = time.monotonic()
        finally:
            self.close()
        return self.served

    def _handle(self, conn: socket.socket, on_job: Callable[[dict[str, Any]], None] | None) -> None:
        from kernelwright.engine import EngineError

        pid, uid = serve_trust.peer_credentials(conn)
        # the job's line first, whoever sent it: a client reads its answer after sending, and an
        # answer written before its line arrived could meet a closed socket (a broken pipe there)
        job = next(_lines(conn, deadline=time.monotonic() + 10.0), None)
        if uid != os.getuid():
            self._answer(conn, {"refused": "this server serves its own user only"})
            return
        other = _other_namespace(pid)
        if other:  # a sandboxed child of an evaluation (bwrap, or --sandbox none's PID namespace)
            self._answer(
                conn,
                {"refused": f"this server serves clients of its own namespaces only (the client's {other} differs)"},
            )
            return
        if not isinstance(job, dict):
            return
        if job.get("stop") is True:  # `kernelwright serve --stop`, or a client of newer code replacing it
            self._answer(conn, {"stopped": os.getpid()})
            self.stop()
            return
        if job.get("stamp") != self.stamp:
            why = "the server runs other kernelwright code (stop it: kernelwright serve --stop)"
            self._answer(conn, {"refused": why, "why": "stamp"})
            return
        try:
            config = EvalConfig.from_dict(job["config"])
            problem, candidate = Path(str(job["problem"])), Path(str(job["candidate"]))
        except (KeyError, TypeError, ValueError) as exc:
            self._answer(conn, {"refused": f"malformed job ({exc})"})
            return
        if on_job is not None:
            on_job(job)

        def stage(s: str) -> None:
            try:
                _send(conn, {"stage": s})
            except OSError:
                pass  # the client is gone: the watcher below stops the evaluation

        done = threading.Event()
        gone = threading.Event()

        def watch() -> None:  # a client that goes away (Ctrl-C) takes its evaluation with it
            while not done.wait(0.2):
                if gone.is_set() or _closed_by_peer(conn):
                    gone.set()
                    if self.pool.cancel():  # (none yet where its children are still being started)
                        return

        watcher = threading.Thread(target=watch, name="kw-serve-watch", daemon=True)
        watcher.start()
        try:
            result = self.pool.evaluate(problem, candidate, config, on_stage=stage)
        except EngineError as exc:
            self._answer(conn, {"error": str(exc)})
            return
        finally:
            done.set()
            watcher.join()
        if gone.is_set():
            self.cancelled += 1
            return
        self.served += 1
        result.metadata["served"] = {"server_pid": os.getpid(), "job": self.served}
        self._answer(conn, {"result": result.to_dict()})

    @staticmethod
    def _answer(conn: socket.socket, msg: dict[str, Any]) -> None:
        try:
            _send(conn, msg)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self._listener.close()
        finally:
            try:
                if self._still_ours():
                    self.path.unlink()
            except OSError:
                pass
            os.close(self._lock_fd)  # the path is free for the next server
            self.pool.close()


def run_server(server: EvalServer, on_job: Callable[[dict[str, Any]], None] | None = None) -> int:
    """`serve_forever` with SIGTERM and SIGINT stopping it cleanly (the socket removed, the spares stopped)."""

    def _stop(*_: Any) -> None:
        server.stop()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return server.serve_forever(on_job)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str]) -> int:
    """`python -m kernelwright.executors.eval_server START.json`: the server `start_detached` asked for."""
    from kernelwright.engine import EngineError

    job_path = Path(argv[-1])
    try:
        job = json.loads(job_path.read_text())
        job_path.unlink()
        config = EvalConfig.from_dict(job["config"])
        server = EvalServer(config, spares=int(job["spares"]), idle_s=float(job["idle_s"]))
    except (OSError, ValueError, KeyError, TypeError, EngineError) as exc:
        print(f"{time.strftime('%F %T')} not started: {exc}", flush=True)
        return 1
    print(f"{time.strftime('%F %T')} pid {os.getpid()} serving {config.device} on {server.path}", flush=True)
    served = run_server(server)
    print(f"{time.strftime('%F %T')} pid {os.getpid()} stopped after {served} evaluation(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
