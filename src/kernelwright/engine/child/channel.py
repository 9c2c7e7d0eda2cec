"""The child's report channel to the parent: JSON lines on an inherited pipe."""

from __future__ import annotations

import json
import os
import time
from typing import Any


class Channel:
    def __init__(self, fd: int | None, path: str | None = None):
        self.fd = fd
        if fd is None and path:  # under ncu: reports go to a file the parent reads afterwards
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)

    def send(self, kind: str, **payload: Any) -> None:
        if self.fd is None:
            return
        line = json.dumps({"type": kind, "t": time.time(), **payload}, default=str) + "\n"
        data = line.encode()
        while data:  # a pipe write may be partial for large records
            n = os.write(self.fd, data)
            data = data[n:]

    def stage(self, name: str) -> None:
        """Tell the parent a new stage starts: its own deadline applies from now on."""
        self.send("stage", stage=name)
