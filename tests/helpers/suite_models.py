"""Scripted Coder and Judge for the suite tests: answers that depend on the prompt (which problem,
which kind of prompt), not on the order of requests, so a suite that is killed and resumed gets
the same answers as one that ran straight through.

Coder: the first prompt of a problem gets `<name>_v1.py`, a repair prompt `<name>_v2.py`, an
optimisation prompt `<name>_v3.py` (tests/fixtures/suite/answers/). Judge: fixed critiques.
"""

from __future__ import annotations

import json

from conftest import FIXTURES
from helpers.chat_server import Reply, Status

ANSWERS = FIXTURES / "suite" / "answers"
NAMES = ("add_one", "scale_shift")
CODER, JUDGE = "suite-coder", "suite-judge"


def _problem(prompt: str) -> str | None:
    for name in NAMES:
        if f"suite fixture {name})" in prompt:
            return name
    for name in NAMES:
        if f'"""{name},' in prompt:
            return name
    return None


def respond(model: str, messages: list[dict]):
    prompt = str(messages[-1]["content"]) if messages else ""
    if model == JUDGE:
        if "failed its evaluation" in prompt:
            body = {
                "critical_issue": "The output differs from the reference.",
                "why_it_matters": "Every element counts.",
                "minimal_fix_hint": "Compute exactly what Model.forward computes.",
            }
        else:
            body = {
                "bottleneck": "two passes over memory",
                "optimisation": "fuse them into one",
                "expected_speedup": "1.2x",
                "why": "one pass instead of two",
            }
        return Reply("```json\n" + json.dumps(body) + "\n```")
    name = _problem(prompt)
    if model != CODER or name is None:
        return Status(400, f"suite_models cannot answer this {model} prompt")
    version = 1 if "Your job is to REWRITE" in prompt else 2 if "Your job is to FIX" in prompt else 3
    return Reply(f"Here is the program.\n\n```python\n{(ANSWERS / f'{name}_v{version}.py').read_text()}```\n")
