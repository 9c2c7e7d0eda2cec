import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Not an attack: the control beside side_stream.py. Its work runs on a stream of its own, the
    way a model overlapping two streams is written: the side stream waits for the current one
    (where the inputs come from), and the current one waits for the side stream's result."""

    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x):
        if not x.is_cuda:
            return x * torch.sigmoid(x)
        if self.side is None:
            self.side = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            out = x * torch.sigmoid(x)
        main.wait_stream(self.side)
        out.record_stream(main)
        return out
