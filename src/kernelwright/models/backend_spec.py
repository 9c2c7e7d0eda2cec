"""From a `--coder`/`--judge` string to a model backend.

    openai:gpt-5                 OpenAI (key from OPENAI_API_KEY, or the configured env var)
    anthropic:claude-sonnet-4-5  Anthropic (key from ANTHROPIC_API_KEY, or the configured env var)
    replay:RUN_DIR               the responses recorded in a run directory, in order
    litellm:gemini/gemini-2.5-pro  any provider LiteLLM names (optional: pip install 'kernelwright[litellm]')
    qwen2.5-coder (bare name)    an OpenAI-compatible server at --base-url (OpenAI itself without one)

Without --base-url, a spec with an unknown prefix (`foo:bar`) is an error naming the known ones;
with it, any name goes to that server (ollama's names hold colons: `qwen2.5:7b`).
"""

from __future__ import annotations

from kernelwright.core.config import ModelConfig
from kernelwright.models.chat import ChatModel, ModelSetupError
from kernelwright.models.pricing import PriceTable

PROVIDERS = ("openai", "anthropic", "litellm", "replay")


def resolve_model(spec: str, role: str, config: ModelConfig, prices: PriceTable | None = None) -> ChatModel:
    """Build the backend for `spec`. Raises ModelSetupError (one line) when it cannot be used."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelSetupError(f"no {role} model given; pass --{role} such as openai:gpt-5 or replay:RUN_DIR")
    provider, sep, rest = spec.partition(":")
    if sep and provider not in PROVIDERS:
        if not config.base_url:
            raise ModelSetupError(
                f"--{role} {spec!r}: unknown provider {provider!r}; known prefixes: "
                f"{', '.join(p + ':' for p in PROVIDERS)} (or pass --base-url for a model served under that name)"
            )
    if not sep or provider not in PROVIDERS:
        provider, rest = "openai", spec  # a bare name (which may itself hold a colon, e.g. ollama's "qwen2.5:7b")
    if not rest:
        if provider == "replay":
            raise ModelSetupError(f"--{role} {spec!r} names no run directory; pass a run directory: replay:RUN_DIR")
        raise ModelSetupError(f"--{role} {spec!r} names no model; write {provider}:MODEL")
    if provider == "replay":
        from kernelwright.models.replay import ReplayChat

        return ReplayChat(rest, role)
    prices = prices or PriceTable.load(config.price_file, config.prices)
    if provider == "litellm":
        from kernelwright.models.litellm_backend import LiteLLMChat

        return LiteLLMChat(rest, config, prices, name=spec)
    if provider == "anthropic":
        from kernelwright.models.anthropic_backend import AnthropicChat

        return AnthropicChat(rest, config, prices, name=spec)
    from kernelwright.models.openai_backend import OpenAIChat

    return OpenAIChat(rest, config, prices, name=spec)


def resolve_coders(spec: str, config: ModelConfig, k: int, prices: PriceTable | None = None) -> list[ChatModel]:
    """The Coders of a round of `k` candidates: one model at `k` temperatures (spread over 0.2-1.0,
    or all at the configured one). A replay is one model asked `k` times (its answers in order)."""
    from dataclasses import replace

    if k <= 1 or spec.strip().startswith("replay:"):
        return [resolve_model(spec, "coder", config, prices)]
    temps = (
        [config.temperature] * k
        if config.temperature is not None
        else [round(0.2 + 0.8 * i / (k - 1), 2) for i in range(k)]
    )
    models = []
    for t in temps:
        model = resolve_model(spec, "coder", replace(config, temperature=t), prices)
        model.name = f"{model.name}@temperature={t:g}"
        models.append(model)
    return models
