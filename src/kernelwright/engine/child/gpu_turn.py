"""One evaluation at a time drives a GPU: the judge's turn, a lock on the device its windows time.

Two of kernelwright's evaluations on one GPU (a parallel gpu test suite, two users, two
`--no-server` evals) time-slice each other's work into their windows: six honest controls at once
on one H200 gave trusted speed-ups of 0.021x, 0.25x and 0.34x (2026-11-29, docs/PERFORMANCE.md).
So a judge takes the GPU's turn before it sends its runner the first check (`JudgeTrials.r_compiled`)
and keeps it until its record is sent: trials, guards, timing windows, other sizes and evidence run
while no other evaluation of this user drives the device. Start-up and builds run side by side, but
for the device clock's anchor, whose empty windows a judge times in a brief turn of its own at start-up.
The parent takes the same turn for a profile or compute-sanitizer's run after the judge
(`after_the_judge`), under the key the judge recorded.

The turn is an exclusive `flock` on `<dir>/<GPU's UUID>.lock`, `<dir>` = /tmp/kernelwright-<uid>/
gpu-turns (a directory of this user's, mode 0700; a sandboxed runner sees an empty /tmp). The
wait is bounded (`TimingConfig.gpu_turn_wait_s`) and outside every clock: the judge waits while
handling a report, so the coordinator stops the runner's clocks meanwhile. A judge that did not
get its turn in time goes on and says so (`shared`): its timing is then untrusted. One that could
not take a turn at all (no such directory to be had, a lock file that is not a plain file of this
user's) goes on and records why, and nothing more: that is a machine's setting, not contention.

The lock file is input, not truth: opened without following links and without blocking (a FIFO
in its place cannot hang the judge), held only if it is a plain file of this user's, and checked
again at the end of the timing stage: a lock file that was unlinked or replaced during the turn
could have let a second judge in (`replaced`). The process's end drops the lock, whatever ends it.
Imports only the standard library (torch, lazily, for the GPU's identity).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

POLL_S = 0.02  # how often a waiting judge tries the lock again


def flock_within(fd: int, wait_s: float, poll_s: float = POLL_S) -> bool:
    """An exclusive flock on `fd`, tried until it is had or `wait_s` has passed: whether it was had.
    (flock itself waits for ever or not at all.)"""
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() - t0 >= wait_s:
            return False
        time.sleep(poll_s)


def turn_dir() -> str:
    """Where this user's GPU turns live: the same path for every judge of the user on the host."""
    return os.path.join("/tmp", f"kernelwright-{os.getuid()}", "gpu-turns")


def _safe_dir(path: str) -> str:
    """'' when `path` is a directory of this user's that no one else may write (made if missing), else why not."""
    parent = os.path.dirname(path)
    for d in (parent, path):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot make {d}: {exc.strerror}"
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a directory"
        if st.st_uid != os.getuid():
            return f"{d} belongs to another user (uid {st.st_uid})"
        if st.st_mode & 0o022:
            return f"{d} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


@dataclass
class GpuTurn:
    """This judge's turn on one GPU. `key`: the GPU's identity (its UUID); `wait_s`: the most it waits."""

    key: str
    wait_s: float
    directory: str = field(default_factory=turn_dir)
    fd: int | None = None
    waited_s: float = 0.0
    held: bool = False
    why_none: str = ""  # why no turn could be taken ('' when one was, or was waited for)
    shared: str = ""  # why the device was shared while this judge drove it ('' when it was not known to be)
    _ident: tuple[int, int] | None = None

    @property
    def path(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.key)[:120] or "gpu"
        return os.path.join(self.directory, safe + ".lock")

    def take(self) -> GpuTurn:
        """Wait for the turn (at most `wait_s`); never raises."""
        if self.fd is not None or self.why_none:
            return self
        try:
            self._take()
        except OSError as exc:
            self.why_none = f"{type(exc).__name__}: {exc}"[:300]
        return self

    def _take(self) -> None:
        why = _safe_dir(self.directory)
        if why:
            self.why_none = why
            return
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            self.why_none = f"cannot open {self.path}: {exc.strerror}"
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            self.why_none = f"{self.path} is not a plain file of this user's"
            return
        self.fd, self._ident = fd, (st.st_dev, st.st_ino)
        t0 = time.monotonic()
        self.held = flock_within(fd, self.wait_s)
        self.waited_s = time.monotonic() - t0
        if not self.held:
            self.shared = (
                f"another kernelwright evaluation drove this GPU for all of the {self.waited_s:.0f} s this one waited "
                "for its turn: the windows ran beside its work"
            )
        else:
            self.shared = self.replaced()

    def replaced(self) -> str:
        """Why the turn may not have been this judge's alone ('' when its lock file is still the one it locked)."""
        if not self.held or self._ident is None:
            return ""
        try:
            st = os.lstat(self.path)
        except OSError:
            return "the GPU's turn file was removed while this judge held it: another evaluation could drive the GPU"
        if (st.st_dev, st.st_ino) != self._ident:
            return "the GPU's turn file was replaced while this judge held it: another evaluation could drive the GPU"
        return ""

    def check(self) -> str:
        """At the end of the timing stage: why the device may have been shared ('' when not known to be)."""
        if not self.shared:
            self.shared = self.replaced()
        return self.shared

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)  # (drops the flock)
            finally:
                self.fd = None

    def facts(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "held": self.held,
            "waited_s": round(self.waited_s, 3),
            "wait_limit_s": self.wait_s,
            "none": self.why_none,
            "shared": self.shared,
        }


def gpu_key(device: Any) -> str:
    """The GPU's identity, the same in every process whatever CUDA_VISIBLE_DEVICES says: its UUID
    (else its PCI address, else its index)."""
    import torch  # (lazy on purpose: the parent takes turns too, after the judge, and imports no torch)

    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid:
        return f"GPU-{uuid}"
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        return f"pci-{getattr(props, 'pci_domain_id', 0)}-{bus}-{getattr(props, 'pci_device_id', 0)}"
    return f"index-{torch.cuda.current_device() if device.index is None else device.index}"


def after_the_judge(facts: Any, wait_s: float) -> GpuTurn | None:
    """The GPU's turn for what the parent runs on it after the judge has let go (a profile under
    Nsight Compute, compute-sanitizer's run): the same lock, under the key the judge recorded
    (`facts`: its `metadata.gpu_turn`). None where the judge took no turn, or turns are off."""
    key = facts.get("key") if isinstance(facts, dict) else None
    if not isinstance(key, str) or not key or wait_s <= 0:
        return None
    return GpuTurn(key, wait_s).take()
