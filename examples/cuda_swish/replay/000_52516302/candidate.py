import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void swish_affine_kernel(const float* __restrict__ x, const float* __restrict__ scale,
                                    const float* __restrict__ bias, float* __restrict__ out,
                                    long n, int cols) {
    const long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) {
        const int c = (int)(i % cols);
        const float v = x[i];
        out[i] = v / (1.0f + expf(-v)) * scale[c];
    }
}

torch::Tensor swish_affine(torch::Tensor x, torch::Tensor scale, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a CUDA float32 tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const long n = xc.numel();
    const int cols = (int)xc.size(-1);
    const int threads = 256;
    const unsigned int blocks = (unsigned int)((n + threads - 1) / threads);
    swish_affine_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), scale.contiguous().data_ptr<float>(), bias.contiguous().data_ptr<float>(),
        out.data_ptr<float>(), n, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor swish_affine(torch::Tensor x, torch::Tensor scale, torch::Tensor bias);"

swish = load_inline(
    name="kw_replay_swish_naive",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["swish_affine"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swish.swish_affine(x, self.scale, self.bias)
