"""Which processes kept the GPU's SMs busy while the windows ran: evidence, never a verdict (yet).

The GPU's turn (`engine/child/gpu_turn.py`) keeps kernelwright's own evaluations of one user apart.
Work it cannot see (another user's evaluation, a training job, a gpu test that runs kernels outside
any evaluation) time-slices into the windows just the same. NVML keeps, for each process with a
context on the device, samples of its SM utilisation; after the windows the judge asks for the
samples since the first window began (`nvmlDeviceGetProcessUtilization`), and records, per process,
its largest SM and memory utilisation and how many samples it had. A judge, its runner and its
probe account for three busy processes at most.

The record only, for now: which rule separates a foreign job from the evaluation's own processes
(PIDs as NVML reports them, from the host's namespace; utilisation sampled at 1/6 s to 1 s) is to be
measured on a device first, as `Calibration.contended()` was. NVML is asked in a process of its
own (`python -I -c`, ctypes, the standard library only): a driver or a structure that is not what
this code expects ends that process, never the judge. Its answer is bounded and checked as data.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

TIMEOUT_S = 5.0  # the query's whole life
WAIT_S = 1.0  # the most the record waits for it: an evaluation is never more than this slower for it
MAX_OUTPUT = 1 << 16
MAX_PROCESSES = 64

# argv: the GPU's UUID as NVML writes it ("GPU-..."), the first window's start (microseconds since the epoch).
# Prints {"processes": [[pid, max SM %, max memory %, samples], ...]} or {"unavailable": why}.
_QUERY = r"""
import ctypes, json, sys
def out(d):
    print(json.dumps(d)); sys.exit(0)
try:
    nv = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as e:
    out({"unavailable": "no NVML library (%s)" % e})
class S(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]
r = nv.nvmlInit_v2()
if r != 0:
    out({"unavailable": "nvmlInit_v2 returned %d" % r})
h = ctypes.c_void_p()
r = nv.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(sys.argv[1].encode()), ctypes.byref(h))
if r != 0:
    out({"unavailable": "no device of that UUID (nvmlDeviceGetHandleByUUID returned %d)" % r})
since = ctypes.c_ulonglong(int(sys.argv[2]))
n = ctypes.c_uint(0)
r = nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(n), since)
if r == 6:
    out({"processes": []})
if r != 7:
    out({"unavailable": "nvmlDeviceGetProcessUtilization returned %d" % r})
buf = (S * n.value)()
r = nv.nvmlDeviceGetProcessUtilization(h, buf, ctypes.byref(n), since)
if r != 0:
    out({"unavailable": "nvmlDeviceGetProcessUtilization returned %d" % r})
per = {}
for s in buf[: n.value]:
    sm, mem, k = per.get(s.pid, (0, 0, 0))
    per[s.pid] = (max(sm, s.smUtil), max(mem, s.memUtil), k + 1)
nv.nvmlShutdown()
out({"processes": [[p, sm, mem, k] for p, (sm, mem, k) in sorted(per.items())]})
"""


def now_us() -> int:
    """The NVML timestamp of now: microseconds since the epoch."""
    return time.time_ns() // 1000


class Query:
    """The NVML query, started after the windows and read at the end of the evaluation, so that
    NVML's own start-up (up to a second without persistence mode) is on no one's path."""

    def __init__(self, gpu_uuid: str, since_us: int):
        self.t0 = time.perf_counter()
        self.proc: subprocess.Popen[bytes] | None = None
        self.why = ""
        if not gpu_uuid.startswith("GPU-"):
            self.why = "no NVML identity for this GPU"
            return
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _QUERY, gpu_uuid, str(int(since_us))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            self.why = f"the NVML query did not start: {type(exc).__name__}"

    def result(self) -> dict[str, Any]:
        """Per process on the GPU, its largest SM and memory utilisation since the windows began and
        its number of samples (`processes`), or why NVML could not say (`unavailable`). Never raises."""
        if self.proc is None:
            return {"unavailable": self.why}
        left = TIMEOUT_S - (time.perf_counter() - self.t0)
        try:
            out, _ = self.proc.communicate(timeout=max(0.05, min(WAIT_S, left)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            took = time.perf_counter() - self.t0
            return {"unavailable": f"the NVML query had not answered after {took:.1f} s (stopped)"}
        facts = parse(out, self.proc.returncode)
        facts["query_s"] = round(time.perf_counter() - self.t0, 3)
        return facts


def parse(stdout: bytes, returncode: int) -> dict[str, Any]:
    """The query's answer, checked as data: a bounded list of four non-negative integers a process."""
    if returncode != 0:
        return {"unavailable": f"the NVML query ended with code {returncode}"}
    try:
        data = json.loads(stdout[:MAX_OUTPUT].decode())
    except (ValueError, UnicodeDecodeError):
        return {"unavailable": "the NVML query's answer was not JSON"}
    if isinstance(data, dict) and isinstance(data.get("unavailable"), str):
        return {"unavailable": data["unavailable"][:300]}
    rows = data.get("processes") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return {"unavailable": "the NVML query's answer had no processes"}
    kept = [
        r
        for r in rows[:MAX_PROCESSES]
        if isinstance(r, list) and len(r) == 4 and all(type(x) is int and 0 <= x < 1 << 32 for x in r)
    ]
    return {
        "processes": [{"pid": p, "sm_pct": sm, "memory_pct": mem, "samples": k} for p, sm, mem, k in kept],
        "busy": sum(1 for _, sm, _, _ in kept if sm > 0),
    }
