"""Does its work in a background worker thread of its own, which stays running after each call.

forward waits for the worker here, so every output is complete when it is read and the output
comparison passes; what gives it away is the thread left running (`background_threads`): a
candidate that stopped waiting for it would have its work escape the timer.
"""
import queue
import threading

import torch
import torch.nn as nn

_jobs = queue.Queue()


def _worker():
    while True:
        x, out, done = _jobs.get()
        torch.add(torch.relu(x), 1.0, out=out)
        done.set()


threading.Thread(target=_worker, name="kw-deferred-worker", daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        done = threading.Event()
        _jobs.put((x, out, done))
        done.wait()
        return out
