"""Retries with exponential back-off, every attempt recorded."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kernelwright.core.config import RetryPolicy
from kernelwright.models.chat import Attempt, ModelError
from kernelwright.models.limits import EndpointLimiter

T = TypeVar("T")


@dataclass
class Failure:
    """How a backend classifies one exception."""

    retryable: bool
    message: str  # one line
    status_code: int | None = None
    retry_after_s: float | None = None  # the server's own Retry-After, when it sent one


def call_with_retries(
    call: Callable[[], T],
    classify: Callable[[BaseException], Failure | None],
    policy: RetryPolicy,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    limiter: EndpointLimiter | None = None,
) -> tuple[T, list[Attempt]]:
    """Run `call` until it succeeds or the policy is spent. `classify` returns None for
    exceptions that are not the provider's (bugs), which then propagate unchanged.

    `limiter`: the endpoint's (models.limits): each attempt waits for a slot there, and a 429's
    wait holds back every caller of the endpoint."""
    attempts: list[Attempt] = []
    for n in range(1, policy.max_attempts + 1):
        if limiter is not None:
            limiter.acquire()
        t0 = time.monotonic()
        try:
            try:
                value = call()
            finally:
                if limiter is not None:
                    limiter.release()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised when not ours
            failure = classify(exc)
            if failure is None:
                raise
            attempt = Attempt(
                attempt=n,
                ok=False,
                error=failure.message,
                status_code=failure.status_code,
                elapsed_s=round(time.monotonic() - t0, 3),
            )
            attempts.append(attempt)
            if not failure.retryable or n == policy.max_attempts:
                tail = "" if not failure.retryable else f" (gave up after {n} attempts)"
                raise ModelError(f"{what}: {failure.message}{tail}", attempts) from None
            delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (n - 1))
            if failure.retry_after_s is not None:
                delay = min(policy.max_delay_s, max(delay, failure.retry_after_s))
            attempt.retry_after_s = round(delay, 3)
            if limiter is not None and failure.status_code == 429:
                limiter.pause(delay)
            sleep(delay)
            continue
        attempts.append(Attempt(attempt=n, ok=True, elapsed_s=round(time.monotonic() - t0, 3)))
        return value, attempts
    raise AssertionError("unreachable")  # pragma: no cover


def retry_after_header(headers) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms) header, when the server sent one."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000.0
        value = headers.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def classify_sdk_error(
    exc: BaseException, sdk, timeout_s: float, key_env: str, retryable_status: set[int], connection_hint: str = ""
) -> Failure | None:
    """A Failure for the errors the `openai` and `anthropic` clients share (same class names), else None."""
    from kernelwright.models.chat import one_line

    if isinstance(exc, sdk.APITimeoutError):
        return Failure(True, f"timeout: no answer within {timeout_s:g} s")
    if isinstance(exc, sdk.APIConnectionError):
        return Failure(True, f"connection error: {one_line(exc)}{connection_hint}")
    if isinstance(exc, sdk.APIStatusError):
        code = exc.status_code
        retryable = code in retryable_status or code >= 500
        hint = f"; check {key_env}" if code in (401, 403) else ""
        return Failure(
            retryable,
            f"{code} {type(exc).__name__}: {one_line(exc.message)}{hint}",
            code,
            retry_after_header(getattr(exc.response, "headers", None)),
        )
    return None
