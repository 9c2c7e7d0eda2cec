"""Small JSON files under the cache directory (measured device peaks, reference FLOP counts).

A missing or unreadable file reads as None; a write is atomic (temp file, then rename) so two
children never see half a file, and a cache that cannot be written is simply skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# The judge's part of the cache directory: its measured device peaks, the reference's FLOP counts,
# its compiler caches. Every sandboxed child that runs candidate code has it read-only (the rest
# of the cache directory it can write): what the judge reads back there decides flags.
JUDGE_CACHE_SUBDIR = "judge"


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
