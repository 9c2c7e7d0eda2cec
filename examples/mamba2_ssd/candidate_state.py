"""Mamba-2 SSD in fused CUDA kernels, returning the final state.

The kernel source is the same as candidate_y.py (one build serves both); here it runs in its
state-only mode: no C, no Y; segments (tensor cores) chain their end states, the last one is
written out.

Two kernels in one source, picked by shape (`ssd_fused_cfg` / `ssd_fused_path` force one):
  * d_state 64 or 128: every matrix product on the tensor cores in split precision
    (a = a_hi + a_lo; a*b ~= a_lo*b_hi + a_hi*b_lo + a_hi*b_hi, fp32 accumulate): 3xTF32 keeps
    ~fp32 accuracy (plain TF32 gives ~1e-3 normwise); the state lives in mma accumulators. The
    auto choice: path 5 for fp32 Y (the state products in 3xBF16, below), path 6 for bf16, path 2
    (all 3xTF32) for the fp32 final state.
    The sequence is cut into segments so that the grid fills the GPU at any length:
      1. local pass, all segments in parallel: each segment's own end state from a zero state
         (starting after the steps whose weight to the segment end, exp(sum of A), is below
         exp(-110): zero in float32, so they contribute exactly nothing; with decaying A this
         pass is short, with A near 0 it walks the whole segment);
      2. chain: block k waits for H_out[k-1] (flag, release/acquire), publishes
         H_out[k] = exp(sum of A over segment k) * H_out[k-1] + local state k: one [p x n] axpy
         a segment, the only serial part;
      3. output pass: each segment walks again from its entering state and writes Y.
    Blocks take tickets in segment-major order, so a block's predecessor has always started
    (no deadlock). With enough (batch, head) pairs to fill the SMs it uses one segment (no
    extra pass). bfloat16 inputs/outputs: same kernel, bf16 loads and stores, fp32 arithmetic;
    raw bf16 inputs are exact in TF32, so their split's lo part (and its mma) is skipped.
    Path 5: path 2 with the two state products (C H and the state update, 2/3 of the tensor work)
    in split-precision 3xBF16 (mma m16n8k16: half the instructions of 3xTF32 for them); error
    ~1e-6 normwise on Mamba-like inputs, up to ~5e-6 where the state dominates (growing A, the
    final state), against ~2e-7 for path 2. Path 6: C B^T in 3xBF16 too (its C split shared with
    C H); fastest, but 3e-5 in fp32 on spiky A, so it is the auto path only for bf16, where the
    output's own rounding (~1e-3) dominates.
  * other d_state (the KernelBench default has 16): FP32 FFMA on the CUDA cores, one block per
    (batch, head, head-dim tile) walking the sequence (bf16 inputs are widened to fp32 first).

Inside a walk, 32 steps per chunk (the chunked form gives the same function for any block_len,
so the problem's block_len only sets the reference's own rounding). Per chunk:
  G = (C B^T) * exp(cum_l - cum_s) for s <= l           (intra-chunk "attention")
  Y = G X + exp(cum_l) * C H^T                          (H: state entering the chunk)
  H = exp(total) * H + (exp(total - cum_s) * X)^T B     (state leaving the chunk)
The running state H stays on chip; the next chunk's inputs are in flight while the current
chunk computes. Exponent arguments are formed from a float64 prefix sum and always as
differences (never exp(a) * exp(-b)), so neither large positive nor large negative A overflows
or underflows where the true decay does not.
"""

# Written by make_candidates.py from ssd_kernel.cu and ssd_bindings.cpp: edit those, then run
# `python3 examples/mamba2_ssd/make_candidates.py`.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <atomic>
#include <cstdint>
#include <type_traits>

// ======================================================================================
// Tensor-core path (d_state 64 or 128), split into segments along the sequence.
//
// Arithmetic (path 2; paths 5 and 6 move some products to 3xBF16, see "path 5" below): every
// matrix product on the tensor cores (mma.sync m16n8k8 TF32) in split precision, "3xTF32":
//     a = a_hi + a_lo, a_hi = tf32(a), a_lo = a - a_hi (exact in fp32)
//     a*b ~= a_lo*b_hi + a_hi*b_lo + a_hi*b_hi      (fp32 accumulate; a_lo*b_lo dropped)
// which keeps ~fp32 accuracy (TF32 alone gives ~1e-3 normwise). With bf16 inputs every raw
// input (X, B, C) is exact in TF32 (8 of TF32's 10 mantissa bits), so its lo part is zero and
// that product is skipped: C B^T takes 1 mma, the others 2 (state, G and w X stay split).
//
// Work split (why long sequences fill the GPU): the sequence of each (batch, head) is cut into
// `nseg` segments; one thread block per (segment, batch, head, head-dim tile), blocks numbered
// by an atomic ticket in segment-major order (so a block's predecessor segment has always
// started: no deadlock whatever the scheduling). Each block:
//   1. local pass: walks its segment from a zero state, state update only (no C, no Y), giving
//      the segment's own contribution S_loc; g = sum(A) over the segment in float64. The walk
//      starts at the first chunk holding a step whose weight to the segment end,
//      exp(sum of A after it), is >= exp(-110): earlier steps have weight 0 in float32 (smallest
//      denormal 1.4e-45), so they contribute exactly nothing. With decaying A (Mamba's A < 0) the
//      local pass covers the last few hundred steps only; with A near 0 it walks the segment.
//      (Skipped for the last segment when Y is wanted, and when nseg == 1.)
//   2. chain: waits for the predecessor's published state H_out[k-1] (= H_in[k]), publishes
//      H_out[k] = exp(g) * H_in[k] + S_loc (one [p x n] axpy, 32 KB in fragment order, flag
//      with release/acquire). The serial part is one axpy per segment, not a walk.
//   3. output pass: walks the segment again from H_in[k], as the single-segment kernel does.
// nseg is chosen so that (segments x batch x heads x tiles) fills the SMs (2 blocks an SM);
// at nseg == 1 it is the plain one-block-per-(batch, head) kernel with no extra pass.
//
// Inside a walk (per block = (b, h, P head-dim columns), 2*P/16 warps; warp (mt, nh) owns the
// state tile H^T[16 p-rows of mt][N/2 n-columns of half nh] as mma accumulators), per 32-step
// chunk (l, s: steps in chunk):
//   phase B (after barrier 1):
//     Y^T  = H^T C^T            partial over the warp's n-half           (C H, 4 l-tiles)
//     Gp_q = C B^T              over one quarter q of n, written to smem (6 causal tiles)
//     (beside it: n-half 0 stores the last chunk's Y rows; warp P/16, of n-half 1, makes the chunk's
//     cum/exp tables, so no warp carries both)
//   between barrier 2 and barrier 2b, once per block (each thread 4 elements, in place):
//     G    = (sum_q Gp_q) * exp(cum_l - cum_s), s <= l, TF32-split for the mma
//   phase C (after barrier 2b):
//     Y^T  = e_l * Y^T + X^T G^T
//     H^T  = dec * H^T + (w_s X)^T B                                    (state update)
//   Y = the two n-halves' Y^T summed (nh=1 leaves its half in smem), written by nh=0 after
//   the next barrier 1.
// Instruction count matters here (at ~0.5 instructions issued a scheduler a cycle): chunk copies step
// per-thread pointers (load_rows), G is formed once per block rather than by each of the four warps
// that read it, bf16 halves are unpacked by a shift and a mask, Y rows by a stepped pointer. Below
// ~200 M instructions at l2048 the loop waits on latency instead (Nsight Compute's stall samples): so
// G's four decays are formed without a branch (their chains overlap) and the tables are off warp 0.
// The trick that keeps H in registers: an mma accumulator tile (thread holds columns 2t,
// 2t+1) is used directly as the A operand of the next product if the k index is permuted
// (k-slot t <-> column 2t, k-slot t+4 <-> column 2t+1); the B operand (C) is then read with
// the same permutation, which makes it one 8-byte (bf16: 4-byte) shared load.
// ======================================================================================

namespace tc {

constexpr int Q = 32;  // steps per chunk
constexpr double kUnderflow = 110.0;  // exp(-110) ~ 1.7e-48: zero in float32

template <typename T> struct Elem;
template <> struct Elem<float> {
  static constexpr bool EXACT = false;  // a raw input is not exact in TF32
  static __device__ __forceinline__ float one(const float* p) { return *p; }
  static __device__ __forceinline__ float2 two(const float* p) { return *reinterpret_cast<const float2*>(p); }
  static __device__ __forceinline__ void put(float* p, float v) { *p = v; }
};
template <> struct Elem<__nv_bfloat16> {
  static constexpr bool EXACT = true;   // bf16 -> fp32 is exact in TF32: lo part is zero
  static __device__ __forceinline__ float one(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ __forceinline__ float2 two(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
  static __device__ __forceinline__ void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};

__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  uint32_t h;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(x));
  hi = h;
  lo = __float_as_uint(x - __uint_as_float(h));  // exact; the tensor core reads its top 19 bits
}

// d += a * b on a 16x8x8 TF32 tile, fp32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The RN split, 3 instructions (VIADD, LOP3, FADD) where cvt.rna costs 5 on sm_90 (VIADD,
// FSETP, SEL, LOP3; FADD): hi = x + half a TF32 ulp, left unmasked: the tensor core reads only the
// top 19 bits of a .tf32 operand register (it reads lo that way in every path), i.e. x rounded to
// nearest TF32, ties away from zero: the value cvt.rna gives for finite x, so lo = x - that value is
// the same exact float32 and the products are bit for bit those of split_tf32. (Not for inf/NaN:
// no finite result either way.) Truncation alone (hi = x, 2 instructions) measured 4x the error in
// emulation (6-7e-7 against 1.5e-7): its errors all have the sign of x and add up.
__device__ __forceinline__ void split_rn(float x, uint32_t& hi, uint32_t& lo) {
  const uint32_t h = __float_as_uint(x) + 0x1000u;
  hi = h;
  lo = __float_as_uint(x - __uint_as_float(h & 0xffffe000u));
}

struct SplitA { uint32_t hi[4], lo[4]; };
struct SplitB { uint32_t hi[2], lo[2]; };

// EX: the value is exact in TF32 (a raw bf16 input): hi = the value, lo = 0 (never used).
// RN: split by split_rn, else by cvt.rna (split_tf32); the same values.
template <bool EX, bool RN = false>
__device__ __forceinline__ SplitA split_a(float a0, float a1, float a2, float a3) {
  SplitA s;
  const float v[4] = {a0, a1, a2, a3};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (EX) { s.hi[i] = __float_as_uint(v[i]); s.lo[i] = 0u; }
    else if constexpr (RN) split_rn(v[i], s.hi[i], s.lo[i]);
    else split_tf32(v[i], s.hi[i], s.lo[i]);
  }
  return s;
}
template <bool EX, bool RN = false>
__device__ __forceinline__ SplitB split_b(float b0, float b1) {
  SplitB s;
  if constexpr (EX) {
    s.hi[0] = __float_as_uint(b0); s.hi[1] = __float_as_uint(b1); s.lo[0] = s.lo[1] = 0u;
  } else if constexpr (RN) {
    split_rn(b0, s.hi[0], s.lo[0]);
    split_rn(b1, s.hi[1], s.lo[1]);
  } else {
    split_tf32(b0, s.hi[0], s.lo[0]);
    split_tf32(b1, s.hi[1], s.lo[1]);
  }
  return s;
}
// Split-precision product, small terms first; a term with an exact operand's lo part is skipped.
template <bool AEX, bool BEX>
__device__ __forceinline__ void mma3(float (&d)[4], const SplitA& a, const SplitB& b) {
  if constexpr (!AEX) mma_tf32(d, a.lo, b.hi[0], b.hi[1]);
  if constexpr (!BEX) mma_tf32(d, a.hi, b.lo[0], b.lo[1]);
  mma_tf32(d, a.hi, b.hi[0], b.hi[1]);
}

// ---- path 5: the state products (C H and the state update) in split-precision "3xBF16" ----------
// a = a_hi + a_lo with a_hi = bf16(a), a_lo = bf16(a - a_hi) (round to nearest even both times):
// a_hi + a_lo is a to 16 bits (|a - a_hi - a_lo| <= 2^-16 |a|), and a*b ~= a_lo*b_hi + a_hi*b_lo +
// a_hi*b_hi drops a_lo*b_lo (<= 2^-16 |a b|). One mma.sync m16n8k16 bf16 does 16 k-steps where
// m16n8k8 tf32 does 8, at the same issue cost, so these products take half the tensor instructions
// of 3xTF32. Their error is larger (up to ~2^-15 a product against ~2^-20), but with decaying A the
// state's share of the output is small; the intra-chunk products (C B^T, G X), which dominate the
// output's error, stay 3xTF32.
// Modelled on the benchmark's inputs (float64 emulation of the chunk recurrence, l 512, n 128):
// all four products in 3xBF16 give 6e-6 normwise, C H and the state update only 1.0e-6, 3xTF32 1.4e-7.
struct BfA { uint32_t hi[4], lo[4]; };  // m16n8k16 A fragment: 4 registers of 2 bf16 each
struct BfB { uint32_t hi[2], lo[2]; };  // B fragment: 2 registers
__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }
// x0 in the low half (the lower k index), x1 in the high half; EX: both exact in bf16 (lo unused)
template <bool EX>
__device__ __forceinline__ void split_bf2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = bf2_bits(__floats2bfloat162_rn(x0, x1));
  if constexpr (EX) {
    lo = 0u;
  } else {
    // hi's halves as floats by a shift and a mask (2 instructions; __bfloat1622float2 compiled to 4)
    const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
    lo = bf2_bits(__floats2bfloat162_rn(x0 - h0, x1 - h1));  // x - hi: exact in float32
  }
}
// d += a * b on a 16x8x16 bf16 tile, fp32 accumulate. Fragments (PTX ISA), g = lane >> 2, t = lane & 3:
// A: reg 0 (row g, k 2t, 2t+1), 1 (g+8, 2t..), 2 (g, 2t+8..), 3 (g+8, 2t+8..); B: reg 0 (k 2t, 2t+1;
// col g), reg 1 (k 2t+8, 2t+9); C, D as m16n8k8.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <bool AEX, bool BEX>
__device__ __forceinline__ void mma3_bf(float (&d)[4], const BfA& a, const BfB& b) {
  if constexpr (!AEX) mma_bf16(d, a.lo, b.hi[0], b.hi[1]);
  if constexpr (!BEX) mma_bf16(d, a.hi, b.lo[0], b.lo[1]);
  mma_bf16(d, a.hi, b.hi[0], b.hi[1]);
}
// The A operand of C B^T (C rows l = 16mi + g and + 8) from C's fragments as read for l-tiles 0..3
// (B operands of C H): registers r of l-tile 2mi, then of 2mi + 1. TF32 (SplitA from SplitB) and
// bf16 (BfA from BfB) alike. Selects, not a run-time index into f (that would go to local memory).
template <class FA, class FB>
__device__ __forceinline__ FA c_rows_as_a(int mi, const FB (&f)[4]) {
  FA a;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    a.hi[0 + 2 * r] = mi ? f[2].hi[r] : f[0].hi[r];
    a.lo[0 + 2 * r] = mi ? f[2].lo[r] : f[0].lo[r];
    a.hi[1 + 2 * r] = mi ? f[3].hi[r] : f[1].hi[r];
    a.lo[1 + 2 * r] = mi ? f[3].lo[r] : f[1].lo[r];
  }
  return a;
}
// A fragment from 4 pairs (registers 0..3 as above)
template <bool EX>
__device__ __forceinline__ BfA split_bf_a(float a0, float a1, float a2, float a3, float a4, float a5, float a6,
                                          float a7) {
  BfA s;
  split_bf2<EX>(a0, a1, s.hi[0], s.lo[0]);
  split_bf2<EX>(a2, a3, s.hi[1], s.lo[1]);
  split_bf2<EX>(a4, a5, s.hi[2], s.lo[2]);
  split_bf2<EX>(a6, a7, s.hi[3], s.lo[3]);
  return s;
}
template <bool EX>
__device__ __forceinline__ BfB split_bf_b(float b0, float b1, float b2, float b3) {
  BfB s;
  split_bf2<EX>(b0, b1, s.hi[0], s.lo[0]);
  split_bf2<EX>(b2, b3, s.hi[1], s.lo[1]);
  return s;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0 source bytes: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// threadIdx.x read afresh (S2R) at each call: values derived from it are recomputed where they are
// used instead of being hoisted out of a loop and kept live (where registers are short, they spill).
__device__ __forceinline__ int tid_x() {
  int v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  return v;
}

__device__ __forceinline__ float exp_from_double(double x) {
  const float hi = (float)x;
  const float lo = (float)(x - (double)hi);
  return expf(hi) * (1.f + lo);
}

// The end of a chained segment's state (the tensor-core paths): H_out = dec * H_in + S_loc, S_loc in hs and
// H_in in hv, each thread holding K float4 of the state in mma-fragment order. Not the last
// segment: H_out is stored for the successor (slot `slot` of ws, NP floats each, in the same fragment order, so the
// successor's threads read back what they own), fenced, and its flag released after a barrier.
// The last segment (state mode): H_out is left in hv, the final state.
template <int K, int NT, int NP>
__device__ __forceinline__ void chain_publish(float (&hs)[K][4], float (&hv)[K][4], float dec, bool last,
                                              float* ws, int* sync, int slot, int tid) {
#pragma unroll
  for (int j = 0; j < K; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) hs[j][r] = fmaf(dec, hv[j][r], hs[j][r]);
  if (!last) {
    float4* dst = reinterpret_cast<float4*>(ws + (long)slot * NP);
#pragma unroll
    for (int j = 0; j < K; ++j) __stcg(dst + j * NT + tid, make_float4(hs[j][0], hs[j][1], hs[j][2], hs[j][3]));
    __threadfence();
    __syncthreads();
    if (tid == 0) st_release(sync + 1 + slot, 1);
  } else {
#pragma unroll
    for (int j = 0; j < K; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) hv[j][r] = hs[j][r];
  }
}


// Warp 0, lane l holding A of step l of a chunk (0 past the walk's end): the float64 prefix sums of
// A (sCum), exp(cum_l) (sE), exp(total - cum_l) (sW), exp(total) (sDec[0]); returns the total.
// Exponents always as differences of float64 sums.
__device__ __forceinline__ double chunk_tables(float pa, int lane, double* sCum, float* sE, float* sW, float* sDec) {
  double cum = (double)pa;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double u = __shfl_up_sync(0xffffffffu, cum, off);
    if (lane >= off) cum += u;
  }
  const double total = __shfl_sync(0xffffffffu, cum, 31);
  sCum[lane] = cum;
  sE[lane] = exp_from_double(cum);
  sW[lane] = exp_from_double(total - cum);
  if (lane == 0) sDec[0] = exp_from_double(total);
  return total;
}

// Warp 0, for the local pass over [tb, te) (A of this (batch, head) at Abh, stride H): the sum of A
// over the segment (float64, into tot) and the chunk boundary c0 where the walk starts. Steps whose
// weight in the local state, exp(sum of A from the step to the segment end), is below exp(-110)
// (< 1e-47: zero in float32, whose smallest denormal is 1.4e-45) contribute exactly nothing in
// float32 arithmetic: the walk starts after them.
__device__ __forceinline__ int local_walk_start(const float* Abh, int H, int tb, int te, int lane, double& tot_out) {
  double tot = 0.0;
#pragma unroll 8
  for (int x = tb + lane; x < te; x += 32) tot += (double)__ldg(Abh + (long)x * H);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, off);
  int c0 = tb;
  if (tot < -kUnderflow) {
    // lane i takes chunk i of each round of 32 chunks: its sum and the min of its running sums;
    // across lanes a scan gives P (prefix sums of A) and a min-scan the running min of P.
    // A chunk can be skipped while min P(x) over x <= its end stays > total + 110.
    const int nch = (te - tb + Q - 1) / Q;
    double carry = 0.0, mcarry = 1e300;
    for (int r0 = 0; r0 < nch; r0 += 32) {
      const int ci = r0 + lane, cs = tb + ci * Q;
      double run = 0.0, lmin = 1e300;
      if (ci < nch) {
#pragma unroll
        for (int u0 = 0; u0 < Q; u0 += 8) {
          float av[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) av[u] = (cs + u0 + u < te) ? __ldg(Abh + (long)(cs + u0 + u) * H) : 0.f;
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            run += (double)av[u];
            if (cs + u0 + u < te) lmin = fmin(lmin, run);
          }
        }
      }
      double inc = run;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += u;
      }
      double cm = (ci < nch) ? carry + (inc - run) + lmin : 1e300;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, cm, off);
        if (lane >= off) cm = fmin(cm, u);
      }
      cm = fmin(cm, mcarry);
      const unsigned okm = __ballot_sync(0xffffffffu, ci < nch && cm > tot + kUnderflow);
      const int cnt = __popc(okm);  // the ok chunks lead (the running min only falls)
      c0 = min(te, tb + (r0 + cnt) * Q);
      if (cnt < 32) break;
      carry += __shfl_sync(0xffffffffu, inc, 31);
      mcarry = __shfl_sync(0xffffffffu, cm, 31);
    }
  }
  tot_out = tot;
  return c0;
}

// cp.async of rows t0 .. t0 + Q - 1 (W elements each, global row stride gstride) into shared rows of
// SS elements; rows from te_ on are zero-filled. Trip counts known at compile time (NT threads);
// offsets inside the chunk in int (fewer registers; the host checks that Q rows fit). The thread's
// offsets are recomputed from tid_x() at each call (a few integer instructions a chunk): hoisted
// out of the chunk loop they were live across it and spilled. When the threads tile the rows
// exactly (every launched shape), a thread copies one 16-byte column c of rows s0, s0 + RS, ...:
// its two pointers are formed once and stepped, ~5 instructions a copy (the general loop below
// took ~24: a signed division and a 64-bit product a copy).
template <int W, int SS, int NT, int EPV, typename T>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int gstride, int t0, int te_) {
  constexpr int PER_ROW = W / EPV, TOTAL = Q * PER_ROW;
  const int tid = tid_x();
  const T* row0 = src + (long)t0 * gstride;  // the chunk's first row (always inside the sequence)
  if constexpr (NT % PER_ROW == 0 && TOTAL % NT == 0) {
    constexpr int RS = NT / PER_ROW;  // rows between a thread's copies
    const int s0 = (int)((unsigned)tid / PER_ROW), c = (int)((unsigned)tid % PER_ROW);
    const T* gp = row0 + (s0 * gstride + EPV * c);
    T* dp = dst + (s0 * SS + EPV * c);
    const int left = te_ - t0 - s0;  // copy k is inside the sequence iff k * RS < left
#pragma unroll
    for (int k = 0; k < TOTAL / NT; ++k) {
      const bool ok = k * RS < left;  // (a row past the end is zero-filled: its source is not read)
      cp_async16(dp + k * RS * SS, ok ? gp + k * RS * gstride : row0, ok);
    }
  } else {
#pragma unroll
    for (int k = 0; k < (TOTAL + NT - 1) / NT; ++k) {
      const int i = tid + k * NT;
      if (TOTAL % NT == 0 || i < TOTAL) {
        const int s = i / PER_ROW, c = i % PER_ROW;
        const bool ok = t0 + s < te_;
        const int goff = (ok ? s * gstride : 0) + EPV * c;  // one int offset: one 64-bit add
        cp_async16(dst + (s * SS + EPV * c), row0 + goff, ok);
      }
    }
  }
}

template <int N, int P, typename T>
struct TcLayout {
  static constexpr int WARPS = 2 * (P / 16);
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int EPV = 16 / (int)sizeof(T);  // elements per 16-byte copy
  static constexpr int XS = P + 8;   // row strides (elements): conflict-free fragments (fp32 and bf16)
  static constexpr int NS = N + 8;
  static constexpr int GS = Q + 4;   // Gp rows (floats): conflict-free B-fragment reads
  static constexpr int NH = N / 2;   // state columns per warp
  static constexpr int KH = NH / 8;  // k-steps over a warp's n-half
  static constexpr int KQ = N / 32;  // k-steps over a quarter of n
  // byte offsets
  static constexpr int oX = 0;                                   // 2 buffers of [Q][XS] T
  static constexpr int oB = oX + 2 * Q * XS * (int)sizeof(T);    // 2 buffers of [Q][NS] T
  static constexpr int oC = oB + 2 * Q * NS * (int)sizeof(T);    // 1 buffer (refilled after its last reader)
  static constexpr int oG = oC + Q * NS * (int)sizeof(T);        // 4 quarter partials of C B^T, [Q][GS] f32
  static constexpr int oY = oG + 4 * Q * GS * 4;                 // nh=1 partial Y^T, fragment order
  static constexpr int oE = oY + (P / 16) * 32 * 16 * 4;         // exp(cum_l)
  static constexpr int oW = oE + Q * 4;                          // exp(total - cum_s)
  static constexpr int oD = oW + Q * 4;                          // exp(total), segment total (double)
  static constexpr int oCum = oD + 16;                           // cum (double)
  static constexpr size_t BYTES = oCum + 2 * Q * 4;
  static_assert(N == 64 || N == 128, "tensor-core path: d_state 64 or 128");
  static_assert(P == 32 || P == 64, "tensor-core path: 32 or 64 head-dim columns a block");
  static_assert(oC % 16 == 0 && oG % 16 == 0 && oY % 16 == 0 && oD % 8 == 0 && oCum % 8 == 0, "alignment");
};

// X, Y: (b, L, H, D) T; A: (b, L, H) f32; B, C: (b, L, H, N) T; S0, S_out: (b, H, D, N) f32 or null.
// nseg segments of seg_len steps (a multiple of Q); ws: nslots * N * P floats (published states),
// sync: [ticket, flag per slot], zeroed before the launch (only used when nseg > 1).
// BFS 1 (path 5): C H and the state update in 3xBF16 (m16n8k16), C B^T and G X in 3xTF32 as before;
// BFS 2 (path 6): C B^T in 3xBF16 too, its A operand (C) the bf16 split already made for C H.
template <int N, int P, bool WANT_Y, int MINB, typename T, int BFS = 0>
__global__ void __launch_bounds__(TcLayout<N, P, T>::THREADS, MINB)
ssd_tc_kernel(const T* __restrict__ X, const float* __restrict__ A, const T* __restrict__ Bm,
              const T* __restrict__ Cm, const float* __restrict__ S0, T* __restrict__ Y,
              float* __restrict__ S_out, int nb, int L, int H, int D, int seg_len, int nseg,
              float* __restrict__ ws, int* __restrict__ sync) {
  using Lo = TcLayout<N, P, T>;
  using E = Elem<T>;
  constexpr bool EX = E::EXACT;
  constexpr int XS = Lo::XS, NS = Lo::NS, GS = Lo::GS, KH = Lo::KH, KQ = Lo::KQ, NT = Lo::THREADS;
  constexpr int EPV = Lo::EPV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int s_ticket, s_c0;
  T* sC = reinterpret_cast<T*>(smem_raw + Lo::oC);
  float* sGp = reinterpret_cast<float*>(smem_raw + Lo::oG);
  float* sYp = reinterpret_cast<float*>(smem_raw + Lo::oY);
  float* sE = reinterpret_cast<float*>(smem_raw + Lo::oE);
  float* sW = reinterpret_cast<float*>(smem_raw + Lo::oW);
  float* sDec = reinterpret_cast<float*>(smem_raw + Lo::oD);
  double* sSeg = reinterpret_cast<double*>(smem_raw + Lo::oD + 8);
  double* sCum = reinterpret_cast<double*>(smem_raw + Lo::oCum);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;          // mma fragment coordinates
  const int mt = warp % (P / 16), nh = warp / (P / 16);
  const int pr = 16 * mt + g;                     // this thread's p rows: pr, pr + 8
  const int nb0 = nh * Lo::NH;                    // first state column of this warp
  constexpr int GRPS = (P / 16) / 2;              // warps per quarter
  constexpr int TPW = 6 / GRPS;                   // C B^T tiles per warp
  const int q = 2 * nh + mt / GRPS, grp = mt % GRPS;
  // C B^T tile i of group grp: (mi, sj) = (16-row l block, 8-column s block) of the 6 causal tiles.
  // Paths 2/3: tiles grp*TPW + i in order. Paths 5/6 with 2 groups: i -> mi is the same in both
  // groups ((0, grp), (1, grp), (1, 2 + grp)), so mi is known at compile time and the A operand is
  // picked without selects.
  auto gp_tile = [&](int i, int grp_, int& mi, int& sj) {
    if constexpr (BFS > 0 && GRPS == 2) {
      mi = i == 0 ? 0 : 1;
      sj = i == 2 ? 2 + grp_ : grp_;
    } else {
      const int tile = grp_ * TPW + i;
      mi = tile < 2 ? 0 : 1;
      sj = tile < 2 ? tile : tile - 2;
    }
  };

  // ---- which block: (segment, batch, head, tile); segment-major tickets when chained -------
  const bool chained = nseg > 1;
  int lin = blockIdx.x;
  if (chained) {
    if (tid == 0) s_ticket = atomicAdd(sync, 1);
    __syncthreads();
    lin = s_ticket;
  }
  const int ptiles = D / P;
  const int per_seg = nb * H * ptiles;
  const int seg = lin / per_seg;
  int rest = lin - seg * per_seg;
  const int pt = rest % ptiles;
  rest /= ptiles;
  const int h = rest % H, b = rest / H;
  const int slot = ((b * H + h) * ptiles + pt) * nseg + seg;
  const bool last = seg == nseg - 1;
  const int tb = seg * seg_len, te = min(L, tb + seg_len);

  const int p0 = pt * P;
  const long strideX = (long)H * D;
  const long bh = (long)b * L * H + h;
  const T* Xbh = X + bh * D + p0;
  const T* Bbh = Bm + bh * N;
  const T* Cbh = Cm + bh * N;
  const float* Abh = A + bh;

  // ---- state H^T tile in accumulator layout: hs[j] covers n = nb0 + 8j + {2t, 2t+1}, p = pr, pr+8
  float hs[KH][4];

  auto load_xb = [&](int t0, int te_, int buf) {  // X and B of the chunk at t0 -> buffer buf (cp.async)
    load_rows<P, XS, NT, EPV>(reinterpret_cast<T*>(smem_raw + Lo::oX) + buf * Q * XS, Xbh, H * D, t0, te_);
    load_rows<N, NS, NT, EPV>(reinterpret_cast<T*>(smem_raw + Lo::oB) + buf * Q * NS, Bbh, H * N, t0, te_);
  };
  auto load_c = [&](int t0, int te_) { load_rows<N, NS, NT, EPV>(sC, Cbh, H * N, t0, te_); };

  // Y^T partial (this warp's p rows x all 32 l): ya[lt] covers l = 8lt + {2t, 2t+1}
  float ya[4][4];
  // nh=0 warps add the nh=1 partial (left in smem, same fragment order) and store Y rows.
  // (One row pointer stepped by the stride: a 64-bit product a store cost ~10 instructions a row.)
  auto flush_y = [&](int t0, int te_) {
    const float4* src = reinterpret_cast<const float4*>(sYp) + mt * 4 * 32;
    const int rem = te_ - t0 - 2 * t;  // row 8lt + 2t + e of the chunk is inside iff 8lt + e < rem
    T* y0 = Y + (bh * D + (long)(t0 + 2 * t) * strideX + p0 + pr);
#pragma unroll
    for (int lt = 0; lt < 4; ++lt) {
      const float4 o = src[lt * 32 + lane];
      T* y1 = y0 + strideX;
      if (8 * lt < rem) {
        E::put(y0, ya[lt][0] + o.x);
        E::put(y0 + 8, ya[lt][2] + o.z);
      }
      if (8 * lt + 1 < rem) {
        E::put(y1, ya[lt][1] + o.y);
        E::put(y1 + 8, ya[lt][3] + o.w);
      }
      y0 += 8 * strideX;
    }
  };

  // Walk steps [t_begin, t_end) from the state in hs; do_y: output pass, else state only.
  // Warp TW returns the sum of A over the walk (float64) in segtot. Ends with a barrier.
  // The chunk tables are made by warp TW, the first warp of n-half 1: the n-half-0 warps store Y rows
  // in the same phase, and with the tables on warp 0 the other seven warps waited for it at barrier 2
  // (~9% of all warp stall samples at l2048, Nsight Compute, H100).
  constexpr int TW = P / 16;
  auto walk = [&](const int t_begin, const int t_end, const bool do_y, double& segtot) {
    float pa = 0.f;  // warp TW: A of the next chunk, one step per lane
    if (warp == TW) pa = (t_begin + lane < t_end) ? __ldg(Abh + (long)(t_begin + lane) * H) : 0.f;
    load_xb(t_begin, t_end, 0);
    if (WANT_Y && do_y) load_c(t_begin, t_end);
    cp_async_commit();
    const int nchunks = (t_end - t_begin + Q - 1) / Q;
    for (int ch = 0; ch < nchunks; ++ch) {
      const int t0 = t_begin + ch * Q, buf = ch & 1;
      const T* sX = reinterpret_cast<const T*>(smem_raw + Lo::oX) + buf * Q * XS;
      const T* sB = reinterpret_cast<const T*>(smem_raw + Lo::oB) + buf * Q * NS;
      cp_async_wait_all();
      __syncthreads();  // ---- barrier 1: this chunk's X, B, C are in smem; last chunk fully read
      if (WANT_Y && do_y) {
        if (ch > 0 && nh == 0) flush_y(t0 - Q, t_end);
      }
      if (ch + 1 < nchunks) load_xb(t0 + Q, t_end, buf ^ 1);
      cp_async_commit();
      if (warp == TW) {
        segtot += chunk_tables(pa, lane, sCum, sE, sW, sDec);
        pa = (t0 + Q + lane < t_end) ? __ldg(Abh + (long)(t0 + Q + lane) * H) : 0.f;
      }

      // ---- phase B: Y^T = H^T C^T over this warp's n-half; Gp_q = C B^T over quarter q ------
      if (WANT_Y && do_y) {
#pragma unroll
        for (int lt = 0; lt < 4; ++lt)
#pragma unroll
          for (int r = 0; r < 4; ++r) ya[lt][r] = 0.f;
        float ga[TPW][4];
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
          for (int r = 0; r < 4; ++r) ga[i][r] = 0.f;
        if constexpr (BFS) {
          // per 16 state columns (k16 block jj): C H^T in 3xBF16, the A operand H^T straight from the
          // accumulator tiles 2jj and 2jj+1 in natural k order (an m16n8 accumulator pair is an
          // m16k16 A fragment); C B^T on the k16 blocks that lie in the warp's quarter: BFS 1 in 3xTF32
          // on each 8-column half, BFS 2 in 3xBF16 with C's split shared with C H
#pragma unroll
          for (int jj = 0; jj < KH / 2; ++jj) {
            const int nbk = nb0 + 16 * jj;
            const BfA ha = split_bf_a<false>(hs[2 * jj][0], hs[2 * jj][1], hs[2 * jj][2], hs[2 * jj][3],
                                             hs[2 * jj + 1][0], hs[2 * jj + 1][1], hs[2 * jj + 1][2], hs[2 * jj + 1][3]);
            BfB cb[4];
#pragma unroll
            for (int lt = 0; lt < 4; ++lt) {  // B operand C^T: C[8lt + g][nbk + 2t, +1] and [nbk + 8 + 2t, +1]
              const T* crow = sC + (8 * lt + g) * NS + nbk + 2 * t;
              const float2 c0 = E::two(crow), c1 = E::two(crow + 8);
              cb[lt] = split_bf_b<EX>(c0.x, c0.y, c1.x, c1.y);
              mma3_bf<false, EX>(ya[lt], ha, cb[lt]);
            }
            if ((2 * jj) / KQ == q - 2 * nh) {  // this k16 block lies in the warp's quarter: C B^T too
              if constexpr (BFS >= 2) {
                // A operand C (rows l = 16mi + g, + 8; k = n): registers 0..3 are the B operands' of
                // l-tiles 2mi (k 2t.., k 8+2t..) and 2mi+1; B operand B^T: B[8sj + g][nbk + 2t, +1], [+ 8 ..]
#pragma unroll
                for (int i = 0; i < TPW; ++i) {
                  int mi, sj;
                  gp_tile(i, grp, mi, sj);
                  const BfA ca = c_rows_as_a<BfA>(mi, cb);
                  const T* brow = sB + (8 * sj + g) * NS + nbk + 2 * t;
                  const float2 b0 = E::two(brow), b1 = E::two(brow + 8);
                  mma3_bf<EX, EX>(ga[i], ca, split_bf_b<EX>(b0.x, b0.y, b1.x, b1.y));
                }
              } else {  // BFS 1: both 8-column halves in 3xTF32
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                  const int nb8 = nbk + 8 * hh;  // k block as below: n = nb8 + 2t (slot t), + 1 (slot t + 4)
                  SplitB cf[4];  // (read again from smem: holding all of them across C H costs spills)
#pragma unroll
                  for (int lt = 0; lt < 4; ++lt) {
                    const float2 v = E::two(&sC[(8 * lt + g) * NS + nb8 + 2 * t]);
                    cf[lt] = split_b<EX, true>(v.x, v.y);
                  }
#pragma unroll
                  for (int i = 0; i < TPW; ++i) {
                    int mi, sj;
                    gp_tile(i, grp, mi, sj);
                    const SplitA ca = c_rows_as_a<SplitA>(mi, cf);
                    const float2 v = E::two(&sB[(8 * sj + g) * NS + nb8 + 2 * t]);
                    mma3<EX, EX>(ga[i], ca, split_b<EX, true>(v.x, v.y));
                  }
                }
              }
            }
          }
        } else {
#pragma unroll
        for (int j = 0; j < KH; ++j) {
          const int nbk = nb0 + 8 * j;  // k block: n = nbk + 2t (slot t), nbk + 2t + 1 (slot t + 4)
          SplitB cf[4];
#pragma unroll
          for (int lt = 0; lt < 4; ++lt) {
            const float2 v = E::two(&sC[(8 * lt + g) * NS + nbk + 2 * t]);
            cf[lt] = split_b<EX>(v.x, v.y);
          }
          // A operand H^T straight from the state accumulators (permuted k, see the header)
          const SplitA ha = split_a<false>(hs[j][0], hs[j][2], hs[j][1], hs[j][3]);
#pragma unroll
          for (int lt = 0; lt < 4; ++lt) mma3<false, EX>(ya[lt], ha, cf[lt]);
          if (j / KQ == q - 2 * nh) {  // this k block lies in the warp's quarter: C B^T too
#pragma unroll
            for (int i = 0; i < TPW; ++i) {
              int mi, sj;
              gp_tile(i, grp, mi, sj);
              const SplitA ca = c_rows_as_a<SplitA>(mi, cf);
              const float2 v = E::two(&sB[(8 * sj + g) * NS + nbk + 2 * t]);
              mma3<EX, EX>(ga[i], ca, split_b<EX>(v.x, v.y));
            }
          }
        }
        }  // BFS
        float* gq = sGp + q * Q * GS;
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          int mi, sj;
          gp_tile(i, grp, mi, sj);
          const int l = 16 * mi + g, s = 8 * sj + 2 * t;
          *reinterpret_cast<float2*>(&gq[l * GS + s]) = make_float2(ga[i][0], ga[i][1]);
          *reinterpret_cast<float2*>(&gq[(l + 8) * GS + s]) = make_float2(ga[i][2], ga[i][3]);
        }
      }
      __syncthreads();  // ---- barrier 2: Gp, cum/exp tables written; C no longer read
      if (WANT_Y && do_y) {
        if (ch + 1 < nchunks) load_c(t0 + Q, t_end);
        // G = (sum of the quarter partials) * exp(cum_l - cum_s), 0 where s > l, split for the mma:
        // once per block, a thread 4 elements (l, 4c .. 4c + 3) at a time, in place (hi over quarter 0,
        // lo over quarter 1 at the same (l, s); nothing else reads those elements). The warps of the
        // same head-dim rows used to form each element of G again (4x the work).
#pragma unroll
        for (int i = tid; i < Q * Q / 4; i += NT) {
          const int l = i >> 3, c4 = 4 * (i & 7);
          float4 v = *reinterpret_cast<const float4*>(&sGp[l * GS + c4]);
#pragma unroll
          for (int qq = 1; qq < 4; ++qq) {
            const float4 o = *reinterpret_cast<const float4*>(&sGp[qq * Q * GS + l * GS + c4]);
            v.x += o.x; v.y += o.y; v.z += o.z; v.w += o.w;
          }
          const double cl = sCum[l];
          float gv[4] = {v.x, v.y, v.z, v.w};
          uint32_t hi[4], lo[4];
          // the four decays first, each unconditionally (exp of a positive difference where s > l is
          // discarded by the select below), so their four load-subtract-exp chains overlap: with the
          // mask as a branch around each exp they ran one after another, the longest stretch of the
          // chunk between two barriers (Nsight Compute's stall samples)
          float ex[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) ex[e] = (float)(cl - sCum[c4 + e]);
#pragma unroll
          for (int e = 0; e < 4; ++e) ex[e] = expf(ex[e]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            gv[e] = (c4 + e <= l) ? gv[e] * ex[e] : 0.f;
            if constexpr (BFS > 0) split_rn(gv[e], hi[e], lo[e]);  // paths 5/6, as their other TF32 splits
            else split_tf32(gv[e], hi[e], lo[e]);
          }
          *reinterpret_cast<uint4*>(&sGp[l * GS + c4]) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
          *reinterpret_cast<uint4*>(&sGp[Q * GS + l * GS + c4]) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
        __syncthreads();  // ---- barrier 2b: G written
      }
      cp_async_commit();

      // ---- phase C ------------------------------------------------------------------------
      // X^T fragments (A operand, k = s): rows pr, pr+8; k-slots s = 8ks + t, 8ks + t + 4
      float xa[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int s = 8 * ks + t;
        xa[ks][0] = E::one(&sX[s * XS + pr]);
        xa[ks][1] = E::one(&sX[s * XS + pr + 8]);
        xa[ks][2] = E::one(&sX[(s + 4) * XS + pr]);
        xa[ks][3] = E::one(&sX[(s + 4) * XS + pr + 8]);
      }
      if (WANT_Y && do_y) {
        // Y^T *= e_l (the C H term's decay from the chunk start), then += X^T G^T
#pragma unroll
        for (int lt = 0; lt < 4; ++lt) {
          const float e0 = sE[8 * lt + 2 * t], e1 = sE[8 * lt + 2 * t + 1];
          ya[lt][0] *= e0; ya[lt][1] *= e1; ya[lt][2] *= e0; ya[lt][3] *= e1;
        }
        // causal (lt, ks) pairs ks <= lt, split between the two n-halves: 5 each
        //   nh 0: ks 0 (lt 0..3), ks 3 (lt 3);  nh 1: ks 1 (lt 1..3), ks 2 (lt 2, 3)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if ((ks == 0 || ks == 3) != (nh == 0)) continue;
          const SplitA xs = split_a<EX, (BFS > 0)>(xa[ks][0], xa[ks][1], xa[ks][2], xa[ks][3]);  // (RN: paths 5/6)
          const int s0 = 8 * ks + t, s1 = s0 + 4;
          const uint32_t* gh = reinterpret_cast<const uint32_t*>(sGp);  // G split at barrier 2b
          const uint32_t* gl = gh + Q * GS;
#pragma unroll
          for (int lt = ks; lt < 4; ++lt) {
            const int l = 8 * lt + g;
            SplitB gb;  // B operand G^T: k = s, column l
            gb.hi[0] = gh[l * GS + s0]; gb.hi[1] = gh[l * GS + s1];
            gb.lo[0] = gl[l * GS + s0]; gb.lo[1] = gl[l * GS + s1];
            mma3<EX, false>(ya[lt], xs, gb);
          }
        }
        if (nh == 1) {
          float4* dst = reinterpret_cast<float4*>(sYp) + mt * 4 * 32;
#pragma unroll
          for (int lt = 0; lt < 4; ++lt) dst[lt * 32 + lane] = make_float4(ya[lt][0], ya[lt][1], ya[lt][2], ya[lt][3]);
        }
      }
      // state: H^T = dec * H^T + (w_s X)^T B
      {
        const float dec = sDec[0];
#pragma unroll
        for (int j = 0; j < KH; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) hs[j][r] *= dec;
        if constexpr (BFS) {
          // 3xBF16, k16 block kk = steps 16kk..16kk+15 with k permuted so that the X values already
          // loaded for G X serve: slots 2t, 2t+1, 2t+8, 2t+9 <-> s = 16kk + t, + 4, + 8, + 12
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const int s0 = 16 * kk + t, s1 = s0 + 4, s2 = s0 + 8, s3 = s0 + 12;
            const float w0 = sW[s0], w1 = sW[s1], w2 = sW[s2], w3 = sW[s3];
            const float (&xl)[4] = xa[2 * kk];
            const float (&xh)[4] = xa[2 * kk + 1];
            const BfA xw = split_bf_a<false>(xl[0] * w0, xl[2] * w1, xl[1] * w0, xl[3] * w1,
                                             xh[0] * w2, xh[2] * w3, xh[1] * w2, xh[3] * w3);
#pragma unroll
            for (int j = 0; j < KH; ++j) {
              const int n = nb0 + 8 * j + g;
              mma3_bf<false, EX>(hs[j], xw, split_bf_b<EX>(E::one(&sB[s0 * NS + n]), E::one(&sB[s1 * NS + n]),
                                                           E::one(&sB[s2 * NS + n]), E::one(&sB[s3 * NS + n])));
            }
          }
        } else {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const int s0 = 8 * ks + t, s1 = s0 + 4;
          const float w0 = sW[s0], w1 = sW[s1];
          const SplitA xw = split_a<false>(xa[ks][0] * w0, xa[ks][1] * w0, xa[ks][2] * w1, xa[ks][3] * w1);
#pragma unroll
          for (int j = 0; j < KH; ++j) {
            const int n = nb0 + 8 * j + g;
            mma3<false, EX>(hs[j], xw, split_b<EX>(E::one(&sB[s0 * NS + n]), E::one(&sB[s1 * NS + n])));
          }
        }
        }  // BFS
      }
    }
    __syncthreads();
    if (WANT_Y && do_y) {
      if (nh == 0) flush_y(t_begin + (nchunks - 1) * Q, t_end);
    }
  };

  // ---- the state entering the segment: S0 for the first, else the predecessor's H_out ------
  auto load_s0 = [&](float (&hv)[KH][4]) {
#pragma unroll
    for (int j = 0; j < KH; ++j) {
      const int n = nb0 + 8 * j + 2 * t;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int p = pr + 8 * (r >> 1), nn = n + (r & 1);
        hv[j][r] = S0 ? S0[(((long)b * H + h) * D + p0 + p) * N + nn] : 0.f;
      }
    }
  };


  // H_out = exp(g) * H_in + S_loc (S_loc in hs): published for the successor; in state mode the last
  // segment's H_out is the final state, left in hv for the output.
  auto chain_out = [&](float (&hv)[KH][4]) {
    __syncthreads();  // sSeg visible
    chain_publish<KH, NT, N * P>(hs, hv, exp_from_double(sSeg[0]), last, ws, sync, slot, tid);
  };

  if (tb >= te) return;  // (cannot happen with the host's segment count; kept as a guard)
  const bool local = chained && (!WANT_Y || !last);  // the last segment's own part matters only for the state
  // 1. local pass (chained): this segment's contribution from a zero state, and its sum of A
  if (local) {
#pragma unroll
    for (int j = 0; j < KH; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) hs[j][r] = 0.f;
    // Steps whose weight in the local state, exp(sum of A from the step to the segment end),
    // is below exp(-110) (< 1e-47: zero in float32, whose smallest denormal is 1.4e-45) contribute
    // exactly nothing in float32 arithmetic: the walk starts after them. Warp 0 finds that point
    // c0 (a chunk boundary) and the segment's total of A (float64) from A alone.
    if (warp == 0) {
      double tot;
      const int c0 = local_walk_start(Abh, H, tb, te, lane, tot);
      if (lane == 0) { sSeg[0] = tot; s_c0 = c0; }
    }
    __syncthreads();
    const int c0 = s_c0;
    double segtot = 0.0;
    if (c0 < te) walk(c0, te, false, segtot);
  }
  // 2. the state entering the segment: S0 for the first, else the predecessor's H_out (acquire);
  //    then H_out = exp(g) H_in + S_loc is published (release) for the successor
  if (chained && seg > 0) {
    float hin[KH][4];
    if (tid == 0) {
      const int* f = sync + slot;  // flag of slot - 1
      while (ld_acquire(f) == 0) __nanosleep(100);
      __threadfence();
    }
    __syncthreads();
    const float4* src = reinterpret_cast<const float4*>(ws + (long)(slot - 1) * (N * P));
#pragma unroll
    for (int j = 0; j < KH; ++j) {
      const float4 v = __ldcg(src + j * NT + tid);
      hin[j][0] = v.x; hin[j][1] = v.y; hin[j][2] = v.z; hin[j][3] = v.w;
    }
    if (local) chain_out(hin);
#pragma unroll
    for (int j = 0; j < KH; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) hs[j][r] = hin[j][r];
  } else {
    float hin[KH][4];
    load_s0(hin);
    if (local) chain_out(hin);
#pragma unroll
    for (int j = 0; j < KH; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) hs[j][r] = hin[j][r];
  }
  // 3. output pass from H_in (or, unchained, the plain walk); state mode: the last segment's
  //    H_out was left in sm_out by chain_out
  if (WANT_Y || !chained) {
    double segtot = 0.0;
    walk(tb, te, WANT_Y, segtot);
  }
  if (S_out && last) {
#pragma unroll
    for (int j = 0; j < KH; ++j) {
      const int n = nb0 + 8 * j + 2 * t;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int p = pr + 8 * r;
        *reinterpret_cast<float2*>(&S_out[(((long)b * H + h) * D + p0 + p) * N + n]) =
            make_float2(hs[j][2 * r], hs[j][2 * r + 1]);
      }
    }
  }
}


}  // namespace tc

namespace {

constexpr int Q = 32;         // chunk length inside the kernel
constexpr int THREADS = 256;  // 8 warps: (4 x 2) warps of (4 x 8) lanes -> a 16 x 16 thread grid

template <int N, int P>
struct Layout {
  static constexpr int NS = N + 4;   // padded row strides (floats): conflict-free 16-byte reads
  static constexpr int PS = P + 4;
  static constexpr int GS = Q + 4;
  static constexpr int CP = P / 16;                 // head-dim columns per thread (Y and state)
  static constexpr int RN = N / 16;                 // state rows per thread
  static constexpr int RV = RN < 4 ? RN : 4;        // ... read as vectors of RV
  static constexpr int RG = RN / RV;                // ... in RG groups, 16 * RV rows apart
  static constexpr int oC = 0;
  static constexpr int oB = oC + Q * NS;
  static constexpr int oX = oB + Q * NS;
  static constexpr int oXw = oX + Q * PS;
  static constexpr int oG = oXw + Q * PS;
  static constexpr int oH = oG + Q * GS;
  static constexpr int FLOATS = oH + N * PS;
  static constexpr size_t BYTES = FLOATS * sizeof(float);
  static constexpr int X4 = Q * P / 4, B4 = Q * N / 4;        // float4 per chunk
  static constexpr int XL = (X4 + THREADS - 1) / THREADS;     // float4 per thread
  static constexpr int BL = (B4 + THREADS - 1) / THREADS;
  static_assert(P % 32 == 0 && N % 16 == 0 && RN % RV == 0, "unsupported tile");
};

template <int V>
__device__ __forceinline__ void lds(float (&d)[V], const float* p) {
  if constexpr (V == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
  } else if constexpr (V == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    d[0] = v.x; d[1] = v.y;
  } else {
    d[0] = *p;
  }
}

template <int V>
__device__ __forceinline__ void stv(float* p, const float (&s)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(s[0], s[1], s[2], s[3]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(s[0], s[1]);
  } else {
    *p = s[0];
  }
}

__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// exp(x) for a float64 x, to float: exp(hi) * exp(lo) with lo tiny, so the argument keeps its
// float64 accuracy while the work stays in float32.
__device__ __forceinline__ float exp_from_double(double x) {
  const float hi = (float)x;
  const float lo = (float)(x - (double)hi);
  return expf(hi) * (1.f + lo);
}

__device__ __forceinline__ float comp(const float4 v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// X, Y: (b, L, H, D); A: (b, L, H); B, C: (b, L, H, N); S0, S_out: (b, H, D, N) or null.
template <int N, int P, bool WANT_Y>
__global__ void __launch_bounds__(THREADS, 2)
ssd_fused_kernel(const float* __restrict__ X, const float* __restrict__ A, const float* __restrict__ Bm,
                 const float* __restrict__ Cm, const float* __restrict__ S0, float* __restrict__ Y,
                 float* __restrict__ S_out, int L, int H, int D) {
  using Lo = Layout<N, P>;
  constexpr int NS = Lo::NS, PS = Lo::PS, GS = Lo::GS, CP = Lo::CP, RV = Lo::RV, RG = Lo::RG;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sm = reinterpret_cast<float*>(smem_raw);
  float* sC = sm + Lo::oC;
  float* sB = sm + Lo::oB;
  float* sX = sm + Lo::oX;
  float* sXw = sm + Lo::oXw;
  float* sG = sm + Lo::oG;
  float* sHt = sm + Lo::oH;  // state entering the chunk, [n][p]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ty = (warp >> 1) * 4 + (lane >> 3);  // 0..15
  const int tx = (warp & 1) * 8 + (lane & 7);    // 0..15
  const int p0 = blockIdx.x * P, h = blockIdx.y, b = blockIdx.z;
  const long strideX = (long)H * D, strideB = (long)H * N;
  const long bh = (long)b * L * H + h;
  const float* Xbh = X + bh * D + p0;
  const float* Bbh = Bm + bh * N;
  const float* Cbh = Cm + bh * N;
  const float* Abh = A + bh;

  // Running state, thread's tile: n = g*16*RV + ty*RV + i, p = tx*CP + c.
  float hs[RG][RV][CP];
#pragma unroll
  for (int g = 0; g < RG; ++g)
#pragma unroll
    for (int i = 0; i < RV; ++i)
#pragma unroll
      for (int c = 0; c < CP; ++c) {
        const int n = g * 16 * RV + ty * RV + i, p = tx * CP + c;
        hs[g][i][c] = S0 ? S0[(((long)b * H + h) * D + p0 + p) * N + n] : 0.f;
      }
  if constexpr (WANT_Y) {
#pragma unroll
    for (int g = 0; g < RG; ++g)
#pragma unroll
      for (int i = 0; i < RV; ++i) stv<CP>(&sHt[(g * 16 * RV + ty * RV + i) * PS + tx * CP], hs[g][i]);
  }

  // Next chunk's inputs, held in registers while the current chunk computes.
  float4 px[Lo::XL], pb[Lo::BL], pc[Lo::BL];
  float pa = 0.f;
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  auto load_chunk = [&](int t0) {
#pragma unroll
    for (int k = 0; k < Lo::XL; ++k) {
      const int idx = tid + k * THREADS;
      const int s = idx / (P / 4), q = idx % (P / 4);
      px[k] = (idx < Lo::X4 && t0 + s < L)
                  ? __ldg(reinterpret_cast<const float4*>(Xbh + (t0 + s) * strideX) + q) : zero4;
    }
#pragma unroll
    for (int k = 0; k < Lo::BL; ++k) {
      const int idx = tid + k * THREADS;
      const int s = idx / (N / 4), q = idx % (N / 4);
      const bool ok = idx < Lo::B4 && t0 + s < L;
      pb[k] = ok ? __ldg(reinterpret_cast<const float4*>(Bbh + (t0 + s) * strideB) + q) : zero4;
      if constexpr (WANT_Y)
        pc[k] = ok ? __ldg(reinterpret_cast<const float4*>(Cbh + (t0 + s) * strideB) + q) : zero4;
    }
    pa = (t0 + lane < L) ? __ldg(Abh + (long)(t0 + lane) * H) : 0.f;  // every warp: its own scan
  };

  load_chunk(0);
  const int nchunks = (L + Q - 1) / Q;
  for (int ch = 0; ch < nchunks; ++ch) {
    const int t0 = ch * Q;
    // ---- 1. inputs to shared memory; prefix sums of A (each warp, redundantly: no serial phase)
#pragma unroll
    for (int k = 0; k < Lo::XL; ++k) {
      const int idx = tid + k * THREADS;
      if (idx < Lo::X4) *reinterpret_cast<float4*>(&sX[(idx / (P / 4)) * PS + (idx % (P / 4)) * 4]) = px[k];
    }
#pragma unroll
    for (int k = 0; k < Lo::BL; ++k) {
      const int idx = tid + k * THREADS;
      if (idx < Lo::B4) {
        const int o = (idx / (N / 4)) * NS + (idx % (N / 4)) * 4;
        *reinterpret_cast<float4*>(&sB[o]) = pb[k];
        if constexpr (WANT_Y) *reinterpret_cast<float4*>(&sC[o]) = pc[k];
      }
    }
    // lane j holds cum_j (float64), exp(cum_j) and exp(total - cum_j); others get them by shuffle
    double cum = (double)pa;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double u = __shfl_up_sync(0xffffffffu, cum, off);
      if (lane >= off) cum += u;
    }
    const double total = __shfl_sync(0xffffffffu, cum, 31);
    const float e_lane = exp_from_double(cum);
    const float w_lane = exp_from_double(total - cum);
    const float dec = exp_from_double(total);
    __syncthreads();

    // ---- 2. X scaled by its decay to the chunk end; G = (C B^T) * decay, causal ----------
#pragma unroll
    for (int k = 0; k < Lo::XL; ++k) {
      const int idx = tid + k * THREADS;
      const int s = (idx / (P / 4)) & (Q - 1);
      const float w = __shfl_sync(0xffffffffu, w_lane, s);
      if (idx < Lo::X4) {
        const float4 v = px[k];
        *reinterpret_cast<float4*>(&sXw[s * PS + (idx % (P / 4)) * 4]) =
            make_float4(v.x * w, v.y * w, v.z * w, v.w * w);
      }
    }
    if (ch + 1 < nchunks) load_chunk(t0 + Q);  // in flight during the rest of this chunk

    if constexpr (WANT_Y) {
      // rows l = ty + 16r, columns s = tx + 16c; the block (r=0, c=1) lies above the diagonal
      float g00 = 0.f, g10 = 0.f, g11 = 0.f;
#pragma unroll 8
      for (int n = 0; n < N; n += 4) {
        const float4 c0 = *reinterpret_cast<const float4*>(&sC[ty * NS + n]);
        const float4 c1 = *reinterpret_cast<const float4*>(&sC[(ty + 16) * NS + n]);
        const float4 b0 = *reinterpret_cast<const float4*>(&sB[tx * NS + n]);
        const float4 b1 = *reinterpret_cast<const float4*>(&sB[(tx + 16) * NS + n]);
        g00 = dot4(c0, b0, g00);
        g10 = dot4(c1, b0, g10);
        g11 = dot4(c1, b1, g11);
      }
      const int l0 = ty, l1 = ty + 16, s0 = tx, s1 = tx + 16;
      const double cl0 = __shfl_sync(0xffffffffu, cum, l0), cl1 = __shfl_sync(0xffffffffu, cum, l1);
      const double cs0 = __shfl_sync(0xffffffffu, cum, s0), cs1 = __shfl_sync(0xffffffffu, cum, s1);
      sG[l0 * GS + s0] = (s0 <= l0) ? g00 * expf((float)(cl0 - cs0)) : 0.f;
      sG[l0 * GS + s1] = 0.f;
      sG[l1 * GS + s0] = g10 * expf((float)(cl1 - cs0));
      sG[l1 * GS + s1] = (s1 <= l1) ? g11 * expf((float)(cl1 - cs1)) : 0.f;
    }
    __syncthreads();

    // ---- 3. Y = exp(cum_l) * C H^T + G X ----------------------------------------------
    if constexpr (WANT_Y) {
      float acc[2][CP];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < CP; ++c) acc[r][c] = 0.f;
#pragma unroll 4
      for (int n = 0; n < N; n += 4) {
        const float4 c0 = *reinterpret_cast<const float4*>(&sC[ty * NS + n]);
        const float4 c1 = *reinterpret_cast<const float4*>(&sC[(ty + 16) * NS + n]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          float hv[CP];
          lds<CP>(hv, &sHt[(n + kk) * PS + tx * CP]);
          const float a0 = comp(c0, kk), a1 = comp(c1, kk);
#pragma unroll
          for (int c = 0; c < CP; ++c) {
            acc[0][c] = fmaf(a0, hv[c], acc[0][c]);
            acc[1][c] = fmaf(a1, hv[c], acc[1][c]);
          }
        }
      }
      const float e0 = __shfl_sync(0xffffffffu, e_lane, ty), e1 = __shfl_sync(0xffffffffu, e_lane, ty + 16);
#pragma unroll
      for (int c = 0; c < CP; ++c) {
        acc[0][c] *= e0;
        acc[1][c] *= e1;
      }
#pragma unroll
      for (int s = 0; s < Q; s += 4) {
        const float4 gv1 = *reinterpret_cast<const float4*>(&sG[(ty + 16) * GS + s]);
        float4 gv0 = zero4;
        if (s < 16) gv0 = *reinterpret_cast<const float4*>(&sG[ty * GS + s]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          float xv[CP];
          lds<CP>(xv, &sX[(s + kk) * PS + tx * CP]);
          const float a1 = comp(gv1, kk);
#pragma unroll
          for (int c = 0; c < CP; ++c) acc[1][c] = fmaf(a1, xv[c], acc[1][c]);
          if (s < 16) {
            const float a0 = comp(gv0, kk);
#pragma unroll
            for (int c = 0; c < CP; ++c) acc[0][c] = fmaf(a0, xv[c], acc[0][c]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = t0 + ty + 16 * r;
        if (t < L) stv<CP>(Y + bh * D + (long)t * strideX + p0 + tx * CP, acc[r]);
      }
    }

    // ---- 4. H = exp(total) * H + sum_s B_s (x) (w_s X_s) ---------------------------------
    {
#pragma unroll
      for (int g = 0; g < RG; ++g)
#pragma unroll
        for (int i = 0; i < RV; ++i)
#pragma unroll
          for (int c = 0; c < CP; ++c) hs[g][i][c] *= dec;
#pragma unroll 4
      for (int s = 0; s < Q; ++s) {
        float xv[CP];
        lds<CP>(xv, &sXw[s * PS + tx * CP]);
#pragma unroll
        for (int g = 0; g < RG; ++g) {
          float bv[RV];
          lds<RV>(bv, &sB[s * NS + g * 16 * RV + ty * RV]);
#pragma unroll
          for (int i = 0; i < RV; ++i)
#pragma unroll
            for (int c = 0; c < CP; ++c) hs[g][i][c] = fmaf(bv[i], xv[c], hs[g][i][c]);
        }
      }
    }
    __syncthreads();  // every read of this chunk's shared inputs and of the old state is done
    if constexpr (WANT_Y) {
#pragma unroll
      for (int g = 0; g < RG; ++g)
#pragma unroll
        for (int i = 0; i < RV; ++i) stv<CP>(&sHt[(g * 16 * RV + ty * RV + i) * PS + tx * CP], hs[g][i]);
    }
  }

  if (S_out) {
#pragma unroll
    for (int g = 0; g < RG; ++g)
#pragma unroll
      for (int c = 0; c < CP; ++c) {
        float v[RV];
#pragma unroll
        for (int i = 0; i < RV; ++i) v[i] = hs[g][i][c];
        const int p = tx * CP + c;
        stv<RV>(S_out + (((long)b * H + h) * D + p0 + p) * N + g * 16 * RV + ty * RV, v);
      }
  }
}

template <int N, int P, bool WANT_Y>
void launch(const torch::Tensor& X, const torch::Tensor& A, const torch::Tensor& B, const torch::Tensor& C,
            const float* s0, float* y, float* s_out) {
  using Lo = Layout<N, P>;
  const int b = X.size(0), L = X.size(1), H = X.size(2), D = X.size(3);
  auto kernel = ssd_fused_kernel<N, P, WANT_Y>;
  {  // once per device (a driver call on every launch shows in a launch-bound call's latency)
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if (!(done.load(std::memory_order_relaxed) & bit)) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Lo::BYTES));
      done.fetch_or(bit);
    }
  }
  const dim3 grid(D / P, H, b);
  kernel<<<grid, THREADS, Lo::BYTES, at::cuda::getCurrentCUDAStream()>>>(
      X.data_ptr<float>(), A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), s0, y, s_out, L, H, D);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int N, bool WANT_Y>
void dispatch_p(int p_tile, const torch::Tensor& X, const torch::Tensor& A, const torch::Tensor& B,
                const torch::Tensor& C, const float* s0, float* y, float* s_out) {
  if (p_tile == 64) launch<N, 64, WANT_Y>(X, A, B, C, s0, y, s_out);
  else launch<N, 32, WANT_Y>(X, A, B, C, s0, y, s_out);
}

template <bool WANT_Y>
void dispatch(int N, int p_tile, const torch::Tensor& X, const torch::Tensor& A, const torch::Tensor& B,
              const torch::Tensor& C, const float* s0, float* y, float* s_out) {
  switch (N) {
    case 16: dispatch_p<16, WANT_Y>(p_tile, X, A, B, C, s0, y, s_out); break;
    case 32: dispatch_p<32, WANT_Y>(p_tile, X, A, B, C, s0, y, s_out); break;
    case 64: dispatch_p<64, WANT_Y>(p_tile, X, A, B, C, s0, y, s_out); break;
    case 128: dispatch_p<128, WANT_Y>(p_tile, X, A, B, C, s0, y, s_out); break;
    default: TORCH_CHECK(false, "ssd_fused: d_state must be 16, 32, 64 or 128");
  }
}


template <int N, int P, bool WANT_Y, int MINB, typename T, int BFS = 0>
void launch_tc(const torch::Tensor& X, const torch::Tensor& A, const torch::Tensor& B, const torch::Tensor& C,
               const float* s0, T* y, float* s_out, int nseg, int seg_len) {
  using Lo = tc::TcLayout<N, P, T>;
  const int b = X.size(0), L = X.size(1), H = X.size(2), D = X.size(3);
  auto kernel = tc::ssd_tc_kernel<N, P, WANT_Y, MINB, T, BFS>;
  {  // once per device (a driver call on every launch shows in a launch-bound call's latency)
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if (!(done.load(std::memory_order_relaxed) & bit)) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Lo::BYTES));
      done.fetch_or(bit);
    }
  }
  const long per_seg = (long)b * H * (D / P);
  TORCH_CHECK(per_seg * nseg < (1L << 31), "ssd_fused: too many thread blocks");
  float* ws = nullptr;
  int* sync = nullptr;
  torch::Tensor ws_t, sync_t;
  if (nseg > 1) {  // published segment states and the ticket/flags; zeroed flags on the same stream
    ws_t = torch::empty({per_seg * nseg * N * P}, X.options().dtype(torch::kFloat));
    sync_t = torch::zeros({1 + per_seg * nseg}, X.options().dtype(torch::kInt));
    ws = ws_t.data_ptr<float>();
    sync = sync_t.data_ptr<int>();
  }
  const dim3 grid((unsigned)(per_seg * nseg));
  kernel<<<grid, Lo::THREADS, Lo::BYTES, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(X.data_ptr()), A.data_ptr<float>(), reinterpret_cast<const T*>(B.data_ptr()),
      reinterpret_cast<const T*>(C.data_ptr()), s0, y, s_out, b, L, H, D, seg_len, nseg, ws, sync);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// variant: 2 = every product in 3xTF32, 5 = as 2 with the state products in 3xBF16, 6 = as 5 with
// C B^T in 3xBF16 too; each at 2 blocks an SM (128 registers)
template <int N, bool WANT_Y, typename T>
void dispatch_tc_p(int p_tile, int variant, const torch::Tensor& X, const torch::Tensor& A, const torch::Tensor& B,
                   const torch::Tensor& C, const float* s0, T* y, float* s_out, int nseg, int seg_len) {
  if (variant == 5) {
    if (p_tile == 64) return launch_tc<N, 64, WANT_Y, 2, T, 1>(X, A, B, C, s0, y, s_out, nseg, seg_len);
    return launch_tc<N, 32, WANT_Y, 2, T, 1>(X, A, B, C, s0, y, s_out, nseg, seg_len);
  }
  if (variant == 6) {
    if (p_tile == 64) return launch_tc<N, 64, WANT_Y, 2, T, 2>(X, A, B, C, s0, y, s_out, nseg, seg_len);
    return launch_tc<N, 32, WANT_Y, 2, T, 2>(X, A, B, C, s0, y, s_out, nseg, seg_len);
  }
  if (p_tile == 64) launch_tc<N, 64, WANT_Y, 2, T>(X, A, B, C, s0, y, s_out, nseg, seg_len);
  else launch_tc<N, 32, WANT_Y, 2, T>(X, A, B, C, s0, y, s_out, nseg, seg_len);
}

template <bool WANT_Y, typename T>
void dispatch_tc(int N, int p_tile, int variant, const torch::Tensor& X, const torch::Tensor& A,
                 const torch::Tensor& B, const torch::Tensor& C, const float* s0, T* y, float* s_out, int nseg,
                 int seg_len) {
  switch (N) {
    case 64: dispatch_tc_p<64, WANT_Y, T>(p_tile, variant, X, A, B, C, s0, y, s_out, nseg, seg_len); break;
    case 128: dispatch_tc_p<128, WANT_Y, T>(p_tile, variant, X, A, B, C, s0, y, s_out, nseg, seg_len); break;
    default: TORCH_CHECK(false, "ssd_fused: the tensor-core path needs d_state 64 or 128");
  }
}

}  // namespace

// The launcher behind ssd_fused_cfg (in cpp_source, compiled by the host compiler, where every
// argument is checked first). Here only checks with literal messages: see the note there.
torch::Tensor ssd_run(torch::Tensor X, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                      c10::optional<torch::Tensor> initial_state, bool return_state, int64_t p_tile,
                      int64_t path, int64_t nseg) {
  const int64_t b = X.size(0), L = X.size(1), H = X.size(2), D = X.size(3), N = B.size(3);
  c10::cuda::CUDAGuard guard(X.device());
  const bool bf16 = X.scalar_type() == torch::kBFloat16;
  auto Xc = X.contiguous(), Bc = B.contiguous(), Cc = C.contiguous();
  // (conversions only where needed: each ATen call costs host time in a launch-bound call)
  auto Ac = A.scalar_type() == torch::kFloat ? A.contiguous() : A.to(torch::kFloat).contiguous();
  torch::Tensor s0t;
  const float* s0 = nullptr;
  if (initial_state.has_value() && initial_state->defined()) {
    s0t = initial_state->scalar_type() == torch::kFloat ? initial_state->contiguous()
                                                        : initial_state->to(torch::kFloat).contiguous();
    s0 = s0t.data_ptr<float>();
  }
  const bool tc_ok = (N == 64 || N == 128);
  const bool auto_path = (path == 0);
  // auto: tensor cores where d_state allows. Y in fp32: path 5 (the state products in 3xBF16: ~1e-6
  // normwise, at most ~5e-6 where the state dominates, against path 2's ~2e-7; path 6's 3xBF16 C B^T
  // measured 3e-5 on spiky A, over the 1e-5 bound). The final state in fp32: path 2 (it is the state
  // products' own error). bf16: path 6 (the output's bf16 rounding, ~1e-3, dominates every path).
  if (auto_path) path = !tc_ok ? 1 : bf16 ? 6 : return_state ? 2 : 5;
  if (p_tile == 0) p_tile = (D % 64 == 0) ? 64 : 32;
  TORCH_CHECK(path == 1 || tc_ok, "ssd_fused: the tensor-core path needs d_state 64 or 128");
  if (L == 0) {
    if (return_state) return s0 ? s0t.view({b, H, D, N}).to(X.scalar_type()) : torch::zeros({b, H, D, N}, X.options());
    return torch::empty_like(Xc);
  }
  if (path == 1) {  // FP32 CUDA-core kernel (bf16 inputs are widened to float32 first)
    auto Xf = bf16 ? Xc.to(torch::kFloat) : Xc, Bf = bf16 ? Bc.to(torch::kFloat) : Bc, Cf = bf16 ? Cc.to(torch::kFloat) : Cc;
    if (return_state) {
      auto S = torch::empty({b, H, D, N}, Xf.options());
      dispatch<false>((int)N, (int)p_tile, Xf, Ac, Bf, Cf, s0, nullptr, S.data_ptr<float>());
      return bf16 ? S.to(X.scalar_type()) : S;
    }
    auto Yt = torch::empty_like(Xf);
    dispatch<true>((int)N, (int)p_tile, Xf, Ac, Bf, Cf, s0, Yt.data_ptr<float>(), nullptr);
    return bf16 ? Yt.to(X.scalar_type()) : Yt;
  }
  // 16-byte copies of rows: the data must be 16-byte aligned (X rows are D elements, B/C rows N)
  for (const auto* t : {&Xc, &Bc, &Cc})
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "ssd_fused: inputs must be 16-byte aligned");
  // Segments: enough (segment, batch, head, tile) blocks to fill the SMs once; 1 when (b, h, tile)
  // alone does. Segment length is a multiple of the kernel's 32-step chunk.
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const long per_seg = b * H * (D / p_tile);
  if (nseg == 0) {
    nseg = std::max<long>(1, (long)sms * 2 / per_seg);  // 2 blocks an SM
  }
  const long max_seg = (L + 31) / 32;
  nseg = std::min<long>(nseg, max_seg);
  const long seg_len = ((L + nseg - 1) / nseg + 31) / 32 * 32;
  nseg = (L + seg_len - 1) / seg_len;
  if (return_state) {
    auto S = torch::empty({b, H, D, N}, X.options().dtype(torch::kFloat));
    if (bf16) dispatch_tc<false, __nv_bfloat16>((int)N, (int)p_tile, (int)path, Xc, Ac, Bc, Cc, s0, nullptr, S.data_ptr<float>(), (int)nseg, (int)seg_len);
    else dispatch_tc<false, float>((int)N, (int)p_tile, (int)path, Xc, Ac, Bc, Cc, s0, nullptr, S.data_ptr<float>(), (int)nseg, (int)seg_len);
    return bf16 ? S.to(torch::kBFloat16) : S;
  }
  auto Yt = torch::empty_like(Xc);
  if (bf16) dispatch_tc<true, __nv_bfloat16>((int)N, (int)p_tile, (int)path, Xc, Ac, Bc, Cc, s0, reinterpret_cast<__nv_bfloat16*>(Yt.data_ptr()), nullptr, (int)nseg, (int)seg_len);
  else dispatch_tc<true, float>((int)N, (int)p_tile, (int)path, Xc, Ac, Bc, Cc, s0, Yt.data_ptr<float>(), nullptr, (int)nseg, (int)seg_len);
  return Yt;
}
"""

# Argument checks and the Python-facing functions, compiled by the host C++ compiler (main.cpp).
# Every check message is a literal or ONE std::string built with std::to_string and `+`: a
# TORCH_CHECK whose message has several parts (e.g. "got ", D, ")") formats them through a
# std::ostringstream inside this extension, and on the H100 device machine (torch 2.11, its
# image's compilers) that took the process down with SIGSEGV instead of raising, whether compiled
# by nvcc or by the host compiler; literal and single-std::string messages raise
# (tests/test_mamba2_gpu.py::test_bad_arguments_raise_and_the_process_survives).
cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <string>

torch::Tensor ssd_run(torch::Tensor X, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                      c10::optional<torch::Tensor> initial_state, bool return_state, int64_t p_tile,
                      int64_t path, int64_t nseg);

namespace {
// message parts without std::ostringstream (see the note above cpp_source)
std::string num(int64_t v) { return std::to_string(v); }
std::string shape(const torch::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + ")";
}
std::string kind(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + (t.is_cuda() ? " on CUDA" : " not on CUDA");
}
}  // namespace

// Returns Y (b, L, H, D) when return_state is false, else the final state (b, H, D, N), in X's dtype
// (float32 or bfloat16; X, B, C must share it; A may be either and is used in float32).
// path: 0 picks by shape and dtype (tensor cores for d_state 64/128, else FP32 on the CUDA cores), 1 forces
// the FP32 CUDA-core kernel, 2 the tensor-core kernel with every product in 3xTF32, 5 the same with the
// state products in 3xBF16, 6 with C B^T in 3xBF16 too.
// p_tile: head-dim columns per block, 32 or 64; 0 picks. nseg: segments along the sequence for the
// tensor-core kernel (0 picks: enough to fill the SMs; 1: one block walks the whole sequence).
torch::Tensor ssd_fused_cfg(torch::Tensor X, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                            c10::optional<torch::Tensor> initial_state, bool return_state, int64_t p_tile,
                            int64_t path, int64_t nseg) {
  for (const auto* t : {&X, &A, &B, &C})
    TORCH_CHECK(t->is_cuda() && (t->scalar_type() == torch::kFloat || t->scalar_type() == torch::kBFloat16),
                "ssd_fused: inputs must be CUDA float32 or bfloat16 tensors (got " + kind(*t) + ")");
  TORCH_CHECK(B.scalar_type() == X.scalar_type() && C.scalar_type() == X.scalar_type(),
              "ssd_fused: X, B and C must have the same dtype (got " + kind(X) + ", " + kind(B) + ", " + kind(C) + ")");
  TORCH_CHECK(X.dim() == 4 && A.dim() == 3 && B.dim() == 4 && C.dim() == 4,
              "ssd_fused: expected X (b,l,h,p), A (b,l,h), B and C (b,l,h,n); got X " + shape(X) + ", A " +
                  shape(A) + ", B " + shape(B) + ", C " + shape(C));
  TORCH_CHECK(X.device() == A.device() && X.device() == B.device() && X.device() == C.device(),
              "ssd_fused: inputs must be on one device");
  const int64_t b = X.size(0), L = X.size(1), H = X.size(2), D = X.size(3), N = B.size(3);
  TORCH_CHECK(A.size(0) == b && A.size(1) == L && A.size(2) == H,
              "ssd_fused: A must be (b, l, h) matching X " + shape(X) + " (got " + shape(A) + ")");
  TORCH_CHECK(B.sizes() == C.sizes() && B.size(0) == b && B.size(1) == L && B.size(2) == H,
              "ssd_fused: B and C must be (b, l, h, n) matching X " + shape(X) + " (got " + shape(B) + ", " +
                  shape(C) + ")");
  TORCH_CHECK(D > 0 && D % 32 == 0, "ssd_fused: d_head must be a positive multiple of 32 (got " + num(D) + ")");
  TORCH_CHECK(N == 16 || N == 32 || N == 64 || N == 128,
              "ssd_fused: d_state must be 16, 32, 64 or 128 (got " + num(N) + ")");
  TORCH_CHECK(b <= 65535 && H <= 65535, "ssd_fused: batch and heads must be at most 65535 (got " + num(b) + ", " + num(H) + ")");
  TORCH_CHECK(L < (int64_t(1) << 31) / 32 && b * L * H * std::max(D, N) < (int64_t(1) << 40), "ssd_fused: input too large");
  TORCH_CHECK(path == 0 || path == 1 || path == 2 || path == 5 || path == 6,
              "ssd_fused: path must be 0 (auto), 1 (FP32 cores), 2, 5 or 6 (tensor cores); got " + num(path));
  TORCH_CHECK(path <= 1 || N == 64 || N == 128,
              "ssd_fused: the tensor-core path needs d_state 64 or 128 (got " + num(N) + ")");
  TORCH_CHECK(p_tile == 0 || ((p_tile == 32 || p_tile == 64) && D % p_tile == 0),
              "ssd_fused: p_tile must be 0, or 32 or 64 dividing d_head (got " + num(p_tile) + ")");
  TORCH_CHECK(nseg >= 0, "ssd_fused: nseg must be >= 0 (got " + num(nseg) + ")");
  if (initial_state.has_value() && initial_state->defined()) {
    TORCH_CHECK(initial_state->device() == X.device(), "ssd_fused: initial_state must be on X's device");
    TORCH_CHECK(initial_state->numel() == b * H * D * N, "ssd_fused: initial_state must hold (b, 1, h, p, n) = " +
                                                             num(b * H * D * N) + " values (got " +
                                                             num(initial_state->numel()) + ")");
  }
  return ssd_run(X, A, B, C, initial_state, return_state, p_tile, path, nseg);
}

torch::Tensor ssd_fused_path(torch::Tensor X, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                             c10::optional<torch::Tensor> initial_state, bool return_state, int64_t p_tile,
                             int64_t path) {
  return ssd_fused_cfg(X, A, B, C, initial_state, return_state, p_tile, path, 0);
}

torch::Tensor ssd_fused(torch::Tensor X, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                        c10::optional<torch::Tensor> initial_state, bool return_state, int64_t p_tile) {
  return ssd_fused_cfg(X, A, B, C, initial_state, return_state, p_tile, 0, 0);
}
"""

ssd_ext = load_inline(
    name="kw_mamba2_ssd_seg",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["ssd_fused", "ssd_fused_path", "ssd_fused_cfg"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, batch_size, seq_length, n_heads, d_head, d_state, block_len=64, io_dtype="float32"):
        super().__init__()
        assert seq_length % block_len == 0, "seq_length must be a multiple of block_len"
        self.block_len = block_len
        # same parameters, drawn in the same order as the reference; io_dtype "bfloat16"
        # (problem_y_bf16.py): B and C rounded to bf16, A kept in float32, bf16 X in and Y out
        io = getattr(torch, io_dtype)
        self.A = nn.Parameter(torch.randn(batch_size, seq_length, n_heads))
        self.B = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))
        self.C = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))

    def forward(self, X, initial_states=None):
        return ssd_ext.ssd_fused(X, self.A, self.B, self.C, initial_states, True, 0)
