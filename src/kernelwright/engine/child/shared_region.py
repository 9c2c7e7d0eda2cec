"""Memory the judge owns and lends to the runner for one timing window, by file descriptor.

A region is a fresh allocation: on the CPU an anonymous `memfd` mapped in both processes, on a
GPU a device allocation made with the driver's virtual memory API (`cuMemCreate`, exported as a
POSIX descriptor; see `device_handoff.py` for why legacy IPC handles do not cross the runner's PID
namespace). The judge creates it, fills it, and only then passes the descriptor on the pair's
Unix socket: until that moment the runner has no way to reach the bytes (no name in any file
system, no address it could map), which is what makes a window's inputs unseen before it opens.
Every window gets a new region for its inputs, so a mapping the runner keeps from an earlier
window never shows a later window's inputs; the outputs go to one region per timing stage (the
output ring, `windows.Rings`), which holds nothing the runner has not written itself. Imports only
torch and the standard library.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

MSG_MAX = 1 << 16


@dataclass
class Region:
    """`nbytes` of shared memory as a uint8 tensor on `device`; `fd` is the descriptor to send."""

    tensor: torch.Tensor
    nbytes: int
    fd: int
    _closers: list[Callable[[], None]] = field(default_factory=list)
    lent_id: int = 0  # the id the judge lends it under (windows.WindowTimer: unique in its process)

    def view(self, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        n = 1
        for s in shape:
            n *= int(s)
        if offset % itemsize or offset < 0 or offset + n * itemsize > self.nbytes:
            raise ValueError("a view outside the region or misaligned")
        # a tuple, not unpacked: a 0-dim leaf (a scalar output, `x.sum()`) has the shape ()
        return self.tensor[offset : offset + n * itemsize].view(dtype).view(tuple(int(s) for s in shape))

    def close(self) -> None:
        for c in reversed(self._closers):
            try:
                c()
            except Exception:
                pass
        self._closers.clear()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def _cpu_region(nbytes: int, fd: int | None = None) -> Region:
    size = max(nbytes, 1)
    if fd is None:
        fd = os.memfd_create("kw-window", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
    else:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < size:
            raise ValueError("the descriptor is not a region of the announced size")
    # the page tables filled at the mapping (MAP_POPULATE): first touches inside a timed window
    # would cost the runner a fault per page that the judge, which filled the region, never pays
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    mm = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
    t = torch.frombuffer(mm, dtype=torch.uint8, count=size)

    def close() -> None:
        try:
            mm.close()
        except BufferError:  # a tensor view still holds it: freed with the last view
            pass

    return Region(t, nbytes, fd, [close])


def _cuda_region(nbytes: int, device: torch.device, fd: int | None = None) -> Region:
    from kernelwright.engine.child import device_handoff as dh

    d = dh._driver()
    idx = dh._index(device)
    size = dh._granular(max(nbytes, 1), idx)
    handle = ctypes.c_ulonglong()
    if fd is None:
        prop = dh._prop(idx)
        d.check(d.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), "cuMemCreate")
    else:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise ValueError("the descriptor is not device memory")
        d.check(
            d.lib.cuMemImportFromShareableHandle(
                ctypes.byref(handle), ctypes.c_void_p(fd), dh._CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            ),
            "cuMemImportFromShareableHandle",
        )
    try:
        mapped = dh._Mapped(handle.value, size, idx)  # refused when larger than the allocation
    except BaseException:
        d.lib.cuMemRelease(handle.value)
        raise
    if fd is None:
        out = ctypes.c_int(-1)
        try:
            d.check(
                d.lib.cuMemExportToShareableHandle(
                    ctypes.byref(out), handle.value, dh._CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
                ),
                "cuMemExportToShareableHandle",
            )
        except BaseException:
            mapped.close()
            d.lib.cuMemRelease(handle.value)
            raise
        fd = out.value
    t = mapped.tensor(max(nbytes, 1), device)

    def close() -> None:
        torch.cuda.synchronize(device)
        mapped.close()
        d.lib.cuMemRelease(handle.value)

    return Region(t, nbytes, fd, [close])


def create(nbytes: int, device: torch.device) -> Region:
    """A fresh region the judge fills (zeroed on the CPU; undefined on the GPU)."""
    return _cuda_region(nbytes, device) if device.type == "cuda" else _cpu_region(nbytes)


def attach(fd: int, nbytes: int, device: torch.device) -> Region:
    """The runner's mapping of a region it received (the descriptor is kept and closed with it)."""
    return _cuda_region(nbytes, device, fd) if device.type == "cuda" else _cpu_region(nbytes, fd)


def send(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    sock.sendmsg(
        [payload[:MSG_MAX]],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(f.to_bytes(4, "little", signed=True) for f in fds))]
        if fds
        else [],
    )


def recv(sock: socket.socket, max_fds: int = 4) -> tuple[bytes, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, MSG_MAX, max_fds)
    return data, list(fds)
