"""Right values, wrong structure: a one-element tuple where the reference returns a tensor."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return (torch.relu(x) + 1.0,)
