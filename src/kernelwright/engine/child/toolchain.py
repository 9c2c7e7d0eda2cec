"""The compiler's own word on its version, for the keys of what it builds (the build cache's
toolchain fingerprint, a precompiled header's key)."""

from __future__ import annotations

import subprocess


def tool_version(cmd: str) -> str:
    """The last line `cmd --version` prints; "" where it prints nothing, "absent" where it cannot run."""
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[-1] if (out.stdout or out.stderr) else ""
    except (OSError, subprocess.SubprocessError):
        return "absent"
