"""Prompt templates (Jinja, StrictUndefined): the Coder's first, repair and optimisation prompts,
and the Judge's failure and performance prompts, each with CUDA, Triton and CPU C++ variants."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

TEMPLATE_DIR = Path(__file__).resolve().parent
TEMPLATES = ("coder_first", "coder_repair", "coder_optimise", "judge_failure", "judge_performance")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(name: str, **variables) -> str:
    """Render `name.j2`; a variable the template uses but the caller did not pass is an error."""
    if name not in TEMPLATES:
        raise ValueError(f"no prompt template {name!r}; known: {', '.join(TEMPLATES)}")
    return environment().get_template(f"{name}.j2").render(**variables)
