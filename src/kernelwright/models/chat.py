"""What every model backend speaks: chat messages in, one `Completion` out.

A backend retries transient failures itself and records every attempt in the completion, so
a run directory shows a 429 or a time-out that was survived, not only the final answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


class ModelError(RuntimeError):
    """A model call failed for good (retries spent, or an error no retry can fix). One line."""

    def __init__(self, message: str, attempts: list[Attempt] | None = None):
        super().__init__(message)
        self.attempts = list(attempts or [])


class AnswersExhausted(ModelError):
    """A model with a fixed set of answers (a replay) has given them all: the run ends there, normally."""


class ModelSetupError(ModelError):
    """The model cannot be used at all (no key, no endpoint, unknown provider). One line naming the fix."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


@dataclass
class Attempt:
    """One try of a call: how it ended, and how long the back-off before the next one was."""

    attempt: int  # 1-based
    ok: bool
    error: str = ""  # e.g. "429 RateLimitError: ...", "timeout after 1 s"
    status_code: int | None = None
    elapsed_s: float = 0.0
    retry_after_s: float | None = None  # the wait before the next attempt, when there was one


@dataclass
class Completion:
    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""  # the model that answered, as the provider names it
    attempts: list[Attempt] = field(default_factory=list)
    cost_usd: float | None = None  # None: no price known for this model
    finish_reason: str | None = None

    def record(self) -> dict[str, Any]:
        """The call as the run directory stores it (the text is stored beside it, raw)."""
        return {
            "model": self.model,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "cost_usd": self.cost_usd,
            "finish_reason": self.finish_reason,
            "attempts": [vars(a) for a in self.attempts],
        }


@runtime_checkable
class ChatModel(Protocol):
    """A Coder or Judge model. `name` is the spec it was resolved from, for records."""

    name: str

    def complete(self, messages: list[Message]) -> Completion: ...


def one_line(text: object, limit: int = 300) -> str:
    """A provider's error text folded to one line of at most `limit` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def complete_response_schemas(*models: Any) -> None:
    """Build an SDK's response models' pydantic schemas now, in the thread that makes the backend.
    The SDKs defer them to first use, and that build is not thread-safe: a round's coders call at
    once (loop/forge.py), and two first uses at once can raise AttributeError ("type object
    'ChatCompletion' has no attribute '__pydantic_core_schema__'")."""
    for model in models:
        model.model_rebuild()
