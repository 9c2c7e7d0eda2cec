"""The engine's one exception: an evaluation that could not run at all."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The evaluation could not run at all (not a verdict on the candidate). One line, names the fix."""
