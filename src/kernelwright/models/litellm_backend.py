"""Any provider LiteLLM knows by name (`--coder litellm:gemini/gemini-2.5-pro`, `litellm:bedrock/...`,
`litellm:vertex_ai/...`, `litellm:openai/NAME` with --base-url), through the optional `litellm`
package: `pip install 'kernelwright[litellm]'`.

LiteLLM reads each provider's own credentials from the environment (GEMINI_API_KEY, AWS_*, ...);
`api_key_env` names another variable to take the key from. Its errors are OpenAI's exception
classes, so retries are ours (`call_with_retries`: every attempt recorded, the endpoint's limiter
honoured), with LiteLLM's own retries off.
"""

from __future__ import annotations

import os
from typing import Any

from kernelwright.core.config import ModelConfig
from kernelwright.models.chat import Completion, Message, ModelSetupError, Usage
from kernelwright.models.limits import limiter_for
from kernelwright.models.pricing import PriceTable
from kernelwright.models.retry import Failure, call_with_retries, classify_sdk_error

RETRYABLE_STATUS = {408, 409, 429}
INSTALL_HINT = "pip install 'kernelwright[litellm]'"


def import_litellm() -> Any:
    """The litellm module, offline: its price table from the copy it ships (no fetch at import)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LiteLLMChat:
    def __init__(self, model: str, config: ModelConfig, prices: PriceTable, name: str | None = None):
        self.model = model
        self.name = name or f"litellm:{model}"
        try:
            self.litellm = import_litellm()
        except ImportError:
            raise ModelSetupError(f"{self.name}: LiteLLM is not installed; {INSTALL_HINT}") from None
        import openai  # LiteLLM's exceptions are the openai client's classes

        self.openai = openai
        self.config = config
        self.prices = prices
        self.provider = model.split("/", 1)[0] if "/" in model else "litellm"
        self.limiter = limiter_for(config.base_url or f"litellm:{self.provider}", config.max_concurrent)
        self.key_env = config.api_key_env or f"the {self.provider} credentials LiteLLM reads"
        self.api_key = None
        if config.api_key_env:
            self.api_key = os.environ.get(config.api_key_env)
            if not self.api_key:
                raise ModelSetupError(f"no API key for {self.name}: set {config.api_key_env}")

    def _classify(self, exc: BaseException) -> Failure | None:
        return classify_sdk_error(
            exc,
            self.openai,
            self.config.retry.request_timeout_s,
            self.key_env,
            RETRYABLE_STATUS,
            connection_hint=f" (is {self.config.base_url or self.provider} reachable?)",
        )

    def complete(self, messages: list[Message]) -> Completion:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "num_retries": 0,
            "max_retries": 0,
            "timeout": self.config.retry.request_timeout_s,
        }
        if self.config.base_url:
            kwargs["api_base"] = self.config.base_url
        if self.api_key:
            kwargs["api_key"] = self.api_key
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_output_tokens is not None:
            kwargs["max_tokens"] = self.config.max_output_tokens
        response, attempts = call_with_retries(
            lambda: self.litellm.completion(**kwargs),
            self._classify,
            self.config.retry,
            self.name,
            limiter=self.limiter,
        )
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice else ""
        u = getattr(response, "usage", None)
        usage = Usage(getattr(u, "prompt_tokens", 0) or 0, getattr(u, "completion_tokens", 0) or 0)
        return Completion(
            text=text,
            usage=usage,
            model=getattr(response, "model", None) or self.model,
            attempts=attempts,
            cost_usd=self.prices.cost(self.model, usage),
            finish_reason=choice.finish_reason if choice else None,
        )
