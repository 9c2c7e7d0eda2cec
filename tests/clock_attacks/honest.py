import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The control: the same computation as the reference, nothing else."""

    def forward(self, x):
        return x * torch.sigmoid(x)
