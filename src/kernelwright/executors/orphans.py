"""Stopping what a dead worker left running.

An evaluation child runs in its own session (so that its deadline can kill its whole group),
so it outlives a worker that is killed. Left alone it would go on using its GPU, and be timed
next to the retry of its own task. Each worker is started with `KW_WORKER_TAG=<tag>` in its
environment and that name is passed to the children it starts (compilers included inherit it);
`kill_tagged(tag)` finds them in /proc and kills their process groups. Linux only; elsewhere it
finds nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

TAG_VAR = "KW_WORKER_TAG"


def tagged_pids(tag: str) -> list[int]:
    """PIDs of this user's processes whose environment holds KW_WORKER_TAG=<tag>."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_tagged(tag: str) -> list[int]:
    """SIGKILL every process (and its process group) tagged with `tag`; the PIDs found."""
    pids = tagged_pids(tag)
    for pid in pids:
        try:
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGKILL)  # the child's session: the compiler and anything it started
            else:
                os.kill(pid, signal.SIGKILL)  # never our own group
        except (ProcessLookupError, PermissionError):
            pass
    return pids
