"""Containment of the evaluation child that needs no extra tool: limits, a PID namespace, a sweep.

`sandbox.py` decides *where* the child runs (bubblewrap or not); this module adds what holds in
every mode, checked once per process and recorded in each result (`metadata["isolation"]`):

- **Parent-death signal**: the child is SIGKILLed when the evaluator dies (`PR_SET_PDEATHSIG`).
  The kernel ties it to the *thread* that started the child: evaluate on a thread that outlives
  the evaluation (a pool's worker does).
- **A PID namespace** (`sandbox none`; bwrap has its own): the child runs under
  `unshare --pid --fork --kill-child --mount-proc` (plus `--user --map-current-user` when not
  root), with a small shell as the namespace's init. With a private /proc the candidate sees only
  its own processes: not `/proc/<evaluator>/environ`, not the evaluator to signal. When the
  child ends, the namespace's init ends and the kernel kills everything left in it (a `setsid`
  grandchild included). As root, the capability bounding set is emptied (`setpriv`) after the
  namespace is made, so the candidate runs as a root without capabilities.
- **Resource limits** (`setrlimit` in the child before it execs): `RLIMIT_CORE` 0, `RLIMIT_FSIZE`
  (no single file above FILE_SIZE_LIMIT_MB), and the memory limit (`EvalConfig.memory_limit_mb`):
  `RLIMIT_AS` for a CPU evaluation; not for CUDA, whose driver reserves far more address space
  than any limit worth setting, so a CUDA evaluation is limited only by a cgroup. `RLIMIT_NPROC`
  is not used: it counts every process of the user, not the child's tree, so it would fail the
  child when the user runs other things (and does nothing for root).
- **A cgroup** where a writable one exists (v2, or v1's memory/pids hierarchies, as root in a
  container): the child's memory (resident, so it works with CUDA) and process count are limited
  there, and everything in it is killed at the end.
- **A sweep**, always, as a last resort: every process whose environment carries this
  evaluation's `KW_EVAL_ID` marker is killed when the evaluation ends. It catches what escapes a
  process-group kill where neither a namespace nor a cgroup is available (a candidate that
  re-execs with a cleaned environment evades it; the notes say when only the sweep was in force).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import resource
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER_VAR = "KW_EVAL_ID"
FILE_SIZE_LIMIT_MB = 8192  # a PCH is a few hundred MB; nothing an evaluation writes comes near this
PIDS_LIMIT = 4096  # threads count too (a build runs ninja jobs, torch runs a thread pool per core)
_PR_SET_PDEATHSIG = 1
_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Isolation:
    """What confines one evaluation child, decided by the parent before the child starts."""

    eval_id: str
    sandbox: str  # "bwrap" | "none"
    pid_namespace: bool = False  # a private PID namespace and /proc (unshare, or bwrap's own)
    pdeathsig: bool = True
    caps_dropped: bool = False
    rlimits: dict[str, int] = field(default_factory=dict)  # RLIMIT_* name -> limit (bytes or count)
    memory_limit_mb: int | None = None
    memory_mechanism: str = "none"  # "RLIMIT_AS" | "cgroup" | "RLIMIT_AS+cgroup" | "none"
    cgroups: list[str] = field(default_factory=list)  # directories created for this child (emptied at cleanup)
    cgroup: bool = False  # the child ran in a cgroup of its own
    prefix: list[str] = field(default_factory=list)  # the command run before the child's own
    notes: list[str] = field(default_factory=list)
    oom_kills: int = 0  # the cgroup's OOM kills, read at cleanup
    swept: int = 0  # processes killed by the marker sweep
    _parent_pid: int = 0

    # ---- start ---------------------------------------------------------------------------
    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside what this isolation adds (the PID namespace)."""
        return self.prefix + argv if self.prefix else argv

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, MARKER_VAR: self.eval_id}

    def preexec(self) -> None:
        """Runs in the forked child before exec: only system calls, every value computed before the fork."""
        if self.pdeathsig:
            _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != self._parent_pid:  # the evaluator died before the prctl
                os._exit(1)
        for name, limit in self.rlimits.items():
            resource.setrlimit(getattr(resource, name), (limit, limit))
        pid = str(os.getpid()).encode()
        for cg in self.cgroups:
            fd = os.open(os.path.join(cg, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    # ---- end -----------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Kill whatever of the child is left (its cgroup, then the marker sweep) and remove the cgroups."""
        for cg in self.cgroups:
            self.oom_kills += _oom_kills(cg)
            _kill_cgroup(cg)
        self.cgroups = [cg for cg in self.cgroups if not _rmdir(cg)]
        self.swept += sweep(self.eval_id)

    def describe(self) -> dict[str, Any]:
        """The record's `metadata["isolation"]`: what was in force."""
        return {
            "sandbox": self.sandbox,
            "pid_namespace": self.pid_namespace,
            "pdeathsig": self.pdeathsig,
            "caps_dropped": self.caps_dropped,
            "rlimits": dict(self.rlimits),
            "cgroup": self.cgroup,
            "memory_limit_mb": self.memory_limit_mb,
            "memory_mechanism": self.memory_mechanism,
            "swept_processes": self.swept,
            "notes": list(self.notes),
        }

    def memory_note(self, error_log: str) -> str:
        """A sentence naming the memory limit when a failure looks like the child ran into it, else ''."""
        if not self.memory_limit_mb:
            return ""
        hit = self.oom_kills > 0 or any(s in error_log for s in _HOST_OOM_SIGNS)
        if not hit:
            return ""
        how = "killed by the kernel's OOM killer in its cgroup" if self.oom_kills else "an allocation failed"
        return (
            f"The evaluation's memory limit is {self.memory_limit_mb} MiB ({self.memory_mechanism}; "
            f"EvalConfig.memory_limit_mb) and the candidate ran into it: {how}."
        )


def annotate(result: Any, iso: Isolation | None) -> None:
    """Record what isolation was in force on `result` (an EvalResult), and name the memory limit
    first in the error of a failure that ran into it."""
    if iso is None:
        return
    result.metadata["isolation"] = iso.describe()
    note = iso.memory_note(result.error_log or "")
    if note and result.status.value != "passed":
        result.error_log = note + ("\n\n" + result.error_log if result.error_log else "")


_HOST_OOM_SIGNS = ("MemoryError", "Cannot allocate memory", "can't allocate memory", "std::bad_alloc")


def prepare(device: str, sandbox: str, memory_limit_mb: int | None) -> Isolation:
    """The isolation for one child of an evaluation on `device` in `sandbox` (both resolved at the
    entry point: "auto" is an error here)."""
    if device not in ("cuda", "cpu") or sandbox not in ("bwrap", "none"):
        raise ValueError(f"isolation for device {device!r}, sandbox {sandbox!r}: resolve the configuration first")
    iso = Isolation(eval_id=secrets.token_hex(12), sandbox=sandbox, _parent_pid=os.getpid())
    _libc()  # loaded here: the forked child only calls it
    limit = auto_memory_limit_mb() if memory_limit_mb is None else (memory_limit_mb or None)
    iso.memory_limit_mb = limit
    iso.rlimits = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": FILE_SIZE_LIMIT_MB << 20}
    cuda = device == "cuda"
    mechanisms = []
    if limit and not cuda:
        iso.rlimits["RLIMIT_AS"] = limit << 20
        mechanisms.append("RLIMIT_AS")
    iso.cgroups, why_not = _make_cgroups(iso.eval_id, limit)
    iso.cgroup = bool(iso.cgroups)
    if (
        any(os.path.exists(os.path.join(cg, f)) for cg in iso.cgroups for f in ("memory.max", "memory.limit_in_bytes"))
        and limit
    ):
        mechanisms.append("cgroup")
    elif why_not:
        iso.notes.append(f"no cgroup: {why_not}")
    iso.memory_mechanism = "+".join(mechanisms) or "none"
    if limit and not mechanisms:
        iso.notes.append(
            "no memory limit: RLIMIT_AS would break CUDA's address-space reservations and no writable cgroup was found"
        )
        iso.memory_limit_mb = None
    if not any(cg for cg in iso.cgroups if os.path.exists(os.path.join(cg, "pids.max"))):
        iso.notes.append(
            "no process-count limit (RLIMIT_NPROC counts all of the user's processes; no writable pids cgroup)"
        )
    if sandbox == "bwrap":
        iso.pid_namespace = iso.caps_dropped = True  # bwrap's --unshare-pid, its own /proc, --cap-drop ALL
    else:
        prefix, why_not = pid_namespace_prefix()
        if prefix:
            iso.prefix, iso.pid_namespace = prefix, True
            iso.caps_dropped = "setpriv" in " ".join(prefix)
        else:
            iso.notes.append(
                f"no PID namespace ({why_not}): the candidate can see and signal the "
                "user's other processes; leftovers are found by the marker sweep"
            )
    return iso


def auto_memory_limit_mb() -> int:
    """The default memory limit: three quarters of the machine's RAM."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16384
    return max(2048, int(total * 3 / 4) >> 20)


# ---- the PID namespace ----------------------------------------------------------------------

# The namespace's init: a shell that runs the child as its own child (PID 2) and exits with its
# status (128+N for a signal, as bwrap reports it). The child must not be PID 1 itself: PID 1
# ignores the signals it has no handler for (a candidate's os.kill(os.getpid(), SIGSEGV) would
# do nothing), and the `; exit` keeps the shell from exec-ing the command in its place.
_INIT = ["/bin/sh", "-c", '"$@"; exit $?', "kw-init"]


@functools.lru_cache(maxsize=1)
def pid_namespace_prefix() -> tuple[list[str], str]:
    """(the command prefix that runs a child in a fresh PID namespace, '') or ([], why not). Checked once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [], "unshare is not installed"
    base = [unshare, "--pid", "--fork", "--kill-child", "--mount-proc"]
    tries = [base] if os.geteuid() == 0 else []
    tries.append([unshare, "--user", "--map-current-user", *base[1:]])
    problem = ""
    # inside, the checking process must not see this one (a private /proc)
    probe = ["/bin/sh", "-c", f"test ! -e /proc/{os.getpid()}/environ" if os.getpid() > 64 else "true"]
    setpriv = shutil.which("setpriv")
    for cmd in tries:
        drop = (
            [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]
            if setpriv and (os.geteuid() == 0 or "--user" in cmd)
            else []
        )
        prefix = [*cmd, "--", *drop, *_INIT]
        try:
            out = subprocess.run(prefix + probe, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            continue
        if out.returncode == 0:
            return prefix, ""
        problem = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
    return [], problem


# ---- cgroups --------------------------------------------------------------------------------


def _make_cgroups(eval_id: str, limit_mb: int | None) -> tuple[list[str], str]:
    """Create this child's cgroup(s) with the memory and pids limits: (directories, why none)."""
    parents, why = _cgroup_parents()
    made: list[str] = []
    for kind, parent in parents:
        path = os.path.join(parent, f"kw-{eval_id}")
        try:
            os.mkdir(path)
        except OSError as exc:
            why = why or f"cannot create a cgroup under {parent}: {exc.strerror}"
            continue
        made.append(path)
        try:
            if kind == "v2":
                if limit_mb and os.path.exists(os.path.join(path, "memory.max")):
                    _write(os.path.join(path, "memory.max"), str(limit_mb << 20))
                    if os.path.exists(os.path.join(path, "memory.swap.max")):
                        _write(os.path.join(path, "memory.swap.max"), "0")
                if os.path.exists(os.path.join(path, "pids.max")):
                    _write(os.path.join(path, "pids.max"), str(PIDS_LIMIT))
            elif kind == "memory" and limit_mb:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_mb << 20))
            elif kind == "pids":
                _write(os.path.join(path, "pids.max"), str(PIDS_LIMIT))
        except OSError as exc:
            why = f"cannot set limits in {path}: {exc.strerror}"
    return made, ("" if made else why)


@functools.lru_cache(maxsize=1)
def _cgroup_parents() -> tuple[list[tuple[str, str]], str]:
    """Writable cgroup directories to create children under: [(kind, dir)], or ([], why not). Checked once.

    v2: this process's own cgroup, when it delegates the memory (or pids) controller to its
    children. v1: this process's cgroup in the memory and pids hierarchies.
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return [], f"cannot read /proc/self/cgroup: {exc.strerror}"
    own = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else ["v2"]:
            own[c] = path
    found: list[tuple[str, str]] = []
    v2_mount = next((m for m in (_CGROUP_ROOT, _CGROUP_ROOT / "unified") if (m / "cgroup.controllers").exists()), None)
    if v2_mount is not None and "v2" in own:
        d = str(v2_mount) + own["v2"].rstrip("/")
        delegated = _read(os.path.join(d, "cgroup.subtree_control")).split()
        if {"memory", "pids"} & set(delegated) and os.access(d, os.W_OK):
            found.append(("v2", d))
    if not found:
        for kind in ("memory", "pids"):
            d = str(_CGROUP_ROOT / kind) + own.get(kind, "/").rstrip("/")
            if kind in own and os.path.isdir(d) and os.access(d, os.W_OK):
                found.append((kind, d))
    if not found:
        return [], "no writable cgroup with the memory or pids controller (cgroup v2 needs a delegated subtree)"
    return found, ""


def _oom_kills(cg: str) -> int:
    for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
        for line in _read(os.path.join(cg, name)).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1])
    return 0


def _kill_cgroup(cg: str) -> None:
    kill = os.path.join(cg, "cgroup.kill")
    if os.path.exists(kill):
        try:
            _write(kill, "1")
        except OSError:
            pass
    for _ in range(50):  # v1 has no cgroup.kill: kill what is listed until nothing is (a fork may race)
        pids = [int(p) for p in _read(os.path.join(cg, "cgroup.procs")).split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def _rmdir(cg: str) -> bool:
    for _ in range(50):  # a killed process leaves its cgroup only once it is reaped
        try:
            os.rmdir(cg)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


# ---- the marker sweep -----------------------------------------------------------------------


def sweep(eval_id: str) -> int:
    """SIGKILL every process of this user whose environment carries this evaluation's marker; how many."""
    marker = f"{MARKER_VAR}={eval_id}".encode()
    killed = 0
    for _ in range(3):  # a process may fork while it is being swept
        found = 0
        for env_path in glob.glob("/proc/[0-9]*/environ"):
            try:
                with open(env_path, "rb") as f:
                    env = f.read()
            except OSError:
                continue  # gone, or not ours
            if marker in env.split(b"\0"):
                pid = int(env_path.split("/")[2])
                if pid == os.getpid():
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    found += 1
                except (ProcessLookupError, PermissionError):
                    pass
        killed += found
        if not found:
            break
        time.sleep(0.05)
    return killed


# ---- helpers --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
