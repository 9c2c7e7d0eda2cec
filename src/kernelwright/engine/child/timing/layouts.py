"""Where a window's sets lie in a region lent to the other process: `Layout`, one `[kind, offset,
dtype, shape]` row per leaf, sets every `stride` bytes, every tensor on an `ALIGN` boundary. Both
sides read it (the judge writes it, the runner maps by it); `WindowError` is the one error a window
raises when it cannot run as planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kernelwright.engine.child import shared_region
from kernelwright.engine.child.compare import flatten
from kernelwright.engine.child.wire import _DTYPES  # (the dtypes that may cross the boundary)

ALIGN = 256  # every tensor of a set starts on this byte boundary (any dtype, any vector width)
_REGION_IDS = [0]


def _next_region_id() -> int:
    """A fresh id for a region lent to another process (unique in this process: a peer's mapping
    of an earlier region is never taken for a new one)."""
    _REGION_IDS[0] += 1
    return _REGION_IDS[0]


class WindowError(RuntimeError):
    """The window could not run as planned (the problem's inputs or outputs do not fit it)."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@dataclass
class Layout:
    """Where each leaf of one set lies in a region: `[kind, offset, dtype, shape]` for a tensor,
    `["value", v]` for a plain argument. Sets follow each other every `stride` bytes."""

    leaves: list[list[Any]]
    stride: int

    @staticmethod
    def of_inputs(inputs: list[Any]) -> Layout:
        leaves: list[list[Any]] = []
        off = 0
        for x in inputs:
            if isinstance(x, torch.Tensor):
                if _dtype_name(x.dtype) not in _DTYPES:
                    raise WindowError(f"an input of dtype {x.dtype} cannot be shared")
                leaves.append(["tensor", off, _dtype_name(x.dtype), list(x.shape)])
                off += _align(x.numel() * x.element_size())
            elif x is None or isinstance(x, (bool, int, float, str)):
                leaves.append(["value", x])
            else:
                raise WindowError(f"an input of type {type(x).__name__} cannot be shared (tensors and numbers only)")
        return Layout(leaves, max(off, ALIGN))

    @staticmethod
    def of_outputs(out: Any) -> Layout:
        leaves: list[list[Any]] = []
        off = 0
        for _, x in flatten(out):
            if not isinstance(x, torch.Tensor) or _dtype_name(x.dtype) not in _DTYPES:
                raise WindowError("the reference returns something other than tensors: no output slots")
            leaves.append(["tensor", off, _dtype_name(x.dtype), list(x.shape)])
            off += _align(x.numel() * x.element_size())
        return Layout(leaves, max(off, ALIGN))

    def to_json(self) -> dict[str, Any]:
        return {"leaves": self.leaves, "stride": self.stride}

    @staticmethod
    def from_json(raw: Any, max_bytes: int) -> Layout:
        """A layout from the other process, checked: known dtypes, offsets inside the stride."""
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("leaves"), list)
            or not isinstance(raw.get("stride"), int)
        ):
            raise WindowError("malformed layout")
        stride = raw["stride"]
        if not 0 < stride <= max_bytes:
            raise WindowError("layout stride out of range")
        leaves = []
        for leaf in raw["leaves"][:256]:
            if isinstance(leaf, list) and leaf and leaf[0] == "value" and len(leaf) == 2:
                leaves.append(leaf)
                continue
            if not (
                isinstance(leaf, list)
                and len(leaf) == 4
                and leaf[0] == "tensor"
                and leaf[2] in _DTYPES
                and isinstance(leaf[1], int)
                and isinstance(leaf[3], list)
                and all(isinstance(s, int) and s >= 0 for s in leaf[3])
            ):
                raise WindowError("malformed layout leaf")
            n = math.prod(leaf[3]) * torch.empty(0, dtype=_DTYPES[leaf[2]]).element_size()
            if leaf[1] < 0 or leaf[1] + n > stride:
                raise WindowError("layout leaf outside its set")
            leaves.append(leaf)
        return Layout(leaves, stride)

    def views(self, region: shared_region.Region, i: int) -> list[Any]:
        base = i * self.stride
        return [
            region.view(base + leaf[1], _DTYPES[leaf[2]], leaf[3]) if leaf[0] == "tensor" else leaf[1]
            for leaf in self.leaves
        ]

    def sets(self, region: shared_region.Region, n: int) -> list[list[Any]]:
        """`views(region, i)` for every i < n, made leaf by leaf in one strided view each (a few
        microseconds for a whole window, against ~15 a view made alone: in a window of a hundred
        sets that was a millisecond of fixed cost before the first call, and its noise)."""
        if n <= 0:
            return []
        if n * self.stride > region.nbytes:
            raise ValueError("the sets run past the region")
        columns: list[list[Any]] = []
        for leaf in self.leaves:
            if leaf[0] != "tensor":
                columns.append([leaf[1]] * n)
                continue
            dtype, shape = _DTYPES[leaf[2]], tuple(int(d) for d in leaf[3])
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if leaf[1] % itemsize or self.stride % itemsize:
                columns.append([region.view(i * self.stride + leaf[1], dtype, leaf[3]) for i in range(n)])
                continue
            usable = region.nbytes - region.nbytes % itemsize
            typed = region.tensor[:usable].view(dtype)
            inner = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                inner[d] = inner[d + 1] * shape[d + 1]
            stacked = typed.as_strided((n, *shape), (self.stride // itemsize, *inner), leaf[1] // itemsize)
            columns.append(list(stacked.unbind(0)))
        return [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in range(n)]
