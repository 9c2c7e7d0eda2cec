"""Model backends for the Coder and the Judge: OpenAI-compatible, Anthropic, and replay."""

from kernelwright.models.backend_spec import resolve_model
from kernelwright.models.chat import (
    Attempt,
    ChatModel,
    Completion,
    Message,
    ModelError,
    ModelSetupError,
    Usage,
)

__all__ = ["Attempt", "ChatModel", "Completion", "Message", "ModelError", "ModelSetupError", "Usage", "resolve_model"]
