"""Directories of evaluations whose evaluator died.

An evaluation's directories (its work directory, the judge's, the runner's memory-backed output
directory on /dev/shm) are removed when it ends. An evaluator killed outright (SIGKILL, the OOM
killer, a worker the executor gave up on) removes nothing, and what it leaves on /dev/shm is
memory. Each directory is therefore named for the process that made it (`kw-eval-<pid>-...`);
`sweep()`, run once per process before its first evaluation, removes the ones whose process is
gone, of this user, untouched (nor anything directly in them) for two hours, never following a
link. The age is the margin for a process this one cannot see (another PID namespace sharing the
temporary directory): no evaluation runs that long without writing in its directory.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

PREFIXES = ("kw-eval-", "kw-judge-", "kw-out-", "kw-prebuild-")
MIN_AGE_S = 2 * 3600.0
_NAME = re.compile("^(" + "|".join(re.escape(p[:-1]) for p in PREFIXES) + r")-(\d+)-[A-Za-z0-9_]+$")
_SWEPT: list[bool] = []


def make_dir(prefix: str, dir: str | Path | None = None) -> Path:
    """A fresh private directory named for this process (`prefix` is one of PREFIXES)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dir))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def _newest(path: str, mtime: float) -> float:
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    mtime = max(mtime, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    pass
    except OSError:
        pass
    return mtime


def sweep(roots: tuple[Path, ...] | None = None, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Remove leftover evaluation directories of dead processes; the names removed."""
    roots = roots if roots is not None else (Path(tempfile.gettempdir()), Path("/dev/shm"))
    removed = []
    now = time.time()
    uid = os.getuid()
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            m = _NAME.match(name)
            if not m or int(m.group(2)) == os.getpid():
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or now - _newest(path, st.st_mtime) < min_age_s:
                continue
            if _alive(int(m.group(2))):
                continue
            shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: links inside are not followed
            removed.append(name)
    return removed


def sweep_once() -> None:
    """`sweep()` the first time a process asks, never again (cheap: two directory listings)."""
    if _SWEPT:
        return
    _SWEPT.append(True)
    try:
        sweep()
    except Exception:
        pass
