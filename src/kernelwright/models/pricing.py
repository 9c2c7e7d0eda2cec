"""Prices per million tokens, and the cost of one call.

The built-in table is a starting point (list prices in USD as published by the providers; check
them before trusting a bill). Users extend or override it with a JSON or TOML file:

    # prices.toml                          # prices.json
    [my-local-model]                       {"my-local-model": {"input": 0, "output": 0},
    input = 0.0                             "gpt-5": {"input": 1.25, "output": 10}}
    output = 0.0

A model matches its exact name first, then the longest known prefix (so `gpt-4o-2024-08-06`
is priced as `gpt-4o`). A model with no price has cost `None`: counted as unknown, never as 0.

Where LiteLLM is installed (`kernelwright[litellm]`), its price table (kept up to date by its
maintainers, thousands of models) comes between the user's prices and the built-in table: the
user's file and `[model.prices]` first, then LiteLLM's, then the hand-kept table above.
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kernelwright.models.chat import ModelSetupError, Usage


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.input_per_mtok + usage.completion_tokens * self.output_per_mtok) / 1e6


BUILTIN: dict[str, Price] = {
    "gpt-5": Price(1.25, 10.0),
    "gpt-5-mini": Price(0.25, 2.0),
    "gpt-5-nano": Price(0.05, 0.40),
    "gpt-4.1": Price(2.0, 8.0),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4o": Price(2.50, 10.0),
    "gpt-4o-mini": Price(0.15, 0.60),
    "o3": Price(2.0, 8.0),
    "o4-mini": Price(1.10, 4.40),
    "claude-opus-4": Price(15.0, 75.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-3-7-sonnet": Price(3.0, 15.0),
    "claude-3-5-haiku": Price(0.80, 4.0),
}


LITELLM_TABLE = "model_prices_and_context_window_backup.json"  # the price table the litellm package ships


@lru_cache(maxsize=1)
def litellm_table() -> dict[str, Any]:
    """LiteLLM's price table, read from the file its package ships (the table `litellm.model_cost`
    holds offline), without importing litellm (seconds); {} when LiteLLM is not installed."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    for folder in spec.submodule_search_locations:
        path = Path(folder) / LITELLM_TABLE
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def litellm_price(model: str) -> Price | None:
    """LiteLLM's price for `model` ("gemini/gemini-2.5-pro", "gpt-4o", ...), when LiteLLM is installed."""
    table = litellm_table()
    for key in (model, model.split("/", 1)[-1]):
        entry = table.get(key)
        if isinstance(entry, dict) and entry.get("input_cost_per_token") is not None:
            try:
                return Price(
                    float(entry["input_cost_per_token"]) * 1e6, float(entry.get("output_cost_per_token") or 0) * 1e6
                )
            except (TypeError, ValueError):
                return None
    return None


def _lookup(prices: dict[str, Price], model: str) -> Price | None:
    name = model.split("/")[-1]  # "openai/gpt-4o" (routers) -> "gpt-4o"
    if name in prices:
        return prices[name]
    best = max((k for k in prices if name.startswith(k)), key=len, default=None)
    return prices[best] if best else None


class PriceTable:
    """`prices` given: exactly that table. Otherwise the built-in one, under LiteLLM's (when
    installed and `litellm` is not False), under the user's (`load`)."""

    def __init__(self, prices: dict[str, Price] | None = None, litellm: bool | None = None):
        self.prices = dict(BUILTIN if prices is None else prices)
        self.user: dict[str, Price] = {}
        self.litellm = prices is None if litellm is None else litellm

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        extra: dict[str, dict[str, float]] | None = None,
        litellm: bool | None = None,
    ) -> PriceTable:
        """The built-in table, extended (and overridden) by the user's price file when one is given,
        then by `extra` (the settings file's [model.prices])."""
        table = cls(litellm=litellm)
        if path:
            table.user.update(read_price_file(path))
        for name, v in (extra or {}).items():
            table.user[str(name)] = Price(float(v["input"]), float(v["output"]))
        return table

    def price(self, model: str) -> Price | None:
        found = _lookup(self.user, model)
        if found is None and self.litellm:
            found = litellm_price(model)
        return found if found is not None else _lookup(self.prices, model)

    def cost(self, model: str, usage: Usage) -> float | None:
        price = self.price(model)
        return None if price is None else price.cost(usage)


def read_price_file(path: str | Path) -> dict[str, Price]:
    p = Path(path)
    if not p.is_file():
        raise ModelSetupError(f"price file not found: {p}; check the path given as the price file")
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
        return {str(name): Price(float(v["input"]), float(v["output"])) for name, v in data.items()}
    except (ValueError, KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as exc:
        raise ModelSetupError(
            f"price file {p} is not a table of {{model: {{input: USD/Mtok, output: USD/Mtok}}}} ({exc}); fix the file"
        ) from None
