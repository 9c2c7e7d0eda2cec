"""How many model calls may be in flight at one endpoint, and when it has asked us to wait.

Many problems (and several Coder answers per round) call models at once; a provider or a local
server takes only so many. Every backend's call goes through its endpoint's `EndpointLimiter`:
at most `ModelConfig.max_concurrent` attempts in flight per endpoint, and a 429 whose Retry-After
says "wait N s" holds back every caller of that endpoint for N s, not only the one that got it.

The limiters are shared by all backends of this process that reach the same endpoint (the Coder
and the Judge on one server count together), keyed by base URL or provider.
"""

from __future__ import annotations

import threading
import time


class EndpointLimiter:
    def __init__(self, endpoint: str, max_concurrent: int):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1 (got {max_concurrent})")
        self.endpoint = endpoint
        self.max_concurrent = max_concurrent
        self._cv = threading.Condition()
        self._in_flight = 0
        self._paused_until = 0.0
        self.peak = 0  # the most attempts in flight at once (for tests and reports)

    def acquire(self) -> float:
        """Wait for a free slot and for any pause to end; the seconds waited."""
        t0 = time.monotonic()
        with self._cv:
            while True:
                wait = self._paused_until - time.monotonic()
                if wait <= 0 and self._in_flight < self.max_concurrent:
                    break
                self._cv.wait(timeout=wait if wait > 0 else None)
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
        return time.monotonic() - t0

    def release(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()

    def pause(self, seconds: float) -> None:
        """The endpoint said to wait (429 + Retry-After): nobody starts a call here for `seconds`."""
        with self._cv:
            self._paused_until = max(self._paused_until, time.monotonic() + seconds)
            self._cv.notify_all()


_LIMITERS: dict[str, EndpointLimiter] = {}
_LOCK = threading.Lock()


def limiter_for(endpoint: str, max_concurrent: int) -> EndpointLimiter:
    """The limiter of `endpoint` in this process (the first caller's limit holds; a larger one raises it)."""
    key = endpoint.rstrip("/")
    with _LOCK:
        lim = _LIMITERS.get(key)
        if lim is None:
            lim = _LIMITERS[key] = EndpointLimiter(key, max_concurrent)
        elif max_concurrent > lim.max_concurrent:
            with lim._cv:
                lim.max_concurrent = max_concurrent
                lim._cv.notify_all()
        return lim
