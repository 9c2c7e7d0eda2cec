"""Compact text of a correct candidate's hardware evidence for the LLM Judge's performance prompt:
GPU facts, the roofline line, and the kernel profile (ncu metrics, or torch.profiler's list).

`render_for_llm_judge(result)` returns a short string (about 10-25 lines); empty when the record
holds no such evidence. Standard library only.
"""

from __future__ import annotations

from typing import Any

MAX_KERNELS = 6


def _gib(x: float | None) -> str:
    return f"{x / 2**30:.3g} GiB" if x else "?"


def _kib(x: float | None) -> str:
    return f"{x / 2**10:.3g} KiB" if x else "?"


def _mb(x: float | None) -> str:
    return f"{x / 1e6:.4g} MB" if x is not None else "?"


def _num(x: float | None) -> str:
    return f"{x:.6g}" if x is not None else "?"


def _pct(x: float | None) -> str:
    return f"{x:.0f}%" if x is not None else "?"


def gpu_line(f: dict[str, Any]) -> str:
    if f.get("type") != "cuda":
        m = f.get("measured") or {}
        bw = m.get("copy_bandwidth_bytes_per_s")
        mm = m.get("matmul_fp32_flops_per_s")
        meas = f"; measured copy {bw / 1e9:.3g} GB/s, fp32 matmul {mm / 1e9:.3g} GFLOP/s" if bw and mm else ""
        return f"Device: {f.get('name', 'cpu')}, {f.get('threads', '?')} threads{meas}"
    parts = [
        f"GPU: {f.get('name')} (sm_{str(f.get('compute_capability', '?')).replace('.', '')})",
        f"{f.get('sm_count', '?')} SMs",
        f"{_gib(f.get('memory_bytes'))} memory",
        f"L2 {f.get('l2_bytes', 0) / 2**20:.3g} MiB" if f.get("l2_bytes") else "L2 ?",
        f"smem {_kib(f.get('shared_mem_per_sm_bytes'))}/SM, "
        f"{_kib(f.get('shared_mem_per_block_optin_bytes') or f.get('shared_mem_per_block_bytes'))}/block max",
    ]
    if f.get("max_sm_clock_mhz"):
        parts.append(f"SM clock max {f['max_sm_clock_mhz']:.0f} MHz")
    sheet = f.get("datasheet")
    if sheet:
        fl = sheet["flops_per_s"]
        parts.append(
            f"datasheet {sheet['bandwidth_bytes_per_s'] / 1e12:.3g} TB/s, fp32 {fl.get('fp32', 0) / 1e12:.3g} TFLOP/s, "
            f"bf16 tensor {fl.get('bf16', 0) / 1e12:.4g} TFLOP/s"
        )
    m = f.get("measured") or {}
    if m.get("copy_bandwidth_bytes_per_s"):
        meas = f"measured copy {m['copy_bandwidth_bytes_per_s'] / 1e12:.3g} TB/s"
        if m.get("matmul_bf16_flops_per_s"):
            meas += f", bf16 matmul {m['matmul_bf16_flops_per_s'] / 1e12:.3g} TFLOP/s"
        if m.get("matmul_fp32_flops_per_s"):
            meas += f", fp32 matmul {m['matmul_fp32_flops_per_s'] / 1e12:.3g} TFLOP/s"
        parts.append(meas)
    return ", ".join(parts)


def _ncu_kernel(k: dict[str, Any]) -> str:
    stalls = ", ".join(f"{r} {v:.3g}" for r, v in (k.get("top_stalls") or []))
    limits = k.get("occupancy_limiter")
    lines = [
        f"- [{k['origin']}] {k['name'][:120]}: {k['duration_us']:.4g} us"
        if k.get("duration_us") is not None
        else f"- [{k['origin']}] {k['name'][:120]}",
        f"  grid {k.get('grid_size') or '?'} block {k.get('block_size') or '?'}; "
        f"SM {_pct(k.get('sm_throughput_pct'))}, "
        f"memory {_pct(k.get('memory_throughput_pct'))} of peak; DRAM {_pct(k.get('dram_throughput_pct'))}"
        + (
            f" ({k['dram_bandwidth_gbps']:.4g} GB/s, read {_mb(k.get('dram_read_bytes'))}, "
            f"write {_mb(k.get('dram_write_bytes'))})"
            if k.get("dram_bandwidth_gbps") is not None
            else ""
        ),
        f"  occupancy {_pct(k.get('achieved_occupancy_pct'))} achieved / "
        f"{_pct(k.get('theoretical_occupancy_pct'))} theoretical"
        + (f" (limited by {limits})" if limits else "")
        + f"; {_num(k.get('registers_per_thread'))} regs/thread, "
        f"{_num(k.get('shared_mem_per_block_bytes'))} B smem/block",
        f"  L1 hit {_pct(k.get('l1_hit_rate_pct'))}, L2 hit {_pct(k.get('l2_hit_rate_pct'))}; "
        f"issue slots {_pct(k.get('issue_slots_busy_pct'))}; "
        f"tensor pipe {_pct(k.get('tensor_pipe_pct'))}; branch uniformity {_pct(k.get('branch_uniformity_pct'))}"
        + (f"; top stalls (warps/issue): {stalls}" if stalls else ""),
    ]
    return "\n".join(lines)


def _dedupe(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ncu profiles each launch; the same kernel over several forwards is shown once (last launch)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for k in kernels:
        seen[(k["name"], k.get("grid_size"), k.get("block_size"))] = k
    return list(seen.values())


def profile_lines(p: dict[str, Any], torch_p: dict[str, Any] | None) -> list[str]:
    out = []
    if p.get("source") == "ncu":
        ks = _dedupe(p.get("kernels", []))
        ks.sort(key=lambda k: (k["origin"] != "candidate", -(k.get("duration_us") or 0)))
        out.append(
            f"Profile (Nsight Compute, {len(ks)} kernel(s) of the candidate's forward; "
            f"raw report {p.get('report_path')}):"
        )
        out += [_ncu_kernel(k) for k in ks[:MAX_KERNELS]]
        if torch_p:
            out += _torch_lines(torch_p, header="Whole forward (torch.profiler):")
        return out
    why = p.get("fallback_reason")
    head = "Profile (torch.profiler" + (f"; ncu unavailable: {why}" if why else "") + "):"
    return _torch_lines(p, header=head)


def _torch_lines(p: dict[str, Any], header: str) -> list[str]:
    entries = p.get("kernels") if p.get("device_type") == "cuda" else p.get("ops")
    what = "kernels" if p.get("device_type") == "cuda" else "ops"
    s = p.get("summary", {})
    cand, torch_ = s.get("candidate", {}), s.get("pytorch", {})
    lines = [
        f"{header} one forward launched {sum(e['count'] for e in entries or [])} {what}: "
        f"candidate's {cand.get('launches', 0)} ({cand.get('total_us', 0):.4g} us), "
        f"PyTorch's {torch_.get('launches', 0)} ({torch_.get('total_us', 0):.4g} us)"
        + (f", unknown {s['unknown']['launches']}" if s.get("unknown", {}).get("launches") else "")
    ]
    for e in (entries or [])[:MAX_KERNELS]:
        lines.append(f"- [{e['origin']}] {e['name'][:120]} x{e['count']}: {e['total_us']:.4g} us")
    inner = p.get("ops_called_by_candidate") or []
    if inner:
        lines.append(
            "  PyTorch ops inside the candidate's functions: "
            + ", ".join(f"{e['name']} x{e['count']}" for e in inner[:5])
        )
    return lines


def render_for_llm_judge(result: Any) -> str:
    """GPU facts, roofline and profile of an EvalResult (or its dict), as short text."""
    meta = result.get("metadata", {}) if isinstance(result, dict) else (result.metadata or {})
    lines: list[str] = []
    if meta.get("gpu_facts"):
        lines.append(gpu_line(meta["gpu_facts"]))
    if meta.get("roofline_line"):
        lines.append(meta["roofline_line"])
        work = meta.get("reference_work") or {}
        if work.get("flops_by_op"):
            by_op = work["flops_by_op"].items()
            lines.append("  reference FLOPs by op: " + ", ".join(f"{k} {v:.3g}" for k, v in by_op))
    elif meta.get("roofline_error"):
        lines.append(f"Roofline unavailable: {meta['roofline_error']}")
    if meta.get("profile"):
        lines += profile_lines(meta["profile"], meta.get("torch_profile"))
    elif meta.get("profile_error"):
        lines.append(f"Profile unavailable: {meta['profile_error']}")
    return "\n".join(lines)
