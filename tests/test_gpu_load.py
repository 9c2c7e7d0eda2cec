"""Who kept the GPU busy during the windows (engine/child/timing/gpu_load.py): NVML asked in a process
of its own, and its answer read as data. On the CPU: no NVML, and answers written by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from kernelwright.engine.child.timing.gpu_load import MAX_PROCESSES, Query, parse


def answered(q: Query) -> dict:
    """The query's result once its process has ended (the record waits at most WAIT_S; a loaded test
    machine may start a Python more slowly than that)."""
    if q.proc is not None:
        q.proc.wait(60)
    return q.result()


def test_the_answer_is_read_as_bounded_data():
    ok = parse(json.dumps({"processes": [[11, 97, 40, 6], [12, 0, 0, 2]]}).encode(), 0)
    assert ok["busy"] == 1 and ok["processes"][0] == {"pid": 11, "sm_pct": 97, "memory_pct": 40, "samples": 6}
    odd = [[1, 2, 3], [1, -1, 0, 1], [1, 2.5, 0, 1], ["1", 2, 3, 4], [1, True, 0, 1], [1, 2**40, 0, 1], None]
    assert parse(json.dumps({"processes": odd}).encode(), 0) == {"processes": [], "busy": 0}
    many = parse(json.dumps({"processes": [[p, 5, 0, 1] for p in range(1000)]}).encode(), 0)
    assert len(many["processes"]) == MAX_PROCESSES
    for bad, code in [(b"", 0), (b"\xff\xfe", 0), (b"[1, 2]", 0), (b'{"processes": 3}', 0), (b"{}", -11)]:
        assert "unavailable" in parse(bad, code), bad
    said = parse(json.dumps({"unavailable": "x" * 5000}).encode(), 0)
    assert len(said["unavailable"]) == 300


def test_without_nvml_or_a_gpu_identity_the_query_says_so_and_never_raises():
    t0 = time.monotonic()
    out = answered(Query("GPU-00000000-0000-0000-0000-000000000000", 0))
    assert "unavailable" in out and time.monotonic() - t0 < 10, out
    assert "no NVML identity" in Query("index-0", 0).result()["unavailable"]


FAKE_NVML = r"""
/* NVML's entry points as the query calls them, with nvml.h's structure (nvidia-ml-py 13.615 agrees) */
#include <string.h>
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } S;
static const S samples[] = {{11, 5, 90, 30, 0, 0}, {12, 6, 0, 0, 0, 0}, {11, 7, 97, 40, 0, 0}, {13, 1, 99, 9, 0, 0}};
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) { *h = (void *)1; return strncmp(uuid, "GPU-", 4) ? 6 : 0; }
int nvmlDeviceGetProcessUtilization(void *h, S *out, unsigned int *n, unsigned long long since) {
    unsigned int k = 0, i;
    for (i = 0; i < 4; i++) if (samples[i].timeStamp >= since) k++;
    if (out == 0 || *n < k) { *n = k; return k ? 7 : 6; }
    for (i = 0, k = 0; i < 4; i++) if (samples[i].timeStamp >= since) out[k++] = samples[i];
    *n = k;
    return 0;
}
"""


def test_the_query_reads_nvmls_samples_per_process_since_the_windows_began(tmp_path, monkeypatch):
    """Against a stand-in for libnvidia-ml built from C with NVML's own structure: the two-call
    protocol, the samples' layout, each process's largest utilisation, and only samples since."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in NVML")
    (tmp_path / "nvml.c").write_text(FAKE_NVML)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "nvml.c")], check=True
    )
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    out = answered(Query("GPU-1234", 5))
    assert out["processes"] == [
        {"pid": 11, "sm_pct": 97, "memory_pct": 40, "samples": 2},
        {"pid": 12, "sm_pct": 0, "memory_pct": 0, "samples": 1},
    ], out
    assert out["busy"] == 1
    assert answered(Query("GPU-1234", 100))["processes"] == []  # no sample since then


def test_the_record_waits_for_the_query_no_longer_than_its_bound(monkeypatch):
    """A query that has not answered (NVML's start-up without persistence mode can take seconds) is
    stopped after WAIT_S, and the record says so: an evaluation is at most that much slower for it."""
    from kernelwright.engine.child.timing import gpu_load

    monkeypatch.setattr(gpu_load, "_QUERY", "import time; time.sleep(30)")
    monkeypatch.setattr(gpu_load, "WAIT_S", 0.3)
    q = Query("GPU-1234", 0)
    t0 = time.monotonic()
    out = q.result()
    assert time.monotonic() - t0 < 5 and "had not answered" in out["unavailable"], out
    assert q.proc is not None and q.proc.returncode is not None  # stopped, not left behind
