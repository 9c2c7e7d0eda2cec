"""Outputs as plain data: what crosses from the runner (the candidate's process) to the judge.

`write_tree(path, obj)` writes a (nested) output as one file: a JSON header line, then the raw
bytes of every tensor. `read_tree(path, ...)` rebuilds it on the judge's side from those bytes
alone: every tensor a plain `torch.Tensor` (never a subclass: the file holds no code and no class
names), of the dtype and shape the header states, checked against the bytes present; containers
are tuples, lists and dicts; numbers, strings, booleans and None as themselves. Anything else the
candidate returned is written as `{"other": "<type name>"}` and read back as an `Opaque` value,
which equals nothing. The reader opens the file with O_NOFOLLOW, caps its size, and trusts
nothing in it.

The bytes of a CUDA tensor may travel beside the file instead of in it (`ship`/`fetch`: the
device hand-off of `device_handoff.py`, no trip through host memory); the header then lists that
leaf under `handoff`, and its length counts against the same cap.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import torch

MAX_HEADER = 1 << 20
MAX_DEPTH = 16
MAX_LEAVES = 4096
_DTYPES = {
    str(d).replace("torch.", ""): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


class WireError(ValueError):
    """The file is not a well-formed output file (the candidate's process wrote it: say what is wrong)."""


@dataclass(frozen=True)
class Opaque:
    """A value the candidate returned that is not a tensor, number, string or container."""

    type_name: str

    def __eq__(self, other: object) -> bool:  # never equal, not even to itself: it is not an output
        return False

    __hash__ = object.__hash__


def _encode(obj: Any, blobs: list[torch.Tensor], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        return {"other": "nested too deep"}
    if isinstance(obj, torch.Tensor):
        kind = "tensor" if type(obj) is torch.Tensor or isinstance(obj, torch.nn.Parameter) else "subclass"
        t = obj.detach()
        if t.dtype not in _DTYPES.values():
            return {"other": f"tensor of dtype {t.dtype}"}
        blobs.append(t)
        return {
            kind: len(blobs) - 1,
            "class": type(obj).__name__,
            "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape),
            "device": t.device.type,
        }
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return {"value": obj}
    if isinstance(obj, int):
        return {"value": obj}
    if isinstance(obj, float):
        return {"float": repr(obj)}  # inf/nan survive
    if isinstance(obj, tuple) and type(obj) is tuple:
        return {"tuple": [_encode(x, blobs, depth + 1) for x in obj]}
    if isinstance(obj, list) and type(obj) is list:
        return {"list": [_encode(x, blobs, depth + 1) for x in obj]}
    if isinstance(obj, dict) and type(obj) is dict:
        return {"dict": [[str(k), _encode(v, blobs, depth + 1)] for k, v in obj.items()]}
    return {"other": type(obj).__name__}


def write_tree(path: str, obj: Any, ship: Callable[[int, torch.Tensor], bool] | None = None) -> int:
    """Write `obj` to `path` (created, never followed); returns the bytes written to the file.
    `ship(i, tensor)`: send leaf i's bytes beside the file (True) or not (False: written here)."""
    blobs: list[torch.Tensor] = []
    tree = _encode(obj, blobs)
    sizes: list[int] = [b.numel() * b.element_size() for b in blobs]
    handoff = [i for i, b in enumerate(blobs) if ship is not None and sizes[i] and ship(i, b)]
    header = json.dumps({"tree": tree, "sizes": sizes, "handoff": handoff}).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    shipped = set(handoff)
    with os.fdopen(fd, "wb") as f:
        f.write(header)
        for i, (b, n) in enumerate(zip(blobs, sizes, strict=False)):
            if n and i not in shipped:
                _write_blob(f, b, n)
    return len(header) + sum(n for i, n in enumerate(sizes) if i not in shipped)


_STAGING: list[torch.Tensor] = []  # one pinned host buffer per process, grown as needed, reused


def _staging(n: int) -> torch.Tensor:
    """A pinned host buffer of at least `n` bytes (device <-> host copies at full speed, no new pinning each time)."""
    if not _STAGING or _STAGING[0].numel() < n:
        _STAGING.clear()
        _STAGING.append(torch.empty(max(n, 1 << 20), dtype=torch.uint8, pin_memory=True))
    return _STAGING[0][:n]


def _bytes_view(t: torch.Tensor, n: int) -> memoryview:
    """The `n` bytes of a contiguous host tensor, without a copy."""
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _write_blob(f: IO[bytes], b: torch.Tensor, n: int) -> None:
    flat = b.contiguous().reshape(-1).view(torch.uint8)  # kept alive until written
    if flat.device.type != "cpu":
        flat = _staging(n).copy_(flat)  # synchronous: written before the buffer's next use
    f.write(_bytes_view(flat, n))


def read_tree(
    path: str,
    device: torch.device | str = "cpu",
    max_bytes: int = 1 << 34,
    fetch: Callable[[int, int], torch.Tensor] | None = None,
) -> Any:
    """Read an output file written by `write_tree` (by a process we do not trust). `fetch(i, n)`:
    leaf i's `n` bytes sent beside the file (a uint8 tensor), for the leaves the header lists
    under `handoff`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise WireError(f"output file {os.path.basename(path)} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        import stat

        if not stat.S_ISREG(st.st_mode):
            raise WireError(f"output file {os.path.basename(path)} is not a regular file")
        if st.st_size > max_bytes:
            raise WireError(f"output file {os.path.basename(path)} is {st.st_size} bytes, over the {max_bytes} limit")
        header = f.readline(MAX_HEADER + 1)
        if not header.endswith(b"\n"):
            raise WireError("output file header is missing or too long")
        try:
            meta = json.loads(header)
            tree, sizes, handoff = meta["tree"], meta["sizes"], meta.get("handoff", [])
        except (ValueError, KeyError, TypeError):
            raise WireError("output file header is not valid") from None
        if (
            not isinstance(sizes, list)
            or len(sizes) > MAX_LEAVES
            or not all(isinstance(n, int) and n >= 0 for n in sizes)
        ):
            raise WireError("output file sizes are not valid")
        if not isinstance(handoff, list) or not all(isinstance(i, int) and 0 <= i < len(sizes) for i in handoff):
            raise WireError("output file hand-off list is not valid")
        beside = set(handoff)
        if sum(sizes) > max_bytes:
            raise WireError(f"output {os.path.basename(path)} announces {sum(sizes)} bytes, over the {max_bytes} limit")
        if len(header) + sum(n for i, n in enumerate(sizes) if i not in beside) != st.st_size:
            raise WireError("output file length does not match its header")
        if beside and fetch is None:
            raise WireError("output file names device outputs sent beside it, and none were expected")
        blobs = []
        for i, n in enumerate(sizes):  # read straight into a tensor's memory: one copy from the file
            if i in beside:
                assert fetch is not None  # checked above: a hand-off list comes with a fetch
                blobs.append(fetch(i, n))
                continue
            data = torch.empty(n, dtype=torch.uint8)
            if n and f.readinto(_bytes_view(data, n)) != n:
                raise WireError("output file is truncated")
            blobs.append(data)
    return _decode(tree, blobs, torch.device(device), 0)


def _decode(node: Any, blobs: list[torch.Tensor], device: torch.device, depth: int) -> Any:
    if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) < 1:
        raise WireError("output file structure is not valid")
    if "tensor" in node or "subclass" in node:
        idx = node.get("tensor", node.get("subclass"))
        dtype = _DTYPES.get(node["dtype"]) if "dtype" in node else None
        shape = node.get("shape")
        if (
            not isinstance(idx, int)
            or not 0 <= idx < len(blobs)
            or dtype is None
            or not isinstance(shape, list)
            or not all(isinstance(s, int) and s >= 0 for s in shape)
        ):
            raise WireError("output file tensor entry is not valid")
        numel = 1
        for s in shape:
            numel *= s
        data = blobs[idx]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(data) != numel * itemsize:
            raise WireError("output file tensor size does not match its shape")
        if not numel:
            t = torch.empty(shape, dtype=dtype)
        elif dtype is torch.bool:  # any byte the file holds, read as a boolean (never a 2 that is 'true')
            t = data.ne(0).reshape(shape)
        else:
            t = data.view(dtype).reshape(shape)
        t = t.to(device)
        if "subclass" in node:
            return Opaque(f"torch.Tensor subclass {str(node.get('class'))[:80]}")
        return t
    if "value" in node:
        v = node["value"]
        if v is None or isinstance(v, (bool, int, str)):
            return v
        raise WireError("output file value is not valid")
    if "float" in node:
        try:
            return float(node["float"])
        except (TypeError, ValueError):
            raise WireError("output file float is not valid") from None
    if "tuple" in node or "list" in node:
        items = node.get("tuple", node.get("list"))
        if not isinstance(items, list):
            raise WireError("output file container is not valid")
        out = [_decode(x, blobs, device, depth + 1) for x in items]
        return tuple(out) if "tuple" in node else out
    if "dict" in node:
        items = node["dict"]
        if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2 for p in items):
            raise WireError("output file dict is not valid")
        return {str(k): _decode(v, blobs, device, depth + 1) for k, v in items}
    if "other" in node:
        return Opaque(str(node["other"])[:80])
    raise WireError("output file structure is not valid")
