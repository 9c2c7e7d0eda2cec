"""Wrong output, and the engine's own comparison replaced by one that always says 'close'."""
import sys

import torch
import torch.nn as nn

for name, mod in list(sys.modules.items()):
    if name.startswith("kernelwright") and hasattr(mod, "compare_outputs"):
        real = mod.compare_outputs

        def always_close(cand, ref, atol, rtol, _real=real):
            return _real(ref, ref, atol, rtol)

        mod.compare_outputs = always_close


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
