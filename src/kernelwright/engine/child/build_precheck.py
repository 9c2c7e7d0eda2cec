"""What can be said of a candidate's C++ sources before any compiler runs: functions it names for
export that its sources never declare, and a module defined twice (torch appends its own block).
Text checks only: a check that is unsure says nothing."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeAlias

# A build call's sources as the candidate passes them: a string or a list of strings (other items are skipped).
_Sources: TypeAlias = str | Iterable[object] | None

_C_GLOBALS = frozenset(n for n in dir(__import__("math")) if not n.startswith("_")) | {
    "abs",
    "printf",
    "malloc",
    "free",
    "rand",
    "srand",
    "exit",
    "abort",
    "memcpy",
    "memset",
    "strlen",
}


def undeclared_functions(cpp_sources: _Sources, functions: str | Iterable[object] | None) -> list[str]:
    """Names in load_inline's `functions` that no C++ source mentions at all.

    torch writes one binding per name into main.cpp, which holds `cpp_sources` and nothing of
    `cuda_sources` (compiled on their own, as cuda.cu): a name the C++ sources never mention is an
    undeclared identifier there, a certain build failure (typically a `__global__` kernel named in
    `functions` with empty `cpp_sources`).
    """
    if not functions:
        return []
    names = [functions] if isinstance(functions, str) else list(functions)  # list, or dict of name -> doc
    cpp_text = "\n".join(_as_list(cpp_sources))
    out = []
    for n in names:
        if not isinstance(n, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or n in _C_GLOBALS:
            continue
        if not re.search(rf"\b{re.escape(n)}\b", cpp_text):
            out.append(n)
    return out


_UNSURE_CPP = re.compile(
    r'\b(u8|u|U|L)?R"[^\s()\\]{0,16}\('  # a raw string literal
    r'|^\s*#\s*include\s*"'
    r"|^\s*#\s*(define|undef)\s+(TORCH_EXTENSION_NAME|PYBIND11_MODULE)\b",
    re.M,
)
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|endif)\b", re.M)


def module_defined_twice(cpp_sources: _Sources, name: str, functions: object) -> bool:
    """Would main.cpp define the extension's module twice? torch appends its own
    `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)` whenever `functions` is given (an empty list too);
    cpp_sources that open a line with one of their own for the same module name, outside any
    `#if`, make `PyInit_<name>` defined twice, a certain compile error. Only where nothing could
    hide or rename it (see `_UNSURE_CPP`)."""
    if functions is None:
        return False
    text = "\n".join(_as_list(cpp_sources))
    if _UNSURE_CPP.search(text):
        return False
    # a backslash-newline joins lines (a macro's body, a string): what follows it starts no line
    text = _COMMENTS.sub(" ", text.replace("\\\n", " "))
    module = rf"(TORCH_EXTENSION_NAME|{re.escape(name)})"
    for block in re.finditer(rf"^\s*PYBIND11_MODULE\s*\(\s*{module}\s*,", text, re.M):
        depth = 0  # the conditionals open where the block starts (an include guard closed before it is 0)
        for c in _CONDITIONAL.finditer(text, 0, block.start()):
            depth += -1 if c.group(1) == "endif" else 1
        if depth == 0:
            return True
    return False


def _as_list(src: _Sources) -> list[str]:
    if not src:
        return []
    return [src] if isinstance(src, str) else [s for s in src if isinstance(s, str)]
