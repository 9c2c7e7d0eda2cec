"""Caches outputs by the input's data pointer: fast when timed on the same tensor, stale on new values.

It keeps every input it has seen alive, so no later tensor can be given the address of an earlier
one: every fresh tensor (each trial's, the guarded call's) gets the right output, and only the same
tensor refilled in place with new values gets a stale one. The output comparison of the trials
cannot catch it; the refill guard (`stale_output_on_refill`) must.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = (x, torch.relu(x) + 1.0)  # x held: its address is never reused
        return self.cache[key][1]
