"""Hostile: grows every output file the engine wrote to 2 GiB (sparse) from a thread."""
import glob, threading, time
import torch
import torch.nn as nn

def grow():
    for _ in range(4000):
        for f in glob.glob("out/*.kwt"):
            try:
                with open(f, "r+b") as fh:
                    fh.truncate(2 << 30)
            except OSError:
                pass
        time.sleep(0.002)

threading.Thread(target=grow, daemon=True).start()

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0
