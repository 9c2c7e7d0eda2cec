"""Mamba-2 SSD problems at other shapes: the bundled problem's text with its shape constants replaced."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import EXAMPLES

MAMBA2 = EXAMPLES / "mamba2_ssd"


def problem_at_shape(kind: str, dest: Path, **shape: int) -> Path:
    """Write examples/mamba2_ssd/problem_{kind}.py to dest with module constants (batch_size=...) replaced."""
    text = (MAMBA2 / f"problem_{kind}.py").read_text()
    for name, value in shape.items():
        text, count = re.subn(rf"^{name} = \d+$", f"{name} = {value}", text, flags=re.MULTILINE)
        assert count == 1, f"problem_{kind}.py has no single line '{name} = ...'"
    path = dest / f"problem_{kind}_{'_'.join(f'{k}{v}' for k, v in shape.items())}.py"
    path.write_text(text)
    return path
