"""kernelwright: custom GPU kernels for PyTorch code, each proven correct and fast before it counts.

    import kernelwright as kw
    result = kw.evaluate("problem.py", "candidate.py", kw.EvalConfig(device="cpu"))
    summary = kw.optimize("problem.py", coder="openai:gpt-5", rounds=5)
    with kw.open_store() as db: db.runs()

This package's `__init__` only hands names on, lazily: the evaluation child imports
`kernelwright.engine.child` and must not pull in anything beyond torch and the standard library,
and `import kernelwright` stays instant (`api.py` holds the functions).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_NAMES = {
    "evaluate": "kernelwright.api",
    "optimize": "kernelwright.api",
    "EvalConfig": "kernelwright.core.config",
    "LoopConfig": "kernelwright.core.config",
    "ModelConfig": "kernelwright.core.config",
    "Settings": "kernelwright.core.config",
    "EvalResult": "kernelwright.core.record",
    "Status": "kernelwright.core.record",
    "open_store": "kernelwright.store.queries",
}

__all__ = [
    "EvalConfig",
    "EvalResult",
    "LoopConfig",
    "ModelConfig",
    "Settings",
    "Status",
    "__version__",
    "evaluate",
    "open_store",
    "optimize",
]  # the names of _NAMES, written out for linters

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from kernelwright.api import evaluate, optimize
    from kernelwright.core.config import EvalConfig, LoopConfig, ModelConfig, Settings
    from kernelwright.core.record import EvalResult, Status
    from kernelwright.store.queries import open_store


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernelwright' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
