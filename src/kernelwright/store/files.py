"""Writing a run's files: whole (a reader or a crash never sees half a file) and readable by
others (0644, as `problem.py` is), since none of them holds a secret: keys stay in the environment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PUBLIC = 0o644


def write_public(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file in the same folder, then a rename), mode 0644."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, PUBLIC)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
