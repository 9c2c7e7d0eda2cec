"""Model backends for the Coder and the Judge: OpenAI-compatible, Anthropic, and replay."""

from kernelwright.models.base import (
    Attempt,
    ChatModel,
    Completion,
    Message,
    ModelError,
    ModelSetupError,
    Usage,
)
from kernelwright.models.resolve import resolve_model

__all__ = ["Attempt", "ChatModel", "Completion", "Message", "ModelError", "ModelSetupError", "Usage", "resolve_model"]
