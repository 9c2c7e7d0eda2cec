"""Text from a candidate, made safe to show: control characters written out, never sent.

A record's strings come in large part from the candidate's process (its exception messages, its
output, the compiler's output on its sources). Shown on a terminal as they are, an escape sequence
in them moves the cursor, rewrites lines already printed (a verdict line, say) or sets the window
title; rich passes ESC through. Every control character but tab and newline (C0, DEL, C1) becomes
its `\\xNN` spelling, so the text still says what was there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def map_strings(obj: Any, fn: Callable[[str], str]) -> Any:
    """`obj` (a string, or JSON-like data: dicts, lists, tuples) with `fn` applied to every string, keys too."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_strings(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(map_strings(v, fn) for v in obj)
    return obj


def _written_out(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text) if _CONTROL.search(text) else text


def printable(obj: Any) -> Any:
    """`obj` (a string, or JSON-like data) with every control character but \\t and \\n written out."""
    return map_strings(obj, _written_out)
