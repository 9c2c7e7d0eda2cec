import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # silu(x) = x * sigmoid(x) in one op, then bias + silu * scale in one more: two passes, one temporary
        return torch.addcmul(self.bias, F.silu(x), self.scale)
