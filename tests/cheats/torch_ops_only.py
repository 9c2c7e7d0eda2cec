"""The reference's math rewritten with PyTorch's own operators: correct, but no kernel of its own."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x, torch.zeros_like(x)) + 1.0
