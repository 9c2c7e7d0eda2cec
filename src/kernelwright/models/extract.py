"""Reading model answers: the Coder's code block (checked against the output rules) and the
Judge's JSON verdict.

A Coder answer that breaks the rules (no code block, sections out of order, test code,
`if __name__ == "__main__":`, code that does not parse) becomes a `format_error` here, before
any evaluation is spent on it.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from kernelwright.core.formats import parse_python

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)
TEST_FUNCTIONS = {"get_inputs", "get_init_inputs"}
PYTHON_TAGS = {"", "python", "py", "python3"}


class OutputRuleError(ValueError):
    """The answer breaks the output rules. The message says which rule, in one line; `code` is the
    code block that broke them (None when the answer held none)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


def code_blocks(text: str) -> list[str]:
    """The fenced Python (or untagged) blocks of an answer, in order; empty ones left out."""
    blocks = []
    for m in FENCE.finditer(text):
        if m.group(1).lower() in PYTHON_TAGS and m.group(2).strip():
            blocks.append(m.group(2).strip("\n") + "\n")
    return blocks


def extract_code(text: str, backend: str) -> str:
    """The candidate in the answer, checked; raises OutputRuleError naming the broken rule."""
    blocks = code_blocks(text)
    if not blocks:
        raise OutputRuleError("no code block: the answer must hold the whole program in one ```python block")
    with_model = [b for b in blocks if re.search(r"^class\s+ModelNew\b", b, re.M)]
    if len(with_model) > 1:
        raise OutputRuleError(f"{len(with_model)} code blocks define ModelNew: answer with exactly one code block")
    code = with_model[0] if with_model else max(blocks, key=len)
    try:
        check_rules(code, backend)
    except OutputRuleError as exc:
        raise OutputRuleError(str(exc), code) from None
    return code


def check_rules(code: str, backend: str) -> None:
    try:
        tree = parse_python(code)
    except SyntaxError as exc:
        raise OutputRuleError(f"the code block is not valid Python (line {exc.lineno}: {exc.msg})") from None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            raise OutputRuleError(f'`if __name__ == "__main__":` at line {node.lineno}: no testing code in the answer')
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.name.startswith("test") or node.name in TEST_FUNCTIONS
        ):
            raise OutputRuleError(
                f"testing code: def {node.name} at line {node.lineno}; leave inputs and tests to the evaluator"
            )
        if isinstance(node, ast.Assert):
            raise OutputRuleError(f"testing code: a top-level assert at line {node.lineno}")
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not _is_build_call(node.value):
            raise OutputRuleError(
                f"testing code: a top-level call `{ast.unparse(node.value.func)}(...)` at line {node.lineno}; "
                "only imports, sources, load_inline and definitions run on import"
            )
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise OutputRuleError("no class ModelNew in the code block: define class ModelNew(nn.Module)")
    _check_order(tree, backend)


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__") or (
        isinstance(test, ast.Compare) and any(isinstance(c, ast.Name) and c.id == "__name__" for c in test.comparators)
    )


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else "")


SETUP_CALL_PREFIXES = ("os.environ", "warnings.", "torch.backends.", "torch.set_float32_matmul_precision")


def _is_build_call(call: ast.Call) -> bool:
    """Calls allowed at the top level: extension builds and environment set-up, nothing that tests."""
    return _call_name(call) in ("load_inline", "load") or ast.unparse(call.func).startswith(SETUP_CALL_PREFIXES)


def _sections(tree: ast.Module, backend: str) -> list[tuple[str, int]]:
    """(section, line of its first appearance) for the sections the rules put in order."""
    first: dict[str, int] = {}

    def seen(name: str, line: int) -> None:
        first.setdefault(name, line)

    for node in tree.body:
        line = node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue  # imports are checked below: none may come after the code that needs them
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            seen("class ModelNew", line)
        elif isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            seen("@triton.jit kernels", line)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if "source" in names:
                seen("source", line)
            if "cpp_src" in names:
                seen("cpp_src", line)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and _call_name(sub) == "load_inline" and not isinstance(node, ast.ClassDef):
                seen("load_inline", line)
    order = {
        "cuda": ["source", "cpp_src", "load_inline", "class ModelNew"],
        "cpp": ["cpp_src", "load_inline", "class ModelNew"],
        "triton": ["@triton.jit kernels", "class ModelNew"],
    }[backend]
    return [(name, first[name]) for name in order if name in first]


def _check_order(tree: ast.Module, backend: str) -> None:
    present = _sections(tree, backend)
    for (a, la), (b, lb) in zip(present, present[1:], strict=False):
        if lb < la:
            raise OutputRuleError(
                f"sections out of order: {b} (line {lb}) comes before {a} (line {la}); "
                f"the order is {', '.join(n for n, _ in present)}"
            )
    if present:
        first_code = min(line for _, line in present)
        late = [n.lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno > first_code]
        if late:
            raise OutputRuleError(
                f"sections out of order: an import at line {late[0]} comes after the code; imports go first"
            )


# ---- the Judge's answer --------------------------------------------------------------------


@dataclass
class FailureCritique:
    critical_issue: str
    why_it_matters: str
    minimal_fix_hint: str


@dataclass
class PerformanceCritique:
    """The Judge's answer on a correct candidate. `expected_speedup` is the factor it expects over the
    candidate it reviewed (None when its answer gave no number); `expected_text` is its own words."""

    bottleneck: str
    optimisation: str
    expected_speedup: float | None
    expected_text: str = ""


ALIASES = {"optimization": "optimisation", "expected_effect": "expected_speedup", "fix_hint": "minimal_fix_hint"}
REQUIRED = {
    FailureCritique: ("critical_issue", "why_it_matters", "minimal_fix_hint"),
    PerformanceCritique: ("bottleneck", "optimisation", "expected_speedup"),
}
_NUM = r"(\d+(?:\.\d+)?|\.\d+)"
_RANGE_X = re.compile(_NUM + r"\s*x?\s*(?:-|–|to)\s*" + _NUM + r"\s*[x×]", re.I)
_FACTOR = re.compile(_NUM + r"\s*[x×](?![a-z])", re.I)
_PERCENT = re.compile(_NUM + r"\s*%\s*faster", re.I)
_BARE = re.compile(r"\s*~?\s*" + _NUM + r"\s*$")


class JudgeParseError(ValueError):
    """The Judge's answer holds no JSON object with the required fields."""


def parse_judge(
    text: str, kind: type[FailureCritique] | type[PerformanceCritique]
) -> FailureCritique | PerformanceCritique:
    """The Judge's verdict from its answer: a JSON object, possibly fenced or wrapped in prose."""
    wanted = REQUIRED[kind]
    for obj in _json_objects(text):
        found = {ALIASES.get(k, k): v for k, v in obj.items()}
        if all(k in found for k in wanted):
            if kind is PerformanceCritique:
                raw = found["expected_speedup"]
                why = found.get("why") or found.get("reason")
                words = "; ".join(
                    w for w in (raw.strip() if isinstance(raw, str) else "", _as_text(why) if why else "") if w
                )
                return PerformanceCritique(
                    _as_text(found["bottleneck"]), _as_text(found["optimisation"]), parse_speedup(raw), words
                )
            return FailureCritique(**{k: _as_text(found[k]) for k in wanted})  # the other kind
    raise JudgeParseError(f"the Judge's answer holds no JSON object with the fields {', '.join(wanted)}")


def parse_speedup(value: Any) -> float | None:
    """The speedup factor in a Judge's `expected_speedup`: a number (1.5), "1.5x", "~2x over this",
    a range "1.1x to 1.3x" (its midpoint), "30% faster" (1.3). None when it names no factor
    ("several x", "unknown") or one that is not positive."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if m := _RANGE_X.search(text):
            number = (float(m.group(1)) + float(m.group(2))) / 2
        elif m := _FACTOR.search(text):
            number = float(m.group(1))
        elif m := _PERCENT.search(text):
            number = 1 + float(m.group(1)) / 100
        elif m := _BARE.match(text):
            number = float(m.group(1))
        else:
            return None
    else:
        return None
    return number if number > 0 and number == number and number != float("inf") else None


def _as_text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value)


def _json_objects(text: str):
    """Every top-level {...} in the text that parses as a JSON object, fenced blocks first."""
    candidates = [m.group(2) for m in FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for chunk in candidates:
        i = chunk.find("{")
        while i != -1:
            try:
                obj, end = decoder.raw_decode(chunk, i)
            except ValueError:
                i = chunk.find("{", i + 1)
                continue
            if isinstance(obj, dict):
                yield obj
            i = chunk.find("{", end)
