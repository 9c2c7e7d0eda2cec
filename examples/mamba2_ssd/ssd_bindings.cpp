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
