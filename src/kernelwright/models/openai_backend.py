"""Any OpenAI-compatible chat-completions endpoint, through the official `openai` client.

Covers OpenAI itself and local or hosted servers that speak the same protocol (vLLM, SGLang,
Ollama, proxies) through `base_url`. The client's own retries are off: `call_with_retries`
retries instead and records every attempt.
"""

from __future__ import annotations

import os

import openai
from openai.types.chat import ChatCompletion

from kernelwright.core.config import ModelConfig
from kernelwright.models.chat import Completion, Message, ModelSetupError, Usage, complete_response_schemas
from kernelwright.models.limits import limiter_for
from kernelwright.models.pricing import PriceTable
from kernelwright.models.retry import Failure, call_with_retries, classify_sdk_error

RETRYABLE_STATUS = {408, 409, 429}
LOCAL_KEY_PLACEHOLDER = "not-needed"  # local servers ignore the key, the client insists on one


class OpenAIChat:
    def __init__(self, model: str, config: ModelConfig, prices: PriceTable, name: str | None = None):
        self.model = model
        self.name = name or f"openai:{model}"
        self.config = config
        self.prices = prices
        self.limiter = limiter_for(config.base_url or "openai", config.max_concurrent)
        self.key_env = config.api_key_env or "OPENAI_API_KEY"
        key = os.environ.get(self.key_env)
        if not key:
            if not config.base_url:
                raise ModelSetupError(
                    f"no API key for {self.name}: set {self.key_env}, or pass --base-url for a local "
                    "OpenAI-compatible server (vLLM, SGLang, Ollama)"
                )
            key = LOCAL_KEY_PLACEHOLDER
        self.client = openai.OpenAI(
            api_key=key, base_url=config.base_url, max_retries=0, timeout=config.retry.request_timeout_s
        )
        complete_response_schemas(ChatCompletion)

    def _classify(self, exc: BaseException) -> Failure | None:
        return classify_sdk_error(
            exc,
            openai,
            self.config.retry.request_timeout_s,
            self.key_env,
            RETRYABLE_STATUS,
            connection_hint=f" (is {self.config.base_url or 'the API'} reachable?)",
        )

    def complete(self, messages: list[Message]) -> Completion:
        kwargs: dict = {"model": self.model, "messages": messages}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_output_tokens is not None:
            # OpenAI's newer models take max_completion_tokens; most compatible servers take max_tokens.
            key = "max_tokens" if self.config.base_url else "max_completion_tokens"
            kwargs[key] = self.config.max_output_tokens
        response, attempts = call_with_retries(
            lambda: self.client.chat.completions.create(**kwargs),
            self._classify,
            self.config.retry,
            self.name,
            limiter=self.limiter,
        )
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice else ""
        u = response.usage
        usage = Usage(getattr(u, "prompt_tokens", 0) or 0, getattr(u, "completion_tokens", 0) or 0)
        answered_by = response.model or self.model
        return Completion(
            text=text,
            usage=usage,
            model=answered_by,
            attempts=attempts,
            cost_usd=self.prices.cost(self.model, usage),
            finish_reason=choice.finish_reason if choice else None,
        )
