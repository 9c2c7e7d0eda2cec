"""The evaluation engine: build, check, time (and profile) a candidate in an isolated child.

Names are handed on lazily so that the child, which imports `kernelwright.engine.child`,
never loads the parent-side modules.
"""

from __future__ import annotations

__all__ = ["evaluate", "EngineError", "prestart", "WarmEvaluator"]


def __getattr__(name: str):
    if name == "EngineError":
        from kernelwright.engine.errors import EngineError

        return EngineError
    if name in __all__:
        from kernelwright.engine import evaluation as _evaluation

        return getattr(_evaluation, name)
    raise AttributeError(name)
