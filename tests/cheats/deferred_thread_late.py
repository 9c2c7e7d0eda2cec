"""Returns at once and lets a background worker thread fill the output later (work escapes the timer).

The worker is one call behind: it computes a call's output only when the next call arrives, so
every output is read (written to the judge) before anything is written into it. With the guards'
NaN fill, the output shows as memory the candidate never wrote.
"""
import queue
import threading

import torch
import torch.nn as nn

_jobs = queue.Queue()


def _worker():
    pending = None
    while True:
        job = _jobs.get()  # the next call has started: the previous one's output is long read
        if pending is not None:
            x, out = pending
            torch.add(torch.relu(x), 1.0, out=out)
        pending = job


threading.Thread(target=_worker, name="kw-deferred-worker", daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _jobs.put((x, out))
        return out
