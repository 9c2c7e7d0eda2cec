"""How the evaluation child is isolated beyond its own process and scrubbed environment.

`none`: a child process with a scrubbed environment and private working directory.
`bwrap`: the same child inside bubblewrap: the whole system read-only, $HOME, /tmp and the socket
directories (/run, /var/run) hidden behind empty read-only mounts (the Python installation and
the package re-exposed read-only), every other Unix socket of the host covered by /dev/null,
only the evaluation's own directory and what the caller names writable (never the cache as a
whole: `environment.candidate_writable`; read-only parts inside: `read_only`), no network (a private network
namespace), a minimal /dev plus the GPU device nodes, its own PID/IPC/UTS namespaces, no
capabilities, and death with its parent. `auto`: bwrap when it is installed and a trivial
command runs under it, else none. See docs/SANDBOX.md for what this protects and what it does not.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kernelwright.core.config import ResolvedSandbox, SandboxMode


class SandboxUnavailable(RuntimeError):
    pass


def resolve(mode: SandboxMode) -> ResolvedSandbox:
    """The sandbox that will actually be used for `mode` (called at the entry points, through
    `kernelwright.engine.config_resolution`)."""
    if mode not in ("auto", "bwrap", "none"):
        raise SandboxUnavailable(f"--sandbox must be auto, bwrap or none (got {mode!r})")
    if mode == "none":
        return "none"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        if mode == "bwrap":
            raise SandboxUnavailable(
                "--sandbox bwrap needs bubblewrap: install it (apt-get install bubblewrap) or use --sandbox auto"
            )
        return "none"
    problem = _bwrap_problem(bwrap)
    if problem:
        if mode == "bwrap":
            raise SandboxUnavailable(
                f"bubblewrap cannot run here ({problem}); allow unprivileged user namespaces or use --sandbox none"
            )
        return "none"
    return "bwrap"


@functools.lru_cache(maxsize=4)
def _bwrap_problem(bwrap: str) -> str:
    """'' when bwrap runs a trivial command with the evaluation's options, else why not (checked once)."""
    with tempfile.TemporaryDirectory(prefix="kw-bwrap-check-") as d:
        argv = _bwrap_argv(bwrap, Path(d), [Path(d)]) + ["true"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=d)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{type(exc).__name__}: {exc}"
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
    return ""


def _python_paths() -> list[str]:
    """Directories the child's Python needs to read: the installation, site-packages, this package."""
    import kernelwright

    paths = {
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        str(Path(kernelwright.__file__).resolve().parent.parent),
        str(Path(kernelwright.__file__).resolve().parent),  # alone, where its parent is a hidden directory
    }
    paths.update(p for p in sys.path if p)
    return sorted(p for p in paths if os.path.isdir(p))


def _bwrap_argv(
    bwrap: str, workdir: Path, writable: list[Path], read_only: Sequence[Path] = (), nested_user: bool = False
) -> list[str]:
    argv = [bwrap]
    if nested_user:  # the runner's zygote: its forks make user namespaces of their own (confine.py),
        # which may map only a uid other than 0 without capabilities: root runs as another uid inside
        argv += ["--unshare-user"] + (["--uid", "1000", "--gid", "1000"] if os.geteuid() == 0 else [])
    argv += [
        "--die-with-parent",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/dev/shm",
    ]
    for node in sorted(glob.glob("/dev/nvidia*")):  # GPU device nodes only (nvidiactl, nvidia0.., uvm, caps)
        argv += ["--dev-bind", node, node]
    hidden = _hidden_dirs()
    for h in hidden:
        argv += ["--tmpfs", h]
    # what the child must still read, if it sat under a hidden directory
    exposed: list[str] = []
    for rp in sorted({os.path.realpath(p) for p in _python_paths()}, key=len):
        if any(rp == e or rp.startswith(e.rstrip("/") + "/") for e in exposed):
            continue  # already visible through a parent
        if any(h == rp or h.startswith(rp.rstrip("/") + "/") for h in hidden):
            # a hidden directory itself, or one above it (a script run from /tmp or $HOME puts it on the
            # caller's sys.path): bound, it would unhide all of it, other evaluations' GPU turns and
            # directories and the caller's secrets included; what the child needs under it is bound alone
            continue
        if any(rp == h or rp.startswith(h.rstrip("/") + "/") for h in hidden):
            argv += ["--ro-bind", rp, rp]
            exposed.append(rp)
    for w in [workdir, *writable]:
        rw = os.path.realpath(w)
        argv += ["--bind", rw, rw]
    for r in read_only:  # read-only inside a writable directory (the shared build cache)
        ro = os.path.realpath(r)
        argv += ["--ro-bind", ro, ro]
    # The host's Unix sockets that are still visible: a read-only mount does not stop connect(),
    # so each is covered by /dev/null (connect() then fails with ECONNREFUSED). Those in the
    # writable directories too; only the child's own directory, made for it, has none of the host's.
    for sock in sockets_to_cover(workdir, writable, read_only):
        argv += ["--ro-bind", "/dev/null", sock]
    for h in hidden:
        argv += ["--remount-ro", h]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
    argv += ["--chdir", os.path.realpath(workdir)]
    return argv


def _hidden_dirs() -> list[str]:
    """What the sandbox hides behind empty mounts: /tmp, /var/tmp, the socket folders, $HOME."""
    hidden = ["/tmp", "/var/tmp", *_SOCKET_DIRS]
    home = os.path.expanduser("~")
    if home not in ("/", "") and os.path.isdir(home):
        hidden.append(os.path.realpath(home))
    return [h for h in dict.fromkeys(os.path.realpath(h) for h in hidden) if os.path.isdir(h)]


def sockets_to_cover(workdir: Path, writable: Sequence[Path], read_only: Sequence[Path] = ()) -> list[str]:
    """The host's Unix sockets a sandbox with these directories would still show (each is then
    covered by /dev/null). Read now: a long-lived sandbox (the runner's zygote) covers at each fork
    the sockets made since it started (`engine/child/confine.py`)."""
    hidden = _hidden_dirs()
    keep = [os.path.realpath(workdir), "/dev", "/proc", "/sys"]  # its own /dev and /proc
    shown = [os.path.realpath(p) for p in [*writable, *read_only]]  # bound back, under a hidden directory or not
    return [
        sock
        for sock in host_unix_sockets()
        if (_under(sock, shown) or not _under(sock, hidden)) and not _under(sock, keep)
    ]


# Where daemons put their sockets (D-Bus, systemd, docker, nvidia-persistenced, databases): hidden
# behind empty tmpfs mounts. Nothing the child needs lives there (nvidia-persistenced's socket
# is optional: without it the driver initialises the GPU itself).
_SOCKET_DIRS = ("/run", "/var/run")


def host_unix_sockets() -> list[str]:
    """Paths of the Unix sockets bound in this network namespace (from /proc/net/unix), that exist.

    Read at every wrap, not cached: a socket made after the first evaluation is covered too.
    Abstract sockets (no path) need nothing: they belong to a network namespace, and the child has
    its own (--unshare-net). Sockets of other network namespaces are not listed; /run and /var/run
    are hidden whatever is listed.
    """
    try:
        lines = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return []
    paths = set()
    for line in lines:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith("/"):
            paths.add(parts[7])
    return sorted(p for p in paths if _is_socket(p))


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def wrap(
    argv: list[str],
    kind: str,
    workdir: Path,
    writable: list[Path],
    read_only: Sequence[Path] = (),
    nested_user: bool = False,
) -> list[str]:
    """The command line that runs `argv` inside sandbox `kind` (bwrap or none: "auto" was resolved at
    the entry point); `read_only` may lie inside `writable`. `nested_user`: its processes may make
    user namespaces of their own (the runner's zygote)."""
    if kind == "none":
        return argv
    if kind == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap disappeared; install it or use --sandbox none")
        return _bwrap_argv(bwrap, workdir, writable, read_only, nested_user) + ["--"] + argv
    raise SandboxUnavailable(
        f"sandbox {kind!r} reached the engine unresolved; resolve the configuration first "
        "(kernelwright.engine.config_resolution)"
    )


def child_exit_code(code: int | None) -> int | None:
    """bwrap reports a child killed by signal N as exit code 128 + N: give it back as -N, as Popen does."""
    if code is not None and 128 < code < 128 + 65:
        return -(code - 128)
    return code
