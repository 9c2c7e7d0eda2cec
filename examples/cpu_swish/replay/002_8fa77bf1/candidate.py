import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor fused_swish_affine(torch::Tensor x, torch::Tensor scale, torch::Tensor bias) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be a 2-D float32 tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* px = xc.data_ptr<float>();
    const float* ps = scale.contiguous().data_ptr<float>();
    const float* pb = bias.contiguous().data_ptr<float>();
    float* po = out.data_ptr<float>();
    // One pass: read x once, write y once; rows split over torch's own thread pool.
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = px + r * cols;
            float* orow = po + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
                const float v = xr[c];
                orow[c] = v / (1.0f + std::exp(-v)) * ps[c] + pb[c];
            }
        }
    });
    return out;
}
"""

fused = load_inline(
    name="kw_example_swish_cpu",
    cpp_sources=cpp_src,
    functions=["fused_swish_affine"],
    extra_cflags=["-O3", "-ffast-math", "-march=native"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.fused_swish_affine(x, self.scale, self.bias)
