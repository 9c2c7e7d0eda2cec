"""Anthropic's models through the official `anthropic` client (Messages API).

System messages go in the `system` field; retries are ours (`call_with_retries`), not the client's.
"""

from __future__ import annotations

import os

import anthropic
from anthropic.types import Message as AnthropicMessage

from kernelwright.core.config import ModelConfig
from kernelwright.models.chat import Completion, Message, ModelSetupError, Usage, complete_response_schemas
from kernelwright.models.limits import limiter_for
from kernelwright.models.pricing import PriceTable
from kernelwright.models.retry import Failure, call_with_retries, classify_sdk_error

DEFAULT_MAX_TOKENS = 16000  # the Messages API requires a limit
RETRYABLE_STATUS = {408, 409, 429, 529}


class AnthropicChat:
    def __init__(self, model: str, config: ModelConfig, prices: PriceTable, name: str | None = None):
        self.model = model
        self.name = name or f"anthropic:{model}"
        self.config = config
        self.prices = prices
        self.limiter = limiter_for(config.base_url or "anthropic", config.max_concurrent)
        self.key_env = config.api_key_env or "ANTHROPIC_API_KEY"
        key = os.environ.get(self.key_env)
        if not key:
            raise ModelSetupError(f"no API key for {self.name}: set {self.key_env}")
        self.client = anthropic.Anthropic(
            api_key=key, base_url=config.base_url, max_retries=0, timeout=config.retry.request_timeout_s
        )
        complete_response_schemas(AnthropicMessage)

    def _classify(self, exc: BaseException) -> Failure | None:
        return classify_sdk_error(exc, anthropic, self.config.retry.request_timeout_s, self.key_env, RETRYABLE_STATUS)

    def complete(self, messages: list[Message]) -> Completion:
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        chat = [m for m in messages if m["role"] != "system"]
        kwargs: dict = {
            "model": self.model,
            "messages": chat,
            "max_tokens": self.config.max_output_tokens or DEFAULT_MAX_TOKENS,
        }
        if system:
            kwargs["system"] = system
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        response, attempts = call_with_retries(
            lambda: self.client.messages.create(**kwargs),
            self._classify,
            self.config.retry,
            self.name,
            limiter=self.limiter,
        )
        text = "".join(getattr(block, "text", "") for block in response.content if block.type == "text")
        usage = Usage(response.usage.input_tokens or 0, response.usage.output_tokens or 0)
        return Completion(
            text=text,
            usage=usage,
            model=response.model or self.model,
            attempts=attempts,
            cost_usd=self.prices.cost(self.model, usage),
            finish_reason=response.stop_reason,
        )
