"""Nested inputs and outputs (tensors inside lists, tuples and dicts), walked the same way everywhere."""

from __future__ import annotations

from typing import Any

import torch


def clone(obj: Any) -> Any:
    """A copy whose tensors are fresh clones (so neither side's in-place writes reach the other)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj
