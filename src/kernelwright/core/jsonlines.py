"""Reading JSON lines from a process that may be hostile: bounded lines, linear parsing.

`LineReader.feed(chunk)` returns the complete messages in `chunk` (dicts only; anything else is
dropped and counted). A line longer than `max_line` bytes is an overflow: the reader stops
accepting input from that peer (the caller decides what an overflow means). Each byte is scanned
once: the search for the next newline starts where the previous search ended.
"""

from __future__ import annotations

import json
from typing import Any

MAX_LINE = 1 << 20  # 1 MiB: records and messages are far smaller; outputs travel as files


class LineReader:
    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already known to hold no newline
        self.overflow = False
        self.dropped = 0  # lines that were not a JSON object

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        if self.overflow:
            return []
        self._buf += chunk
        out: list[dict[str, Any]] = []
        start = 0
        while True:
            nl = self._buf.find(b"\n", max(start, self._scanned))
            if nl < 0:
                break
            line = bytes(self._buf[start:nl])
            start = nl + 1
            self._scanned = start
            try:
                msg = json.loads(line)
            except ValueError:
                self.dropped += 1
                continue
            if isinstance(msg, dict):
                out.append(msg)
            else:
                self.dropped += 1
        if start:
            del self._buf[:start]
        self._scanned = len(self._buf)
        if len(self._buf) > self.max_line:
            self.overflow = True
            self._buf = bytearray()
        return out
