"""Prompt templates (Jinja, StrictUndefined): the Coder's first, repair and optimisation prompts,
and the Judge's failure and performance prompts, each with CUDA, Triton and CPU C++ variants.

A user's folder of `.j2` files (`[model] prompt_dir` in the settings file) replaces the bundled
templates of the same names, partials (`_backend.j2`, `_evidence.j2`) included; the templates it
does not hold stay the bundled ones. Copy a bundled file from this folder to start from it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

TEMPLATE_DIR = Path(__file__).resolve().parent
TEMPLATES = ("coder_first", "coder_repair", "coder_optimise", "llm_judge_failure", "llm_judge_performance")
# Templates that had another name: a prompt folder that still uses it is told the new one.
RENAMED = {"judge_failure.j2": "llm_judge_failure.j2", "judge_performance.j2": "llm_judge_performance.j2"}


class PromptDirError(ValueError):
    """The prompt folder cannot be used. One line naming the fix."""


def bundled() -> list[str]:
    """The file names a prompt folder may replace."""
    return sorted(p.name for p in TEMPLATE_DIR.glob("*.j2"))


def check_prompt_dir(prompt_dir: str | Path) -> Path:
    """The folder, checked: it exists and every .j2 in it replaces a bundled template (a typo in a
    file name would otherwise be silently ignored)."""
    folder = Path(prompt_dir).expanduser()
    if not folder.is_dir():
        raise PromptDirError(f"prompt folder {folder} not found; set model.prompt_dir to a folder of .j2 files")
    known = set(bundled())
    unknown = sorted(p.name for p in folder.glob("*.j2") if p.name not in known)
    renamed = [f"{name} to {RENAMED[name]}" for name in unknown if name in RENAMED]
    if renamed:
        raise PromptDirError(f"prompt folder {folder}: rename {', '.join(renamed)} (the LLM Judge's templates)")
    if unknown:
        raise PromptDirError(
            f"prompt folder {folder}: {', '.join(unknown)} replace no template; "
            f"name files after the bundled ones: {', '.join(sorted(known))}"
        )
    return folder


@lru_cache(maxsize=8)
def environment(prompt_dir: str | None = None) -> jinja2.Environment:
    folders = [str(check_prompt_dir(prompt_dir))] if prompt_dir else []
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([*folders, str(TEMPLATE_DIR)]),  # the user's first, then the bundled
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(name: str, prompt_dir: str | None = None, **variables) -> str:
    """Render `name.j2` (from `prompt_dir` when it holds one); a variable the template uses but the
    caller did not pass is an error."""
    if name not in TEMPLATES:
        raise ValueError(f"no prompt template {name!r}; known: {', '.join(TEMPLATES)}")
    return environment(str(prompt_dir) if prompt_dir else None).get_template(f"{name}.j2").render(**variables)
