"""How the evaluation child is isolated beyond its own process and scrubbed environment.

`none`: a child process with a scrubbed environment and private working directory.
Other modes wrap the child's command line; see `docs/SANDBOX.md`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kernelwright.config import SandboxMode


class SandboxUnavailable(RuntimeError):
    pass


def resolve(mode: SandboxMode) -> str:
    """The sandbox that will actually be used for `mode`."""
    if mode == "none":
        return "none"
    have_bwrap = shutil.which("bwrap") is not None
    if mode == "bwrap" and not have_bwrap:
        raise SandboxUnavailable("--sandbox bwrap needs bubblewrap: install it (apt-get install bubblewrap) or use --sandbox auto")
    return "none"  # bwrap wrapping lands with the sandbox work; until then auto means none


def wrap(argv: list[str], kind: str, workdir: Path, writable: list[Path]) -> list[str]:
    """The command line that runs `argv` inside sandbox `kind`."""
    return argv
