"""Facts about the device a candidate ran on, and its peaks: datasheet and measured.

Runs in the evaluation child (torch + standard library). The datasheet table gives dense
(no sparsity) peaks of common GPUs; the measured copy bandwidth and matmul rate are taken once
per device and cached as JSON under the cache directory, so later evaluations read them back.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelwright.engine.child import jsoncache

TB = 1e12
TFLOP = 1e12

# name pattern (searched in torch's device name, first match wins) ->
#   (label, memory bandwidth bytes/s, {precision: dense FLOP/s})
# Sources: NVIDIA datasheets; tensor-core figures halved from the "with sparsity" numbers.
DATASHEET: list[tuple[str, str, float, dict[str, float]]] = [
    (
        r"H200 NVL",
        "H200 NVL",
        4.8 * TB,
        {"fp32": 60 * TFLOP, "tf32": 417.5 * TFLOP, "bf16": 835.5 * TFLOP, "fp16": 835.5 * TFLOP, "fp8": 1671 * TFLOP},
    ),
    (
        r"H200",
        "H200 SXM",
        4.8 * TB,
        {
            "fp32": 67 * TFLOP,
            "tf32": 494.7 * TFLOP,
            "bf16": 989.4 * TFLOP,
            "fp16": 989.4 * TFLOP,
            "fp8": 1978.9 * TFLOP,
        },
    ),
    (
        r"H100 NVL",
        "H100 NVL",
        3.9 * TB,
        {"fp32": 60 * TFLOP, "tf32": 417.5 * TFLOP, "bf16": 835.5 * TFLOP, "fp16": 835.5 * TFLOP, "fp8": 1671 * TFLOP},
    ),
    (
        r"H100 PCIe",
        "H100 PCIe",
        2.0 * TB,
        {"fp32": 51.2 * TFLOP, "tf32": 378 * TFLOP, "bf16": 756.5 * TFLOP, "fp16": 756.5 * TFLOP, "fp8": 1513 * TFLOP},
    ),
    (
        r"H100",
        "H100 SXM",
        3.35 * TB,
        {
            "fp32": 67 * TFLOP,
            "tf32": 494.7 * TFLOP,
            "bf16": 989.4 * TFLOP,
            "fp16": 989.4 * TFLOP,
            "fp8": 1978.9 * TFLOP,
        },
    ),
    (
        r"A100.*(?:SXM4-80GB|80GB HBM2e)",
        "A100 SXM 80GB",
        2.039 * TB,
        {"fp32": 19.5 * TFLOP, "tf32": 156 * TFLOP, "bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
    ),
    (
        r"A100.*80GB PCIe",
        "A100 PCIe 80GB",
        1.935 * TB,
        {"fp32": 19.5 * TFLOP, "tf32": 156 * TFLOP, "bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
    ),
    (
        r"A100.*PCIE-40GB",
        "A100 PCIe 40GB",
        1.555 * TB,
        {"fp32": 19.5 * TFLOP, "tf32": 156 * TFLOP, "bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
    ),
    (
        r"A100",
        "A100 SXM 40GB",
        1.555 * TB,
        {"fp32": 19.5 * TFLOP, "tf32": 156 * TFLOP, "bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
    ),
    (
        r"L40S",
        "L40S",
        0.864 * TB,
        {"fp32": 91.6 * TFLOP, "tf32": 183 * TFLOP, "bf16": 362 * TFLOP, "fp16": 362 * TFLOP, "fp8": 733 * TFLOP},
    ),
    (
        r"\bL4\b",
        "L4",
        0.3 * TB,
        {"fp32": 30.3 * TFLOP, "tf32": 60 * TFLOP, "bf16": 121 * TFLOP, "fp16": 121 * TFLOP, "fp8": 242.5 * TFLOP},
    ),
    (
        r"RTX 4090",
        "GeForce RTX 4090",
        1.008 * TB,
        {
            "fp32": 82.6 * TFLOP,
            "tf32": 82.6 * TFLOP,
            "bf16": 165.2 * TFLOP,
            "fp16": 165.2 * TFLOP,
            "fp8": 330.3 * TFLOP,
        },
    ),
    (r"A10G", "A10G", 0.6 * TB, {"fp32": 31.2 * TFLOP, "tf32": 62.5 * TFLOP, "bf16": 125 * TFLOP, "fp16": 125 * TFLOP}),
    (
        r"\bA10\b",
        "A10",
        0.6 * TB,
        {"fp32": 31.2 * TFLOP, "tf32": 62.5 * TFLOP, "bf16": 125 * TFLOP, "fp16": 125 * TFLOP},
    ),
    (r"V100", "V100 SXM2", 0.9 * TB, {"fp32": 15.7 * TFLOP, "fp16": 125 * TFLOP}),
    (r"\bT4\b", "T4", 0.32 * TB, {"fp32": 8.1 * TFLOP, "fp16": 65 * TFLOP}),
]


def datasheet_for(name: str) -> dict[str, Any] | None:
    for pattern, label, bw, flops in DATASHEET:
        if re.search(pattern, name):
            return {"label": label, "bandwidth_bytes_per_s": bw, "flops_per_s": dict(flops)}
    return None


def _nvidia_smi_clocks(index: int) -> dict[str, float]:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={index}",
                "--query-gpu=clocks.max.sm,clocks.max.mem,clocks.sm",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    parts = [p.strip() for p in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(parts) != 3:
        return {}
    keys = ("max_sm_clock_mhz", "max_mem_clock_mhz", "sm_clock_mhz")
    res = {}
    for k, v in zip(keys, parts, strict=False):
        try:
            res[k] = float(v)
        except ValueError:
            pass
    return res


def device_facts(device: torch.device) -> dict[str, Any]:
    """What the hardware is: read from the device (no measurement)."""
    if device.type != "cuda":
        return {
            "type": "cpu",
            "name": f"cpu ({os.uname().machine})",
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        }
    p = torch.cuda.get_device_properties(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    facts: dict[str, Any] = {
        "type": "cuda",
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "shared_mem_per_sm_bytes": getattr(p, "shared_memory_per_multiprocessor", None),
        "shared_mem_per_block_bytes": getattr(p, "shared_memory_per_block", None),
        "shared_mem_per_block_optin_bytes": getattr(p, "shared_memory_per_block_optin", None),
        "registers_per_sm": getattr(p, "regs_per_multiprocessor", None),
        "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
        "warp_size": getattr(p, "warp_size", 32),
    }
    clock = getattr(p, "clock_rate", None)  # kHz, in builds that expose it
    if clock:
        facts["max_sm_clock_mhz"] = clock / 1000
    facts.update({k: v for k, v in _nvidia_smi_clocks(idx).items() if k not in facts})
    return facts


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peaks(device: torch.device) -> dict[str, Any]:
    """Copy bandwidth (read + write bytes per second) and matmul rate, best of a few runs."""
    res: dict[str, Any] = {}
    nbytes = (512 if device.type == "cuda" else 64) * 2**20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best_time(functools.partial(dst.copy_, src), device, 10 if device.type == "cuda" else 5)
    res["copy_bandwidth_bytes_per_s"] = 2 * nbytes / t
    del src, dst
    n = 8192 if device.type == "cuda" else 1024
    dtypes = {"fp32": torch.float32}
    if device.type == "cuda":
        dtypes["bf16"] = torch.bfloat16
    for label, dt in dtypes.items():
        a = torch.randn(n, n, device=device, dtype=dt)
        b = torch.randn(n, n, device=device, dtype=dt)
        t = _best_time(lambda: torch.mm(a, b), device, 5 if device.type == "cuda" else 3)  # noqa: B023  # noqa: B023
        res[f"matmul_{label}_flops_per_s"] = 2 * n**3 / t
    res["matmul_n"] = n
    res["tf32_matmul_allowed"] = bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else False
    return res


def _cache_file(cache_dir: str, facts: dict[str, Any]) -> Path:
    key = (
        f"{facts.get('name')}-{facts.get('compute_capability', '')}-{facts.get('threads', '')}-torch{torch.__version__}"
    )
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key)
    return Path(cache_dir) / jsoncache.JUDGE_CACHE_SUBDIR / "device_peaks" / f"{slug}.json"


def forget_measured(device: torch.device, cache_dir: str) -> None:
    """Drop the cached measured peaks of `device` (they proved too low: the next `collect` measures)."""
    try:
        _cache_file(cache_dir, device_facts(device)).unlink()
    except OSError:
        pass


def collect(device: torch.device, cache_dir: str, measure: bool = True) -> dict[str, Any]:
    """Device facts, datasheet peaks when the device is known, and measured peaks (cached)."""
    facts = device_facts(device)
    sheet = datasheet_for(facts["name"]) if device.type == "cuda" else None
    if sheet:
        facts["datasheet"] = sheet
    if measure:
        path = _cache_file(cache_dir, facts)
        measured = jsoncache.read(path)
        if not measured:
            t0 = time.perf_counter()
            measured = measure_peaks(device)
            measured["measure_s"] = time.perf_counter() - t0
            jsoncache.write(path, measured)
            measured["cached"] = False
        else:
            measured["cached"] = True
        facts["measured"] = measured
    return facts
