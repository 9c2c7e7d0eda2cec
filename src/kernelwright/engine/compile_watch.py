"""Whether an evaluation's runner is compiling now, seen from the trusted side.

A candidate that compiles at its first call (Triton's JIT and autotuning, a C++/CUDA extension
loaded in `forward`) gets the JIT allowance only while a compile is seen to run; a call that runs
without compiling is held to the floor. Two signals, neither from the runner's own word:

- a compiler in the runner's process tree (gcc, cc1plus, nvcc, ptxas, ninja, ...) whose CPU time
  grew since the last look: a process that merely bears the name and sleeps does not count;
- the runner's private JIT caches (Triton's, inductor's, CUDA's, the extensions' folder, all in
  its own temporary folder) gaining files or newer ones since the last look.

Both can be forged by a candidate that burns a core in a process named `cc1plus` or writes files
in its own cache: that buys no more than the allowance's cap, the flat allowance there was before.
Linux /proc only; elsewhere nothing is ever seen compiling (the floor holds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from kernelwright.engine.process import process_tree

# executables that compile, as /proc/PID/comm names them (15 characters at most)
COMPILERS = frozenset(
    {
        "cc", "c++", "gcc", "g++", "cc1", "cc1plus", "as", "ld", "ld.bfd", "ld.gold", "collect2",
        "clang", "clang++", "nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "cudafe++", "ninja",
        "x86_64-linux-gn", "hipcc", "lld",
    }
)  # fmt: skip
MAX_FILES = 20_000  # a cache scan looks at this many entries at most (a flood of files is not a compile)
LOOK_EVERY_S = 0.5


def jit_dirs(env: dict[str, str]) -> list[Path]:
    """The runner's private JIT caches, from its environment: Triton's, CUDA's, inductor's (its
    own variable, else `torchinductor_*` in TMPDIR), the extensions' folder, in TMPDIR only."""
    tmp = env.get("TMPDIR")
    dirs = [env[v] for v in ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR") if env.get(v)]
    if tmp:
        dirs += [str(p) for p in Path(tmp).glob("torchinductor_*")]
        dirs += [str(Path(tmp) / "torch_extensions"), str(Path(tmp) / "inductor")]
    return [Path(d) for d in dict.fromkeys(dirs)]


def _compiler_cpu(pid: int) -> tuple[str, int] | None:
    """(comm, user + system CPU ticks) of a process that is a compiler, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    if comm not in COMPILERS:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return comm, int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (IndexError, ValueError):
        return None


def _cache_state(dirs: Iterable[Path]) -> tuple[int, float]:
    """(entries, newest mtime) over the caches' trees, up to MAX_FILES entries."""
    count, newest = 0, 0.0
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            for name in (*subdirs, *files):
                count += 1
                if count > MAX_FILES:
                    return count, newest
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except OSError:
                    continue
    return count, newest


class CompileWatch:
    """Looks (at most every LOOK_EVERY_S) at a runner's process tree and JIT caches; `last_seen`
    is the monotonic time a compile was last seen running (None: never)."""

    def __init__(self, pid: int, dirs: list[Path]) -> None:
        self.pid, self.dirs = pid, dirs
        self.last_seen: float | None = None
        self.seen: list[str] = []  # what was seen compiling (for the record), in order, once each
        self._cpu: dict[int, int] = {}
        self._cache = _cache_state(dirs)
        self._looked = 0.0

    def look(self, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        if now - self._looked < LOOK_EVERY_S:
            return self.last_seen
        self._looked = now
        cpu: dict[int, int] = {}
        for pid, _ in process_tree(self.pid)[1:]:  # what the runner started, not the runner itself
            seen = _compiler_cpu(pid)
            if seen is None:
                continue
            comm, ticks = seen
            cpu[pid] = ticks
            if ticks > self._cpu.get(pid, 0):  # at work since the last look (or new, and already at work)
                self._saw(now, comm)
        self._cpu = cpu
        cache = _cache_state(self.dirs)
        if cache != self._cache:
            self._cache = cache
            self._saw(now, "jit cache")
        return self.last_seen

    def _saw(self, now: float, what: str) -> None:
        self.last_seen = now
        if what not in self.seen:
            self.seen.append(what)
