"""Computes in place in the input's memory and returns the input itself: no allocation, aliased output."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_(min=0.0).add_(1.0)
