"""The child's report channel to the parent: JSON lines on an inherited pipe."""

from __future__ import annotations

import json
import os
import time
from typing import Any


class Channel:
    def __init__(self, fd: int | None):
        self.fd = fd

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

    def record(self, record: dict[str, Any], final: bool = False) -> None:
        """Send the record as it stands; a partial one survives a later crash."""
        self.send("final" if final else "partial", record=record)
