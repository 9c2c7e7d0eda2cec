"""kernelwright: custom GPU kernels for PyTorch code, each proven correct and fast before it counts.

This package's `__init__` only hands names on, lazily: the evaluation child imports
`kernelwright.engine.child` and must not pull in anything beyond torch and the standard library.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
