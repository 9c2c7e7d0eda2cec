// CPU emulation of the CUDA features the Mamba-2 SSD tensor-core kernels use, so that a kernel's
// source compiles with g++ and runs here (no GPU) with the same results a GPU gives, up to the
// order of floating-point sums inside one mma and the last bits of expf.
//
// Execution model (one OS thread):
//   * every CUDA thread of a block is a fiber with its own stack (a hand-rolled x86-64 context
//     switch; fibers yield only inside the emulated synchronising operations, so the run is
//     deterministic);
//   * __syncthreads: a barrier over the block's live fibers;
//   * warp-collective operations (__shfl*_sync, __ballot_sync, mma.sync): each lane deposits its
//     operands and yields until all 32 lanes of its warp have; the last to arrive computes every
//     lane's result. Lanes of one warp at different collectives is an error (reported);
//   * blocks run one after another, in launch order or reversed (`g_block_order`); a pass of the
//     scheduler in which no fiber makes progress (all waiting: a barrier some thread never reaches,
//     a flag nobody sets) is reported as a deadlock instead of hanging;
//   * shared memory starts as NaN bytes (0xFF) in every block; cp.async fills its destination with
//     NaN bytes when issued and copies at the issuing thread's cp.async.wait, so a read before the
//     wait (or a refill of a buffer another thread still reads) shows as NaN in the output.
// Tensor-core numerics (mma.sync m16n8k8 .tf32 and m16n8k16 .bf16, PTX ISA fragment layouts): each operand is read
// as its top 19 bits (sign, exponent, 10 mantissa bits: the low 13 bits are ignored, i.e.
// truncated), products are exact, the sum of the 8 products and the accumulator is rounded once
// to float32 (the hardware's internal accumulation order and width are not specified; this is
// the most accurate choice, within a few float32 ulps of it). cvt.rna.tf32.f32 rounds to nearest,
// ties away from zero, to 10 mantissa bits.
// Not modelled: memory ordering between blocks (blocks are sequential, so a missing fence or
// acquire is invisible), bank conflicts, timing; static __shared__ variables keep their value from
// the previous block (not poisoned).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

// ---- CUDA keywords ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static  // one block runs at a time: a static is the block's shared variable
#define __align__(n) alignas(n)

// ---- vector types ----------------------------------------------------------------------------------
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct uint3 { unsigned x, y, z; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace emu {

// ---- settings (set by the driver before a launch) -----------------------------------------------
// tf32 mode: 0 faithful 3xTF32 helpers; 1 split_tf32 gives lo = 0 (plain TF32: one rounded
// product); 2 split_tf32 gives hi = x unrounded, lo = 0 (only the tensor core's truncation).
inline int g_tf32_mode = 0;
inline int g_block_order = 0;  // 0: blocks in launch order; 1: reversed

[[noreturn]] inline void fail(const std::string& msg);

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// cvt.rna.tf32.f32: round to nearest, ties away from zero, to 10 mantissa bits (low 13 bits 0)
inline uint32_t cvt_rna_tf32(float x) {
  const uint32_t u = f2u(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x007fffffu) ? 0x7fffffffu : u;  // NaN, inf
  return (u + 0x1000u) & 0xffffe000u;  // sign-magnitude: adding half an ulp rounds ties away
}
// what the tensor core reads of a .tf32 operand register: its top 19 bits
inline float tf32_operand(uint32_t u) { return u2f(u & 0xffffe000u); }

// ---- fibers ------------------------------------------------------------------------------------------
extern "C" void emu_switch(void** save_sp, void* new_sp);
extern "C" void emu_fiber_entry();
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

struct Copy { void* dst; const void* src; size_t n = 16; };  // a pending cp.async of n bytes (src null: zero-fill)

struct Fiber {
  void* sp = nullptr;
  uint3 tid{};
  int lane = 0, warp = 0;
  bool done = false;
  uint64_t warp_seq = 0;  // warp collectives this lane has entered
  uint64_t bar_seq = 0;   // barriers this thread has entered
  std::vector<Copy> pending;
};

constexpr int kInBytes = 48, kOutBytes = 16;
struct Warp {  // two buffers: a lane can enter collective k+1 while others still read k
  int arrived[2] = {0, 0};
  int kind[2] = {0, 0};
  uint64_t seq[2] = {0, 0}, done[2] = {0, 0};  // done[b] = k + 1 once collective k completed
  unsigned char in[2][32][kInBytes];
  unsigned char out[2][32][kOutBytes];
};

struct Block {
  int nthreads = 0, live = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int bar_arrived = 0;
  uint64_t bar_gen = 0;    // barriers completed
  uint64_t progress = 0;   // bumped by every arrival, completion and exit
  void* sched_sp = nullptr;
  std::function<void()> body;
  std::string error;
  uint3 idx{}, dim{}, grid{};
  unsigned char* smem = nullptr;
};

inline Block g_block;
inline Fiber* g_cur = nullptr;

constexpr size_t kStack = 256 * 1024, kGuard = 4096;
inline unsigned char* g_stacks = nullptr;
inline int g_stack_count = 0;

inline unsigned char* stack_of(int i) {  // [guard page | stack] per fiber, reused across blocks
  if (i >= g_stack_count) fail("more threads than stacks");
  return g_stacks + i * (kStack + kGuard) + kGuard;
}
inline void ensure_stacks(int n) {
  if (n <= g_stack_count) return;
  if (g_stacks) munmap(g_stacks, g_stack_count * (kStack + kGuard));
  const size_t bytes = n * (kStack + kGuard);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cuda_emu: cannot map fiber stacks");
  g_stacks = static_cast<unsigned char*>(p);
  g_stack_count = n;
  for (int i = 0; i < n; ++i) mprotect(g_stacks + i * (kStack + kGuard), kGuard, PROT_NONE);
}

inline void yield() { emu_switch(&g_cur->sp, g_block.sched_sp); }

[[noreturn]] inline void fail(const std::string& msg) {
  if (g_block.error.empty()) g_block.error = msg;
  if (!g_cur) throw std::runtime_error(msg);
  for (;;) yield();  // the scheduler sees the error and abandons the block
}

inline void release_barrier_if_complete() {
  Block& b = g_block;
  if (b.bar_arrived > 0 && b.bar_arrived == b.live) {
    b.bar_arrived = 0;
    ++b.bar_gen;
    ++b.progress;
  }
}

extern "C" inline void emu_fiber_entry() {
  try {
    g_block.body();
  } catch (const std::exception& e) {
    if (g_block.error.empty()) g_block.error = std::string("exception in a thread: ") + e.what();
  }
  Fiber* f = g_cur;
  f->done = true;
  --g_block.live;
  ++g_block.progress;
  release_barrier_if_complete();  // (an exited thread no longer holds a barrier up)
  emu_switch(&f->sp, g_block.sched_sp);
  std::abort();  // never resumed
}

inline std::string where(const Fiber& f) {
  return "block " + std::to_string(g_block.idx.x) + " thread " + std::to_string(f.tid.x);
}

// Runs one block to completion; throws on deadlock or an error raised in a thread.
inline void run_block(int nthreads) {
  Block& b = g_block;
  if (nthreads % 32) throw std::runtime_error("cuda_emu: block size must be a multiple of 32");
  ensure_stacks(nthreads);
  b.nthreads = b.live = nthreads;
  b.fibers.assign(nthreads, Fiber{});
  b.warps.assign(nthreads / 32, Warp{});
  b.bar_arrived = 0;
  b.bar_gen = 0;
  b.error.clear();
  for (int i = 0; i < nthreads; ++i) {
    Fiber& f = b.fibers[i];
    f.tid = {unsigned(i), 0, 0};
    f.lane = i & 31;
    f.warp = i >> 5;
    uint64_t* sp = reinterpret_cast<uint64_t*>(stack_of(i) + kStack);
    *--sp = 0;                                                // fake return address of the entry
    *--sp = reinterpret_cast<uint64_t>(&emu_fiber_entry);     // emu_switch's ret goes here
    for (int r = 0; r < 6; ++r) *--sp = 0;                    // rbp rbx r12 r13 r14 r15
    f.sp = sp;
  }
  for (;;) {
    const uint64_t before = b.progress;
    bool any = false;
    for (auto& f : b.fibers) {
      if (f.done) continue;
      any = true;
      g_cur = &f;
      emu_switch(&b.sched_sp, f.sp);
      g_cur = nullptr;
      if (!b.error.empty()) throw std::runtime_error("cuda_emu: " + b.error);
    }
    if (!any) break;
    if (b.progress == before) {
      std::string who;
      int shown = 0;
      for (auto& f : b.fibers)
        if (!f.done && shown++ < 4)
          who += " thread " + std::to_string(f.tid.x) + " (barriers " + std::to_string(f.bar_seq) +
                 ", warp collectives " + std::to_string(f.warp_seq) + ");";
      throw std::runtime_error("cuda_emu: deadlock in block " + std::to_string(b.idx.x) + ": " +
                               std::to_string(b.live) + " threads wait forever:" + who);
    }
  }
}

// kernel<<<grid, threads, smem_bytes>>>(...): `body` calls the kernel function.
inline void launch(unsigned grid, int threads, size_t smem_bytes, std::function<void()> body) {
  std::vector<unsigned char> smem(smem_bytes + 128);
  unsigned char* base = smem.data() + (128 - reinterpret_cast<uintptr_t>(smem.data()) % 128) % 128;
  g_block.body = std::move(body);
  g_block.grid = {grid, 1, 1};
  g_block.dim = {unsigned(threads), 1, 1};
  g_block.smem = base;
  for (unsigned i = 0; i < grid; ++i) {
    g_block.idx = {g_block_order == 1 ? grid - 1 - i : i, 0, 0};
    std::memset(base, 0xff, smem_bytes);
    run_block(threads);
  }
}

inline unsigned char* dyn_smem() { return g_block.smem; }

inline void syncthreads() {
  Block& b = g_block;
  const uint64_t my = ++g_cur->bar_seq;  // wait for barrier number `my` to complete
  ++b.bar_arrived;
  ++b.progress;
  release_barrier_if_complete();
  while (b.bar_gen < my) yield();
}

enum Kind { kShfl = 1, kShflUp, kShflXor, kBallot, kMma };

// Deposit `in`, wait for the warp, read this lane's `out`; the last lane runs compute(in, out).
template <class F>
inline void collective(int kind, const void* in, size_t n_in, void* out, size_t n_out, F compute) {
  Fiber* f = g_cur;
  Warp& w = g_block.warps[f->warp];
  const uint64_t k = f->warp_seq++;
  const int buf = int(k & 1);
  if (w.arrived[buf] == 0) {
    w.kind[buf] = kind;
    w.seq[buf] = k;
  } else if (w.kind[buf] != kind || w.seq[buf] != k) {
    fail(where(*f) + ": lanes of warp " + std::to_string(f->warp) + " are at different warp collectives");
  }
  std::memcpy(w.in[buf][f->lane], in, n_in);
  ++g_block.progress;
  if (++w.arrived[buf] == 32) {
    compute(w.in[buf], w.out[buf]);
    w.arrived[buf] = 0;
    w.done[buf] = k + 1;
  } else {
    while (w.done[buf] != k + 1) yield();
  }
  std::memcpy(out, w.out[buf][f->lane], n_out);
}

inline void check_mask(unsigned mask) {
  if (mask != 0xffffffffu) fail(where(*g_cur) + ": partial warp masks are not emulated");
}

struct ShflIn { uint64_t v; int arg; };
template <class T>
inline T shfl(int kind, T v, int arg) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  ShflIn in{0, arg};
  std::memcpy(&in.v, &v, sizeof(T));
  uint64_t r;
  collective(kind, &in, sizeof in, &r, sizeof r, [kind](auto& ins, auto& outs) {
    for (int l = 0; l < 32; ++l) {
      ShflIn a;
      std::memcpy(&a, ins[l], sizeof a);
      int src = l;
      if (kind == kShfl) src = a.arg & 31;
      else if (kind == kShflUp) src = (l - a.arg >= 0) ? l - a.arg : l;
      else src = (l ^ a.arg) & 31;
      std::memcpy(outs[l], ins[src], 8);
    }
  });
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, D = A B + C. Fragments (PTX ISA, "Matrix
// Fragments for mma.m16n8k8", .tf32), g = lane >> 2, t = lane & 3:
//   A (16x8, row): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
//   B (8x8, col):  b0 (k=t, n=g), b1 (k=t+4, n=g)
//   C, D (16x8):   c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
struct MmaIn { uint32_t a[4], b[2]; float c[4]; };
// one lane's operands as deposited for the warp
inline MmaIn mma_in(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, const float (&d)[4]) {
  MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  std::memcpy(in.c, d, sizeof in.c);
  return in;
}
// lane (g, t)'s accumulator fragment into the 16x8 tile C (m16n8 C/D layout, both mma shapes)
inline void mma_accumulator_in(const MmaIn& m, int g, int t, float (&C)[16][8]) {
  C[g][2 * t] = m.c[0];
  C[g][2 * t + 1] = m.c[1];
  C[g + 8][2 * t] = m.c[2];
  C[g + 8][2 * t + 1] = m.c[3];
}
// D = A B + C for every lane: the K exact products and the accumulator summed in double, rounded once
template <int K, class Outs>
inline void mma_result(const float (&A)[16][K], const float (&B)[K][8], const float (&C)[16][8], Outs& outs) {
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    float r[4];
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      double s = C[row][col];
      for (int k = 0; k < K; ++k) s += double(A[row][k] * B[k][col]);
      r[i] = float(s);
    }
    std::memcpy(outs[l], r, sizeof r);
  }
}
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const MmaIn in = mma_in(a, b0, b1, d);
  collective(kMma, &in, sizeof in, d, sizeof d, [](auto& ins, auto& outs) {
    float A[16][8], B[8][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      MmaIn m;
      std::memcpy(&m, ins[l], sizeof m);
      const int g = l >> 2, t = l & 3;
      A[g][t] = tf32_operand(m.a[0]);
      A[g + 8][t] = tf32_operand(m.a[1]);
      A[g][t + 4] = tf32_operand(m.a[2]);
      A[g + 8][t + 4] = tf32_operand(m.a[3]);
      B[t][g] = tf32_operand(m.b[0]);
      B[t + 4][g] = tf32_operand(m.b[1]);
      mma_accumulator_in(m, g, t, C);
    }
    mma_result<8>(A, B, C, outs);  // tf32 products are exact in float
  });
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D = A B + C. Each register holds two bf16, the
// lower k index in the low half. Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", .bf16):
//   A (16x16, row): reg 0 (g, 2t | 2t+1), reg 1 (g+8, 2t | 2t+1), reg 2 (g, 2t+8 | 2t+9), reg 3 (g+8, 2t+8 | 2t+9)
//   B (16x8, col):  reg 0 (k 2t | 2t+1, n g), reg 1 (k 2t+8 | 2t+9, n g)
//   C, D (16x8):    as m16n8k8
// Products of bf16 are exact in float; the 16 products and the accumulator are summed in double and
// rounded once to float32 (as the tf32 model above).
inline float bf16_lo(uint32_t r) { return u2f(r << 16); }
inline float bf16_hi(uint32_t r) { return u2f(r & 0xffff0000u); }
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const MmaIn in = mma_in(a, b0, b1, d);
  collective(kMma, &in, sizeof in, d, sizeof d, [](auto& ins, auto& outs) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      MmaIn m;
      std::memcpy(&m, ins[l], sizeof m);
      const int g = l >> 2, t = l & 3;
      for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        A[row][col] = bf16_lo(m.a[i]);
        A[row][col + 1] = bf16_hi(m.a[i]);
      }
      for (int i = 0; i < 2; ++i) {
        B[2 * t + 8 * i][g] = bf16_lo(m.b[i]);
        B[2 * t + 8 * i + 1][g] = bf16_hi(m.b[i]);
      }
      mma_accumulator_in(m, g, t, C);
    }
    mma_result<16>(A, B, C, outs);  // bf16 products are exact in float
  });
}

}  // namespace emu

// ---- CUDA built-ins -----------------------------------------------------------------------------------
#define threadIdx (::emu::g_cur->tid)
#define blockIdx (::emu::g_block.idx)
#define blockDim (::emu::g_block.dim)
#define gridDim (::emu::g_block.grid)

inline void __syncthreads() { emu::syncthreads(); }
inline void __threadfence() {}
inline void __nanosleep(unsigned) { emu::yield(); }  // a spin-wait lets the other threads run
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int = 32) { emu::check_mask(m); return emu::shfl(emu::kShfl, v, src); }
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int = 32) { emu::check_mask(m); return emu::shfl(emu::kShflUp, v, int(d)); }
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int x, int = 32) { emu::check_mask(m); return emu::shfl(emu::kShflXor, v, x); }
inline unsigned __ballot_sync(unsigned m, int pred) {
  emu::check_mask(m);
  unsigned r;
  const int p = pred != 0;
  emu::collective(emu::kBallot, &p, sizeof p, &r, sizeof r, [](auto& ins, auto& outs) {
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) {
      int v;
      std::memcpy(&v, ins[l], sizeof v);
      bits |= unsigned(v) << l;
    }
    for (int l = 0; l < 32; ++l) std::memcpy(outs[l], &bits, sizeof bits);
  });
  return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int atomicAdd(int* p, int v) { const int old = *p; *p += v; return old; }
inline float atomicAdd(float* p, float v) { const float old = *p; *p += v; return old; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }
inline unsigned __float_as_uint(float f) { return emu::f2u(f); }
inline float __uint_as_float(unsigned u) { return emu::u2f(u); }
inline int __float_as_int(float f) { return int(emu::f2u(f)); }
inline float __int_as_float(int i) { return emu::u2f(unsigned(i)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// ---- bfloat16 --------------------------------------------------------------------------------------------
struct alignas(2) __nv_bfloat16 { uint16_t x; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
inline float __bfloat162float(__nv_bfloat16 h) { return emu::u2f(uint32_t(h.x) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {  // round to nearest even
  const uint32_t u = emu::f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // NaN stays NaN
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }

// ---- the kernels' inline-PTX helpers (their definitions are stripped from the kernel source) -----------
// cvt.rna.tf32.f32 and the split a = hi + lo (lo exact in float32; the tensor core truncates it)
inline void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  if (emu::g_tf32_mode == 2) { hi = emu::f2u(x); lo = 0u; return; }
  hi = emu::cvt_rna_tf32(x);
  lo = emu::g_tf32_mode == 1 ? 0u : emu::f2u(x - emu::u2f(hi));
}
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k8_tf32(d, a, b0, b1);
}
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k16_bf16(d, a, b0, b1);
}
// cp.async.cg.shared.global 16 bytes (src size 0: zero-fill); lands at this thread's wait
inline void cp_async16(void* smem, const void* gmem, bool valid) {
  std::memset(smem, 0xff, 16);
  emu::g_cur->pending.push_back({smem, valid ? gmem : nullptr});
}
// cp.async.ca.shared.global 4 bytes (src size 0: zero-fill); lands at this thread's wait
inline void cp_async4(void* smem, const void* gmem, bool valid) {
  std::memset(smem, 0xff, 4);
  emu::g_cur->pending.push_back({smem, valid ? gmem : nullptr, 4});
}
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
  for (const auto& c : emu::g_cur->pending) {
    if (c.src) std::memcpy(c.dst, c.src, c.n);
    else std::memset(c.dst, 0, c.n);
  }
  emu::g_cur->pending.clear();
}
inline int ld_acquire(const int* p) { return *static_cast<const volatile int*>(p); }
inline void st_release(int* p, int v) { *static_cast<volatile int*>(p) = v; }
inline int tid_x() { return int(threadIdx.x); }  // mov.u32 %tid.x (asm volatile: not hoisted)
