"""Where `kernelwright serve` listens, and how each side tells the other is what it claims.

The socket's folder is one no evaluation's sandbox binds: `$XDG_RUNTIME_DIR/kernelwright` (a
private folder of the user's, hidden under bubblewrap's empty /run), else `<tmp>/kw-serve-<uid>`
(hidden under bubblewrap's empty /tmp), never inside the kernelwright cache, which the runner's
sandbox binds writable. With `--sandbox none` a candidate runs as the user and can write there
too: the client then trusts a server only after `verify_server`, and the server serves only a
client of its own namespaces (`other_namespace`).

A server is trusted when the peer that listens (`SO_PEERCRED`, the kernel's word) is of the
client's uid; lives in the client's PID, mount, network and user namespaces (an evaluation's
candidate runs in namespaces of its own, bubblewrap's or `unshare`'s); neither it nor any of its
ancestors carries an evaluation's marker (`KW_EVAL_ID`, set in every evaluation child's
environment); and runs this Python with `kernelwright serve` or
`-m kernelwright.executors.eval_server` as its command line.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import sys
import tempfile
from pathlib import Path

from kernelwright.core.config import default_cache_dir

EVAL_MARKER = b"KW_EVAL_ID="  # engine/isolation/containment.py's MARKER_VAR, in a process's environ
NAMESPACES = ("pid", "mnt", "net", "user")


def _private_to_us(folder: Path) -> bool:
    """A real folder (not a link) of this uid that no other user or group may enter or write."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _inside(path: Path, folder: Path) -> bool:
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f.rstrip("/") + "/")


def serve_dir() -> Path:
    """The folder of the servers' sockets, start files and logs (made by `private_dir`)."""
    cache = default_cache_dir()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _private_to_us(Path(runtime)) and not _inside(Path(runtime), cache):
        return Path(runtime) / "kernelwright"
    tmp = Path(tempfile.gettempdir())
    if _inside(tmp, cache):
        tmp = Path("/tmp")
    return tmp / f"kw-serve-{os.getuid()}"


def private_dir(folder: Path) -> None:
    """Make `folder` (mode 0700), or check the one there: a real folder of this uid, which is then
    tightened to 0700. A folder of another user (made in /tmp before us) or a link is refused:
    whoever made it could replace our socket."""
    try:
        folder.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(
            f"{folder} is not a folder of this user's (uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
            "remove it, or set XDG_RUNTIME_DIR to a private folder of yours"
        )
    os.chmod(folder, 0o700)  # mkdir's mode passes through the umask


def other_namespace(pid: int) -> str:
    """The first of `pid`'s namespaces that is not this process's ('' where all are the same; the
    first name where it cannot be read)."""
    for ns in NAMESPACES:
        try:
            if pid <= 0 or os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"):
                return ns
        except OSError:
            return ns
    return ""


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel took them at connect or listen;
    (0, -1) where the kernel does not say."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return 0, -1
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def _ancestry(pid: int) -> list[int]:
    """`pid` and its ancestors up to (not including) PID 1."""
    chain: list[int] = []
    while pid > 1 and pid not in chain and len(chain) < 256:
        chain.append(pid)
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat_line.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _in_an_evaluation(pid: int) -> bool:
    """Whether `pid` or an ancestor carries an evaluation's marker. An environ of this uid's that
    cannot be read counts (a process can make itself undumpable); another user's (a login's sshd)
    does not."""
    for p in _ancestry(pid):
        try:
            env = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            try:
                if os.stat(f"/proc/{p}").st_uid == os.getuid():
                    return True
            except OSError:
                pass
            continue
        if env.startswith(EVAL_MARKER) or b"\0" + EVAL_MARKER in env:
            return True
    return False


def is_serve_command(argv: list[str]) -> bool:
    """Whether a command line is a server's: `python -m kernelwright.executors.eval_server START`
    (`start_detached`), or `kernelwright serve` (the console script, or `-m kernelwright.cli.main`)."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == "kernelwright.executors.eval_server":
        return True
    for i, arg in enumerate(argv[:4]):
        if os.path.basename(arg) == "kernelwright" or arg == "kernelwright.cli.main":
            return "serve" in argv[i + 1 :]
    return False


def verify_server(conn: socket.socket) -> str:
    """'' where the listening peer of `conn` is a trusted server (module docstring), else why not."""
    pid, uid = peer_credentials(conn)
    if uid != os.getuid():
        return f"it runs as uid {uid}, not this user's"
    if pid == os.getpid():  # a server this process runs itself (a library caller's, a test's)
        return ""
    other = other_namespace(pid)
    if other:
        return f"its {other} namespace is not this process's (a sandboxed evaluation's process)"
    if _in_an_evaluation(pid):
        return "it runs inside an evaluation (it or a parent carries an evaluation's marker)"
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "its executable cannot be read"
    if exe != os.path.realpath(sys.executable):
        return f"it runs {exe}, not this Python ({os.path.realpath(sys.executable)})"
    if not is_serve_command([a for a in argv if a] or [""]):
        return f"its command line is not kernelwright serve's ({' '.join(argv)[:120]!r})"
    return ""
