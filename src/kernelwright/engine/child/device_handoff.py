"""GPU outputs from the runner to the judge without a trip through host memory.

A CUDA output of the runner (the candidate's process) reaches the judge as a file descriptor: the
runner copies the output's bytes into a fresh device allocation made with the CUDA driver's
virtual memory API (`cuMemCreate`, exportable as a POSIX file descriptor), exports it and sends
the descriptor on a Unix socket the parent created for the pair (`SCM_RIGHTS`). The judge
imports the descriptor, maps exactly the bytes the output's header announces (the driver refuses
a mapping larger than the allocation), copies them device to device into memory of its own and
unmaps. Nothing of the runner's memory stays mapped in the judge; what the judge compares is its
own copy, so the candidate cannot change it afterwards.

Legacy CUDA IPC handles (`cudaIpcGetMemHandle`, what `torch.multiprocessing` uses) do not work
here: the runner runs in a PID namespace of its own (bubblewrap, or `unshare` without it), and
the driver refuses legacy handles across PID namespaces. A descriptor passed on a socket does
not care. Where the driver or the device cannot export (`Unavailable`), the runner writes the
bytes into the output file as before.

Every message on the socket carries a tag (the output file's name, the leaf's index and its
length); the judge takes only the descriptor whose tag it expects and closes every other one.
The candidate can write on the runner's end of the socket: what arrives is input, checked as such.
Imports only torch and the standard library.
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import stat
import time

import torch

TAG_MAX = 256
RECV_TIMEOUT_S = 10.0
MAX_SKIPPED = 256  # stale messages dropped while looking for the expected tag

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class Unavailable(RuntimeError):
    """This machine (driver, device, sandbox) cannot move device memory between processes this way."""


class HandoffError(ValueError):
    """What arrived on the socket is not the output announced (the runner's side is not trusted)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Driver:
    """The few driver-API calls needed, through ctypes on libcuda (present wherever CUDA runs)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise Unavailable(f"libcuda.so.1 cannot be loaded: {exc}") from None
        u64, sz, vp = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "cuMemGetAllocationGranularity": [ctypes.POINTER(sz), ctypes.POINTER(_AllocProp), ctypes.c_int],
            "cuMemCreate": [ctypes.POINTER(u64), sz, ctypes.POINTER(_AllocProp), u64],
            "cuMemRelease": [u64],
            "cuMemAddressReserve": [ctypes.POINTER(u64), sz, sz, u64, u64],
            "cuMemAddressFree": [u64, sz],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemUnmap": [u64, sz],
            "cuMemSetAccess": [u64, sz, ctypes.POINTER(_AccessDesc), sz],
            "cuMemExportToShareableHandle": [vp, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), vp, ctypes.c_int],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, args in sigs.items():
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise Unavailable(f"the CUDA driver has no {name}") from None
            fn.argtypes, fn.restype = args, ctypes.c_int

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise Unavailable(f"{what} failed: {(name.value or b'?').decode()} ({rc})")


_DRIVER: list[_Driver] = []


def _driver() -> _Driver:
    if not _DRIVER:
        _DRIVER.append(_Driver())
    return _DRIVER[0]


def _prop(device_index: int) -> _AllocProp:
    p = _AllocProp()
    p.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    p.location = _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device_index)
    return p


def _granular(nbytes: int, device_index: int) -> int:
    d = _driver()
    g = ctypes.c_size_t()
    prop = _prop(device_index)
    d.check(
        d.lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0), "cuMemGetAllocationGranularity"
    )
    step = max(int(g.value), 1)
    return max(step, -(-nbytes // step) * step)


class _Mapped:
    """`size` bytes of an allocation handle mapped read-write at a fresh address on one device."""

    def __init__(self, handle: int, size: int, device_index: int) -> None:
        d = _driver()
        self.size = size
        self.ptr = ctypes.c_ulonglong()
        d.check(d.lib.cuMemAddressReserve(ctypes.byref(self.ptr), size, 0, 0, 0), "cuMemAddressReserve")
        try:
            d.check(d.lib.cuMemMap(self.ptr.value, size, 0, handle, 0), "cuMemMap")
            try:
                desc = _AccessDesc(
                    _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device_index), _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                )
                d.check(d.lib.cuMemSetAccess(self.ptr.value, size, ctypes.byref(desc), 1), "cuMemSetAccess")
            except Unavailable:
                d.lib.cuMemUnmap(self.ptr.value, size)
                raise
        except Unavailable:
            d.lib.cuMemAddressFree(self.ptr.value, size)
            raise

    def tensor(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A uint8 tensor over the first `nbytes` (no copy; valid until `close`)."""

        class _View:
            __cuda_array_interface__ = {
                "shape": (nbytes,),
                "typestr": "|u1",
                "data": (self.ptr.value, False),
                "version": 3,
                "strides": None,
                "stream": None,
            }

        return torch.as_tensor(_View(), device=device)

    def close(self) -> None:
        d = _driver()
        d.lib.cuMemUnmap(self.ptr.value, self.size)
        d.lib.cuMemAddressFree(self.ptr.value, self.size)


def _index(device: torch.device) -> int:
    return int(device.index) if device.index is not None else int(torch.cuda.current_device())


def probe(device: torch.device) -> str:
    """'' when an exportable allocation can be made on `device` here, else why not."""
    try:
        fd = _export(torch.zeros(1, dtype=torch.uint8, device=device))
        os.close(fd)
        return ""
    except Unavailable as exc:
        return str(exc)
    except Exception as exc:  # anything else (torch refusing the mapped memory, say): files, and why
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def self_test(device: torch.device) -> str:
    """'' when this process can export a device allocation and import it back (the judge's side
    of a hand-off: import, map, copy) with the bytes intact, else why not. Run before any job."""
    try:
        src = torch.arange(251, dtype=torch.uint8, device=device)
        fd = _export(src)
        try:
            back = _import(fd, src.numel(), device)
        finally:
            os.close(fd)
        return "" if torch.equal(back, src) else "the bytes imported back differ from those exported"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _export(flat: torch.Tensor) -> int:
    """A descriptor for a fresh device allocation holding a copy of `flat`'s bytes (uint8, 1-D)."""
    d = _driver()
    device = flat.device
    idx = _index(device)
    nbytes = flat.numel()
    size = _granular(nbytes, idx)
    handle = ctypes.c_ulonglong()
    prop = _prop(idx)
    d.check(d.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), "cuMemCreate")
    try:
        mapped = _Mapped(handle.value, size, idx)
        try:
            with torch.cuda.device(device):
                if nbytes:
                    mapped.tensor(nbytes, device).copy_(flat)
                torch.cuda.synchronize(device)  # the bytes are in place before anyone else maps them
        finally:
            mapped.close()
        fd = ctypes.c_int(-1)
        d.check(
            d.lib.cuMemExportToShareableHandle(
                ctypes.byref(fd), handle.value, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
            ),
            "cuMemExportToShareableHandle",
        )
        return fd.value
    finally:
        d.lib.cuMemRelease(handle.value)  # the exported descriptor keeps the memory alive


def send(sock: socket.socket, tag: str, t: torch.Tensor) -> None:
    """Send the bytes of CUDA tensor `t` (any dtype; made contiguous) under `tag`. Raises
    `Unavailable` when it cannot (the caller then writes the bytes itself)."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    fd = _export(flat)
    try:
        sock.settimeout(RECV_TIMEOUT_S)
        sock.sendmsg([tag.encode()[:TAG_MAX]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
    except OSError as exc:
        raise Unavailable(f"the output could not be sent: {exc}") from None
    finally:
        os.close(fd)


def _recv_one(sock: socket.socket, deadline: float) -> tuple[str, int]:
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([sock], [], [], left)[0]:
        raise HandoffError("the runner announced an output on the device but sent none")
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, TAG_MAX, 4)
    except OSError as exc:
        raise HandoffError(f"the output socket failed: {exc}") from None
    if not data and not fds:
        raise HandoffError("the runner's output socket is closed")
    for extra in fds[1:]:
        os.close(extra)
    return data.decode(errors="replace"), (fds[0] if fds else -1)


def receive(sock: socket.socket, tag: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """The `nbytes` sent under `tag`, copied into a uint8 tensor the judge owns on `device`."""
    deadline = time.monotonic() + RECV_TIMEOUT_S
    for _ in range(MAX_SKIPPED):
        got, fd = _recv_one(sock, deadline)
        if got == tag and fd >= 0:
            break
        if fd >= 0:
            os.close(fd)  # a stale or forged message: never imported
    else:
        raise HandoffError(f"no device output tagged {tag[:80]!r} among the runner's messages")
    try:
        return _import(fd, nbytes, device)
    finally:
        os.close(fd)


def _import(fd: int, nbytes: int, device: torch.device) -> torch.Tensor:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise HandoffError("the runner sent a descriptor that is not device memory")
    d = _driver()
    idx = _index(device)
    handle = ctypes.c_ulonglong()
    try:
        d.check(
            d.lib.cuMemImportFromShareableHandle(
                ctypes.byref(handle), ctypes.c_void_p(fd), _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            ),
            "cuMemImportFromShareableHandle",
        )
    except Unavailable as exc:
        raise HandoffError(f"the runner's device output cannot be imported: {exc}") from None
    try:
        try:  # a mapping larger than the allocation is refused: the header cannot overstate it
            mapped = _Mapped(handle.value, _granular(nbytes, idx), idx)
        except Unavailable as exc:
            raise HandoffError(f"the runner's device output is smaller than announced ({exc})") from None
        try:
            with torch.cuda.device(device):
                out = torch.empty(nbytes, dtype=torch.uint8, device=device)
                if nbytes:
                    out.copy_(mapped.tensor(nbytes, device))
                torch.cuda.synchronize(device)  # copied before the mapping goes
            return out
        finally:
            mapped.close()
    finally:
        d.lib.cuMemRelease(handle.value)
