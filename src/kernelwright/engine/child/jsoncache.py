"""Small JSON files under the cache directory (measured device peaks, reference FLOP counts).

A missing or unreadable file reads as None; a write is atomic (temp file, then rename) so two
children never see half a file, and a cache that cannot be written is simply skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write(path: Path, data: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass
