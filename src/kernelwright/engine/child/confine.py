"""A runner forked from the runner's zygote confines itself before any candidate code runs.

The zygote (`zygote.py`, entry `runner`) imported torch once, inside the evaluation's sandbox
(bubblewrap, or none). What an exec'd runner gets from its own bubblewrap and `unshare`, a forked
one makes here, in the fork, with the kernel's own calls:

- new user, mount, PID, IPC, network and UTS namespaces (`unshare`), the user's own ids mapped;
- the folders that hold every forked runner's directory (`covers`) hidden behind empty tmpfs
  mounts, with its own directories alone bound back: it sees no other runner's files, and
  /dev/shm is its own;
- a PID namespace whose init (PID 1, ours) runs the runner as PID 2 and reports its end as bwrap
  does (128 + N for signal N); a fresh /proc that shows only that namespace;
- resource limits; no capabilities (bounding set emptied, then capset), `no_new_privs`, and not
  dumpable (no process of the same user can read or write its memory through ptrace or /proc);
- death with its parent at every level (`PR_SET_PDEATHSIG`): the parent's kill of the fork's
  process group ends the namespace, and with its init everything in it.

`enter` returns in the confined runner (PID 2) or raises OSError before any candidate code ran
(the fork then exits with `CONFINE_FAILED`). The zygote tries it once when it starts (`probe`):
where the kernel refuses any of it, no runner is forked from that zygote and runners are exec'd.
Standard library only (the child's rule).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
from collections.abc import Callable
from typing import Any

CONFINE_FAILED = 86  # exit code of a fork that could not confine itself (nothing of the candidate ran)

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 0x4000, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_CAP_VERSION_3 = 0x20080522

_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(_c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _die_with_parent() -> None:
    _check(_c().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")


def _relay(pid: int, signal_as_code: bool) -> None:
    """Wait for `pid` and end as it ended: never returns. `signal_as_code` (the namespace's init):
    a signal N is reported as exit code 128 + N, as bwrap's init reports it; else the same signal."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(CONFINE_FAILED)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if signal_as_code:
            os._exit(128 + sig)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _namespaces(network: bool) -> None:
    uid, gid = os.geteuid(), os.getegid()
    # dumpable while it writes its own id maps (the zygote is not: a process that is not dumpable
    # does not own its /proc/self files, and a user other than root could not write them); no
    # other candidate can see it meanwhile (its own PID namespace and /proc, or another bubblewrap)
    _check(_c().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID
    if network:  # and IPC, UTS: what bwrap unshares (without it, as an exec'd runner: the host's)
        flags |= _CLONE_NEWIPC | _CLONE_NEWNET | _CLONE_NEWUTS
    _check(_c().unshare(flags), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    if network:
        _loopback_up()


def _loopback_up() -> None:
    """The new network namespace's loopback up, as bwrap leaves its own (no other interface)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH14x", b"lo", flags))  # SIOCSIFFLAGS


def _cover(cover: str, keep: list[str]) -> None:
    """An empty tmpfs over `cover`, with the directories `keep` (inside it) bound back."""
    fds = [os.open(k, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for k in keep]  # before the cover hides them
    try:
        _mount("tmpfs", cover, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        for path, fd in zip(keep, fds, strict=True):
            os.makedirs(path, mode=0o700, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
    finally:
        for fd in fds:
            os.close(fd)


def _null_over(path: str) -> None:
    """/dev/null bound over the socket at `path` (connect() then fails), where this sandbox shows one."""
    try:
        _mount("/dev/null", path, None, _MS_BIND)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):  # not there: nothing to reach
            raise


def _drop_privileges(rlimits: dict[str, int]) -> None:
    for name, limit in rlimits.items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    for cap in range(64):  # the bounding set (EINVAL past the kernel's last capability)
        if _c().prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            _check(-1, f"PR_CAPBSET_DROP {cap}")
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty (two 32-bit words each)
    _check(_c().syscall(126, header, data), "capset")  # SYS_capset on x86-64
    _check(_c().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(_c().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")


def enter(spec: dict[str, Any], placed: Callable[[], None] = lambda: None) -> None:
    """Confine this process (a fresh fork, single-threaded) as the module says; returns in the
    confined runner. `spec`: {"covers": [[cover, [keep, ...]], ...], "rlimits": {...}, "proc":
    "required" | "try", "network": bool (new network, IPC and UTS namespaces), "sockets": [path, ...]
    (covered by /dev/null)}. `placed` runs once the namespaces and mounts are made, before the
    namespace's first process: the evaluator places this process (its cgroup) then, and what it
    forks inherits that."""
    _die_with_parent()
    _namespaces(bool(spec.get("network", True)))
    # not dumpable before its namespace's first process exists (and after its id maps are written:
    # a process that is not dumpable no longer owns its /proc/self files)
    _check(_c().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    for cover, keep in spec.get("covers", []):
        _cover(str(cover), [str(k) for k in keep])
    for sock in spec.get("sockets", []):  # the host's sockets made since the sandbox started
        _null_over(str(sock))
    placed()
    init = os.fork()  # PID 1 of the new namespace
    if init:
        _relay(init, signal_as_code=False)
    _die_with_parent()
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except OSError:
        # Under bubblewrap the kernel refuses a new /proc (bwrap's own has read-only mounts over
        # parts of it): this runner then sees bwrap's, which shows the zygote and this fork alone
        # (one fork at a time), none of them its to signal (another PID namespace) or to read
        # (not dumpable). Without bubblewrap the host's /proc would show the evaluator: required.
        if spec.get("proc") == "required":
            raise
    _drop_privileges({str(k): int(v) for k, v in dict(spec.get("rlimits", {})).items()})
    runner = os.fork()  # PID 2: PID 1 ignores the signals it has no handler for (a candidate's own kill)
    if runner:
        _relay(runner, signal_as_code=True)
    _die_with_parent()


def probe(spec: dict[str, Any]) -> str:
    """'' when a fork can confine itself as `spec` asks (tried in a fork that then exits), else why not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        why = b""
        try:
            enter(spec)
        except BaseException as exc:  # noqa: BLE001 - reported to the zygote, which decides
            why = f"{type(exc).__name__}: {exc}".encode()[:500] or b"?"
        os.write(w, why or b"ok")
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        answer = f.read().decode(errors="replace")
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return "" if answer.endswith("ok") else (answer or "the probe ended without a word")
