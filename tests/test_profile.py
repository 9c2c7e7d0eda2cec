"""Hardware evidence for the Judge on the CPU: ncu CSV parsing, kernel origins, roofline
arithmetic, the torch.profiler fallback on a C++ candidate, and prebuilding into the cache."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES, FIXTURES, seed_headers
from kernelwright.core import kernel_names, roofline
from kernelwright.core.config import ProfileConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine import nsight as ncu
from kernelwright.engine.extensions.prebuild import BuildPool
from kernelwright.loop.llm_judge_evidence import render_for_llm_judge

NCU_FIX = FIXTURES / "ncu"
CPU_EXAMPLE = EXAMPLES / "cpu_swish"
CUDA_EXAMPLE = EXAMPLES / "cuda_swish"
SWISH_KERNEL = "swish_affine_kernel(float4 const*, float const*, float const*, float4*, long, int)"


def _known():
    return kernel_names.candidate_kernel_names([(CUDA_EXAMPLE / "candidate.py").read_text()])


# ---- ncu CSV -------------------------------------------------------------------------------


def test_ncu_raw_csv_parses_into_typed_records():
    ks = ncu.kernels_from_csv((NCU_FIX / "swish_h100_raw.csv").read_text(), _known())
    assert [k.origin for k in ks] == ["candidate", "pytorch"]
    k = ks[0]
    assert k.name == SWISH_KERNEL
    assert k.duration_us == pytest.approx(96.64)  # 96,640 nsecond
    assert k.dram_read_bytes == 134_250_112 and k.dram_write_bytes == 134_217_984
    assert k.dram_bandwidth_gbps == pytest.approx(2778.431204512)
    assert k.sm_throughput_pct == pytest.approx(24.66) and k.memory_throughput_pct == pytest.approx(83.12)
    assert k.achieved_occupancy_pct == pytest.approx(86.45) and k.theoretical_occupancy_pct == 100
    assert k.registers_per_thread == 30 and k.shared_mem_per_block_bytes == 0
    assert k.occupancy_limits == {"registers": 8, "shared_mem": 32, "warps": 8, "blocks": 32}
    assert k.occupancy_limiter == "registers, warps"
    assert k.l1_hit_rate_pct == pytest.approx(0.02) and k.l2_hit_rate_pct == pytest.approx(9.87)
    assert k.issue_slots_busy_pct == pytest.approx(17.35) and k.tensor_pipe_pct == 0
    assert k.branch_uniformity_pct == 100
    assert k.global_load_bytes == 134_283_264 and k.global_store_bytes == 134_217_728
    assert k.top_stalls == [("long_scoreboard", 29.87), ("lg_throttle", 2.31), ("wait", 1.93)]
    assert k.block_size == "(256, 1, 1)" and k.grid_size == "(32768, 1, 1)"
    assert len(k.metrics) == len(ncu.METRIC_SETS["judge"])  # every metric of the set was read


def test_ncu_details_csv_with_scaled_units_and_prof_lines():
    (k,) = ncu.kernels_from_csv((NCU_FIX / "swish_h100_details.csv").read_text(), _known())
    assert k.origin == "candidate"
    assert k.duration_us == pytest.approx(96.64)  # usecond
    assert k.dram_read_bytes == pytest.approx(134.25e6)  # Mbyte
    assert k.dram_bandwidth_gbps == pytest.approx(2780)  # Tbyte/second
    assert k.top_stalls == [("long_scoreboard", 29.87)]


def test_ncu_failures_name_the_reason():
    assert "ERR_NVGPUCTRPERM" in ncu.failure_reason(
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters", 1
    )
    assert "LibraryNotLoaded" in ncu.failure_reason("==ERROR== LibraryNotLoaded: libcupti", 1)
    assert "no kernels" in ncu.failure_reason("==WARNING== No kernels were profiled.", 0)
    assert ncu.failure_reason("==PROF== Disconnected from process 1", 0) is None
    out = r"==ERROR== Failed to find metric regex:^sm__pipe_tensor_cycles_active\.(sum|avg)$"
    assert ncu.missing_metrics(out) == {"sm__pipe_tensor_cycles_active"}


def test_ncu_is_not_found_where_configured_path_points_nowhere(tmp_path):
    assert ncu.find_ncu(str(tmp_path / "no-ncu-here")) is None


def test_metric_filter_keeps_launch_metrics_and_drops_unknown():
    known = {m.split(".")[0] for m in ncu.METRIC_SETS["judge"] if "tensor" not in m} | {f"x__{i}" for i in range(60)}
    kept, dropped = ncu.filter_metrics(ncu.METRIC_SETS["judge"], known - {"launch__block_size"})
    assert dropped == ["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]
    assert "launch__block_size" in kept
    assert ncu.filter_metrics(["a__b.sum"], set()) == (["a__b.sum"], [])  # failed query: keep all
    assert ncu.kernel_filter({"swish_affine_kernel", "k2"}) == "regex:.*(k2|swish_affine_kernel).*"
    assert ncu.kernel_filter(set()) is None


# ---- kernel origins ------------------------------------------------------------------------


def test_kernel_origins():
    known = _known() | kernel_names.candidate_kernel_names(
        ["@triton.jit\ndef fused_gelu(x_ptr, n, BLOCK: tl.constexpr):\n    pass\n"]
    )
    assert known == {"swish_affine_kernel", "fused_gelu"}

    def c(n):
        return kernel_names.classify(n, known)

    assert c(SWISH_KERNEL) == "candidate"
    assert c("fused_gelu") == "candidate"
    assert (
        c(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
        )
        == "pytorch"
    )
    assert c("nvjet_tst_128x64_64x8_1x2_h_bz_TNN") == "pytorch"
    assert (
        c(
            "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
        )
        == "pytorch"
    )
    assert c("triton_poi_fused_mul_sigmoid_0") == "pytorch"  # torch.compile's, not the candidate's
    assert c("aten::mul") == "pytorch"
    assert c(kernel_names.cpu_op_label("ext", "fn")) == "candidate"
    assert c("void some_other_kernel<128>(float*)") == "unknown"
    # a kernel the candidate did not write in its text but that its binary holds
    so = b"\x00_Z16my_templated_kerILi128EEvPf\x00"
    assert kernel_names.classify("void my_templated_ker<128>(float*)", set(), [so]) == "candidate"


# ---- roofline ------------------------------------------------------------------------------


def test_roofline_memory_bound():
    # 8 MB moved, no FLOPs, 1 TB/s peak: floor 8 us; measured 16 us -> 50% of the floor
    r = roofline.compute(flops=0, min_bytes=8e6, time_ms=0.016, peak_bytes_per_s=1e12, peak_flops_per_s=1e14)
    assert r.bound == "memory"
    assert r.floor_ms == pytest.approx(0.008)
    assert r.fraction_of_floor == pytest.approx(0.5)
    assert r.achieved_bytes_per_s == pytest.approx(5e11)
    assert r.ridge == pytest.approx(100)


def test_roofline_compute_bound():
    # 4096^3 matmul: 2*4096^3 FLOP, 3 * 4096^2 * 4 bytes, at 50 TFLOP/s and 2 TB/s
    n = 4096
    r = roofline.compute(2 * n**3, 3 * n * n * 4, time_ms=5.0, peak_bytes_per_s=2e12, peak_flops_per_s=50e12)
    assert r.bound == "compute"
    assert r.intensity == pytest.approx(2 * n**3 / (12 * n * n))
    assert r.floor_ms == pytest.approx(2 * n**3 / 50e12 * 1e3)
    assert r.fraction_of_floor == pytest.approx(r.floor_ms / 5.0)
    with pytest.raises(ValueError):
        roofline.compute(1, 1, 0.0, 1.0, 1.0)


def test_roofline_peaks_prefer_datasheet():
    from kernelwright.engine.child.gpu_facts import datasheet_for

    sheet = datasheet_for("NVIDIA H100 80GB HBM3")
    assert sheet["label"] == "H100 SXM" and sheet["bandwidth_bytes_per_s"] == pytest.approx(3.35e12)
    assert datasheet_for("NVIDIA H100 PCIe")["label"] == "H100 PCIe"
    assert datasheet_for("NVIDIA H200")["label"] == "H200 SXM"
    assert datasheet_for("NVIDIA L4")["label"] == "L4" and datasheet_for("NVIDIA L40S")["label"] == "L40S"
    facts = {"datasheet": sheet, "measured": {"copy_bandwidth_bytes_per_s": 2.9e12, "matmul_fp32_flops_per_s": 5e13}}
    assert roofline.choose_peaks(facts, "bf16") == (sheet["flops_per_s"]["bf16"], 3.35e12, "datasheet (H100 SXM)")
    assert roofline.choose_peaks({"measured": facts["measured"]}, "fp32") == (5e13, 2.9e12, "measured")


# ---- the torch.profiler fallback and roofline on the CPU -------------------------------------


def _profiled(cfg, **kw):
    return replace(cfg, profile=ProfileConfig(enabled=True, **kw))


def test_python_candidate_profile_on_cpu_is_pytorch_ops(cpu_config):
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", _profiled(cpu_config, ncu_path="/nonexistent/ncu"))
    assert r.status is Status.PASSED, r.error_log
    p = r.metadata["profile"]
    assert p["source"] == "torch.profiler"
    assert "ran on the CPU" in p["fallback_reason"]
    assert {e["origin"] for e in p["ops"]} == {"pytorch"}
    assert all(e["name"].startswith("aten::") for e in p["ops"])
    assert r.stage_times.profile_s is not None


@pytest.mark.slow
def test_cpp_candidate_profile_names_its_op_and_gets_a_roofline(cpu_config):
    r = evaluate(CPU_EXAMPLE / "problem.py", CPU_EXAMPLE / "candidate.py", _profiled(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    p = r.metadata["profile"]
    assert p["source"] == "torch.profiler" and p["device_type"] == "cpu"
    cand = [e for e in p["ops"] if e["origin"] == "candidate"]
    assert [e["name"] for e in cand] == ["kw::candidate:kw_example_swish_cpu.fused_swish_affine"]
    assert cand[0]["count"] == 1 and cand[0]["total_us"] > 0
    assert p["summary"]["candidate"]["launches"] == 1
    # what the candidate's C++ calls back into PyTorch for (empty_like, contiguous) is named as PyTorch's
    assert any(e["name"] == "aten::empty_like" for e in p["ops_called_by_candidate"])

    work = r.metadata["reference_work"]
    batch, feat = 1024, 2048
    assert work["flops"] == 0  # elementwise ops: FlopCounterMode counts none
    assert work["min_bytes"] == 4 * (batch * feat + 2 * feat + batch * feat)
    rl = r.metadata["roofline"]
    assert rl["bound"] == "memory" and rl["peak_source"] == "measured"
    assert rl["time_ms"] == r.candidate_ms
    bw = r.metadata["gpu_facts"]["measured"]["copy_bandwidth_bytes_per_s"]
    assert rl["floor_ms"] == pytest.approx(work["min_bytes"] / bw * 1e3)
    assert rl["fraction_of_floor"] == pytest.approx(rl["floor_ms"] / r.candidate_ms)

    text = render_for_llm_judge(r)
    assert "Roofline:" in text and "memory-bound" in text
    assert "kw::candidate:kw_example_swish_cpu.fused_swish_affine" in text
    assert "ncu unavailable: ncu profiles CUDA kernels" in text
    assert len(text.splitlines()) < 25


def test_roofline_without_profile_is_the_default(cpu_config):
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED
    assert "profile" not in r.metadata  # the kernel profile is opt-in
    assert r.metadata["roofline"]["bound"] == "memory"
    assert r.metadata["reference_work"]["min_bytes"] == 2 * 64 * 128 * 4
    assert render_for_llm_judge(r).startswith("Device: cpu")


# ---- prebuilding -------------------------------------------------------------------------


@pytest.mark.slow
def test_prebuild_then_evaluate_hits_the_cache(cpu_config, tmp_path, cache_dir):
    cfg = replace(cpu_config, cache_dir=str(tmp_path / "fresh-cache"))
    seed_headers(cfg.cache_dir, cache_dir)  # an empty cache of builds (the build is cold), torch's headers parsed
    text = (CANDIDATES / "cpp_same_name_1.py").read_text()
    problem = ADD_ONE
    with BuildPool(max_workers=1, config=cfg, arch_list=None) as pool:
        pre = pool.submit(problem, text).result(timeout=600)
    assert pre.ok, pre.error
    assert len(pre.builds) == 1 and pre.builds[0]["cached"] is False and pre.builds[0]["ok"]
    r = evaluate(problem, candidate_text=text, config=cfg)
    assert r.status is Status.PASSED, r.error_log
    b = r.metadata["builds"][0]
    assert b["cached"] is True and b["key"] == pre.builds[0]["key"]
    assert r.stage_times.build_s < pre.builds[0]["call_s"]  # (a load, not a compile: under any load)


def test_prebuild_of_a_broken_candidate_is_reported_not_raised(cpu_config):
    with BuildPool(max_workers=1, config=cpu_config, arch_list=None) as pool:
        res = pool.submit(ADD_ONE, "def nope(:\n").result(timeout=120)
    assert not res.ok and res.error


# ---- one ncu profile at a time on a machine ------------------------------------------------------

_HOLD = """
import sys, time
from kernelwright.engine import nsight
with nsight.profiling_lock(30, sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(path, seconds):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_profile_waits_for_the_first_and_says_how_long(tmp_path):
    lock = tmp_path / "ncu.lock"
    other = _holder(lock, 1.5)  # another evaluation's profile, in another process
    try:
        with ncu.profiling_lock(30, str(lock)) as waited:
            pass
        assert 1.0 < waited < 10  # it came only once the other one (holding it 1.5 s) let go
    finally:
        other.wait(timeout=30)


def test_a_lock_held_too_long_ends_the_profile_with_the_reason(tmp_path):
    lock = tmp_path / "ncu.lock"
    other = _holder(lock, 5)
    try:
        with pytest.raises(ncu.NcuUnavailable, match="held the profiling lock"):
            with ncu.profiling_lock(0.5, str(lock)):
                pass
    finally:
        other.kill()
        other.wait(timeout=30)


def test_ncu_runs_only_while_the_machine_lock_is_held(tmp_path, monkeypatch):
    import fcntl
    import os

    lock = tmp_path / "ncu.lock"
    monkeypatch.setattr(ncu, "LOCK_PATH", str(lock))
    seen = []

    def fake_profile(*args, **kwargs):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("free")  # nobody held it: ncu would have run unserialised
        except BlockingIOError:
            seen.append("held")
        finally:
            os.close(fd)
        return ncu.NcuProfile("ncu", [], "judge", [], [], None, None, "", [], "", 0.1)

    monkeypatch.setattr(ncu, "_profile", fake_profile)
    prof = ncu.profile("ncu", [], {}, tmp_path, {}, 60, "judge", 4, set(), [], tmp_path)
    assert seen == ["held"] and prof.lock_wait_s >= 0
