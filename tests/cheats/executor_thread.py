"""Computes the right answer, and leaves a ThreadPoolExecutor worker running (where deferred work
would go): torch.compile's own compile pool is allowed, a pool of the candidate's is not."""
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

_pool = ThreadPoolExecutor(max_workers=1)


class ModelNew(nn.Module):
    def forward(self, x):
        _pool.submit(lambda: None)  # the worker thread starts and stays
        return torch.relu(x) + 1.0
