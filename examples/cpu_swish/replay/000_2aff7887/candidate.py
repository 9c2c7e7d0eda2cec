import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void swish_affine_kernel(const float4* __restrict__ x, const float* __restrict__ scale,
                                    const float* __restrict__ bias, float4* __restrict__ out,
                                    long n4, int cols4) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const int c = (int)(i % cols4) * 4;
        float4 v = x[i];
        float4 r;
        r.x = v.x / (1.0f + __expf(-v.x)) * scale[c + 0] + bias[c + 0];
        r.y = v.y / (1.0f + __expf(-v.y)) * scale[c + 1] + bias[c + 1];
        r.z = v.z / (1.0f + __expf(-v.z)) * scale[c + 2] + bias[c + 2];
        r.w = v.w / (1.0f + __expf(-v.w)) * scale[c + 3] + bias[c + 3];
        out[i] = r;
    }
}

torch::Tensor fused_swish_affine(torch::Tensor x, torch::Tensor scale, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a CUDA float32 tensor");
    TORCH_CHECK(x.size(-1) % 4 == 0, "last dimension must be a multiple of 4");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const long n4 = xc.numel() / 4;
    const int cols4 = (int)(xc.size(-1) / 4);
    const int threads = 256;
    const int blocks = (int)std::min<long>((n4 + threads - 1) / threads, 65535L * 8);
    swish_affine_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(xc.data_ptr<float>()), scale.contiguous().data_ptr<float>(),
        bias.contiguous().data_ptr<float>(), reinterpret_cast<float4*>(out.data_ptr<float>()), n4, cols4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor fused_swish_affine(torch::Tensor x, torch::Tensor scale, torch::Tensor bias);"

fused = load_inline(
    name="kw_example_swish_cuda",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["fused_swish_affine"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.fused_swish_affine(x, self.scale, self.bias)
