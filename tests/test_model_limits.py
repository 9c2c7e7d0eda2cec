"""Model calls from many threads: at most `max_concurrent` in flight per endpoint, and a 429's
Retry-After holds back every caller of that endpoint. Real `openai` client, real HTTP server."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from helpers.chat_server import ChatServer, Reply, Status
from kernelwright.core.config import ModelConfig, RetryPolicy
from kernelwright.models import resolve_model
from kernelwright.models.limits import EndpointLimiter, limiter_for

needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client")
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=5.0, request_timeout_s=10)


def call_all(models, n_threads: int) -> list:
    out: list = [None] * n_threads
    threads = [
        threading.Thread(
            target=lambda i=i: out.__setitem__(i, models[i].complete([{"role": "user", "content": f"call {i}"}]))
        )
        for i in range(n_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@needs_openai
def test_calls_to_one_endpoint_are_limited_across_models_and_threads():
    script = {
        "coder": [Reply(f"c{i}", delay_s=0.3) for i in range(4)],
        "judge": [Reply(f"j{i}", delay_s=0.3) for i in range(2)],
    }
    with ChatServer(script) as server:
        cfg = ModelConfig(base_url=server.base_url, retry=FAST, max_concurrent=2)
        models = [resolve_model("coder", "coder", cfg) for _ in range(4)] + [
            resolve_model("judge", "judge", cfg) for _ in range(2)
        ]
        done = call_all(models, 6)
    assert all(d is not None for d in done)
    lim = limiter_for(server.base_url, 2)
    assert lim is models[0].limiter is models[5].limiter  # the Coder and the Judge share their endpoint's
    assert lim.peak == 2  # never more than the limit, and the limit was used


@needs_openai
def test_a_429_with_retry_after_holds_back_every_caller_of_the_endpoint():
    script = {"m": [Status(429, "slow down", retry_after="1"), Reply("a"), Reply("b")]}
    with ChatServer(script) as server:
        cfg = ModelConfig(base_url=server.base_url, retry=FAST, max_concurrent=4)
        first = resolve_model("m", "coder", cfg)
        results: dict = {}

        def a():
            results["a"] = first.complete([{"role": "user", "content": "a"}])

        ta = threading.Thread(target=a)
        ta.start()
        while not server.log:  # the 429 has been served
            time.sleep(0.01)
        time.sleep(0.1)
        # a second caller, after the 429: it must wait out the Retry-After too
        results["b"] = resolve_model("m", "judge", cfg).complete([{"role": "user", "content": "b"}])
        ta.join(30)
    t429 = server.log[0]["t"]
    later = [e["t"] for e in server.log[1:]]
    assert server.log[0]["served"] == "Status" and len(later) == 2
    assert min(later) >= t429 + 0.95  # nobody reached the endpoint during the 1 s it asked for
    assert results["a"].attempts[0].status_code == 429 and results["a"].attempts[0].retry_after_s == pytest.approx(1.0)


def test_limiter_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        EndpointLimiter("x", 0)
