"""The extension builds a candidate asks for, read from its text without running it.

A candidate's `load_inline(...)` calls are found with `ast` and their arguments resolved when
they are literals, module-level constants, `+` concatenations, lists/tuples of those, or
`"".join([...])` of those: how KernelBench candidates are written. Such a call can be built by
the trusted builder (`engine/child/trusted_builder.py`), a process that runs no candidate code,
into the shared build cache. A call whose arguments are computed at run time (f-strings, reads
of files, functions) is recorded by a prebuild instead (`child/build_recorder.py` runs the
candidate's module-level code with `load_inline` replaced, sandboxed, no GPU; each call it reports
is checked by `check_recorded`, the same rules as here) and built by the trusted builder too.
A `load(...)` (its sources are files the candidate writes) is recorded the same way, its files read
when the call is made (`check_recorded` allows plain C/C++/CUDA file names only). A call with a flag
outside the allow-list below, and a computed call or `load` no prebuild recorded, are built by the
evaluation itself, in a private directory used once and never published (`engine/child/build.py`).

Flags are allow-listed, because a flag can make the compiler run a program or load a library of
the candidate's choice, or read a file the candidate wrote, in the process that writes the
shared cache. Refused, with why:
- `-fplugin=`, `-fplugin-arg-`: load a shared object into the compiler;
- `-B`, `--compiler-bindir`/`-ccbin`, `-wrapper`, `-specs=`, `-fuse-ld=`, `--use-local-env`,
  `-Xcompiler`/`-Xlinker`/`-Wl,` items that are themselves refused: choose the programs the
  driver runs (the assembler, the linker, the host compiler), or pass the linker `--plugin`,
  `-rpath`, `--wrap` and scripts;
- `@file`, `--options-file`, `-optf`: options read from a file the candidate may have written;
- `-I`, `-isystem`, `-include`, `-imacros`, `-L`, `extra_include_paths` outside the system, CUDA
  and torch directories: headers, libraries or forced includes from a directory the candidate
  can write;
- anything not recognised: the list is an allow-list.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import Any

from kernelwright.core import formats

# load_inline's parameters, in order (torch 2.x); only these are passed on.
INLINE_PARAMS = (
    "name",
    "cpp_sources",
    "cuda_sources",
    "sycl_sources",
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_sycl_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
    "with_sycl",
    "is_python_module",
    "with_pytorch_error_handling",
    "keep_intermediates",
    "use_pch",
    "no_implicit_headers",
)
_STATIC_ONLY = {"sycl_sources": None, "extra_sycl_cflags": None, "with_sycl": None}  # must be absent/None
_IGNORED = ("build_directory", "verbose", "keep_intermediates")  # the builder decides these


@dataclass
class StaticCall:
    """One load_inline call of the candidate, with its arguments resolved."""

    line: int
    kwargs: dict[str, Any]  # load_inline keyword arguments (name, cpp_sources, ...), JSON-able


@dataclass
class Scan:
    calls: list[StaticCall] = field(default_factory=list)  # the trusted builder builds these
    private: list[str] = field(default_factory=list)  # why each other build call is left to the evaluation


class _Unresolved(Exception):
    pass


def scan(text: str) -> Scan:
    """The candidate's build calls: those the trusted builder may build, and why the others may not."""
    out = Scan()
    try:
        tree = formats.parse_python(text)
    except SyntaxError:
        return out
    consts: dict[str, Any] = {}
    for stmt in tree.body:  # module-level NAME = <resolvable>, in order; a later rebinding wins
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                consts[stmt.targets[0].id] = _value(stmt.value, consts)
            except _Unresolved:
                consts.pop(stmt.targets[0].id, None)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fname = _callee(node.func)
        if fname == "load":
            out.private.append(
                f"line {node.lineno}: load(...) builds files the candidate writes (recorded at run time)"
            )
        if fname != "load_inline":
            continue
        try:
            kwargs = _arguments(node, consts)
        except _Unresolved as exc:
            out.private.append(f"line {node.lineno}: load_inline arguments computed at run time ({exc})")
            continue
        problem = flag_problem(kwargs)
        if problem:
            out.private.append(f"line {node.lineno}: {problem}")
            continue
        out.calls.append(StaticCall(node.lineno, kwargs))
    return out


# load()'s parameters (torch 2.x), for a recorded call; its sources come as `load_sources`
LOAD_PARAMS = (
    "name",
    "load_sources",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
    "is_python_module",
    "keep_intermediates",
)
_SOURCE_FILE = re.compile(r"[A-Za-z0-9_][\w.-]*\.(c|cc|cpp|cxx|cu|cuh|h|hpp)")


def _known_plain_named(call: dict[str, Any], params: tuple[str, ...]) -> tuple[dict[str, Any] | None, str]:
    """A recorded call's arguments when each is a known parameter with a plain JSON value and the
    name is a plain identifier (the arguments the builder decides dropped), else (None, why)."""
    kwargs: dict[str, Any] = {}
    for k, v in call.items():
        if k not in params:
            return None, f"unknown argument {k!r}"
        if not _plain(v):
            return None, f"{k} is not plain data"
        kwargs[k] = v
    for k in _IGNORED:
        kwargs.pop(k, None)
    if not isinstance(kwargs.get("name"), str) or not re.fullmatch(r"[A-Za-z_]\w*", kwargs["name"]):
        return None, "the extension name is not a plain identifier"
    return kwargs, ""


def _check_recorded_load(call: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """A recorded `load(name, sources=[files])`: its files as [name, text] pairs (plain names, one
    of each, C/C++/CUDA sources and headers), the other arguments as for load_inline."""
    kwargs, why = _known_plain_named(call, LOAD_PARAMS)
    if kwargs is None:
        return None, why
    files = kwargs.get("load_sources")
    if not isinstance(files, list) or not files or len(files) > 16:
        return None, "load() with no source files (or more than 16)"
    names = []
    for item in files:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            return None, "a load() source is not a [file name, text] pair"
        if not _SOURCE_FILE.fullmatch(item[0]):
            return None, f"load() source {item[0][:60]!r} is not a plain C/C++/CUDA file name"
        names.append(item[0])
    if len(set(names)) != len(names):
        return None, "load() names a source file twice"
    if kwargs.get("is_python_module") is False:
        return None, "is_python_module=False"
    problem = flag_problem(kwargs)
    return (None, problem) if problem else (kwargs, "")


def check_recorded(call: Any) -> tuple[dict[str, Any] | None, str]:
    """A load_inline call recorded from the candidate's running code (`child/build_recorder.py`),
    checked as hostile input: (its keyword arguments, "") when the trusted builder may build it,
    else (None, why). The same rules as a call read from the text: known arguments only, plain
    JSON values, a plain identifier for the name, and the flag allow-list."""
    if not isinstance(call, dict) or not call:
        return None, "not a call"
    if "load_sources" in call:
        return _check_recorded_load(call)
    kwargs, why = _known_plain_named(call, INLINE_PARAMS)
    if kwargs is None:
        return None, why
    for k in _STATIC_ONLY:
        if kwargs.get(k):
            return None, f"{k} is not supported by the trusted builder"
        kwargs.pop(k, None)
    for k in ("cpp_sources", "cuda_sources"):
        v = kwargs.get(k)
        if (
            v is not None
            and not isinstance(v, str)
            and not (isinstance(v, list) and all(isinstance(x, str) for x in v))
        ):
            return None, f"{k} is not a string or a list of strings"
    if "cpp_sources" not in kwargs:
        return None, "no cpp_sources"
    if kwargs.get("is_python_module") is False:
        return None, "is_python_module=False"
    problem = flag_problem(kwargs)
    return (None, problem) if problem else (kwargs, "")


def _plain(v: Any, depth: int = 0) -> bool:
    """JSON-like data: str, bool, int, float, None, lists and str-keyed dicts of those."""
    if depth > 4:
        return False
    if v is None or isinstance(v, (str, bool, int, float)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _arguments(call: ast.Call, consts: dict[str, Any]) -> dict[str, Any]:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise _Unresolved("*args or **kwargs")
    if len(call.args) > len(INLINE_PARAMS):
        raise _Unresolved("too many positional arguments")
    kwargs = {INLINE_PARAMS[i]: _value(a, consts) for i, a in enumerate(call.args)}
    for kw in call.keywords:
        if kw.arg not in INLINE_PARAMS:
            raise _Unresolved(f"unknown argument {kw.arg!r}")
        kwargs[kw.arg] = _value(kw.value, consts)
    for k in _IGNORED:
        kwargs.pop(k, None)
    for k in _STATIC_ONLY:
        if kwargs.get(k):
            raise _Unresolved(f"{k} is not supported by the trusted builder")
        kwargs.pop(k, None)
    if not isinstance(kwargs.get("name"), str) or not re.fullmatch(r"[A-Za-z_]\w*", kwargs["name"]):
        raise _Unresolved("the extension name is not a plain identifier")
    if "cpp_sources" not in kwargs:
        raise _Unresolved("no cpp_sources")
    if kwargs.get("is_python_module") is False:
        raise _Unresolved("is_python_module=False")
    return kwargs


def _value(node: ast.expr, consts: dict[str, Any]) -> Any:
    """The value of a literal expression: constants, names of module constants, +, lists, "".join."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in consts:
            return consts[node.id]
        raise _Unresolved(f"{node.id} is not a module-level constant")
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, consts) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, consts), _value(node.right, consts)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        raise _Unresolved("+ of mixed types")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
        and len(node.args) == 1
        and not node.keywords
    ):
        parts = _value(node.args[0], consts)
        if isinstance(parts, list) and all(isinstance(p, str) for p in parts):
            return node.func.value.value.join(parts)
    raise _Unresolved(f"{type(node).__name__} at line {getattr(node, 'lineno', '?')}")


# ---- the flag allow-list ----------------------------------------------------------------------

_CXX_OK = re.compile(
    r"-O[0-3s]|-Ofast|-Og|-g[0-3]?|-std=(?:c|gnu)\+\+\d\w|-D\w+(?:=[\w.+\-\"']*)?|-U\w+|-w|"
    r"-W(?:no-)?[a-z][\w\-]*(?:=\w+)?|-Werror|-pedantic|-march=[\w\-]+|-mtune=[\w\-]+|-mcpu=[\w\-]+|"
    r"-m(?:no-)?(?:avx\w*|fma|sse[\w.]*|f16c|bmi2?|popcnt|lzcnt|amx\w*|prefer-vector-width=\d+)|"
    r"-f(?:no-)?(?:fast-math|unroll-loops|unroll-all-loops|openmp|openmp-simd|PIC|pic|strict-aliasing|"
    r"omit-frame-pointer|tree-vectorize|finite-math-only|vectorize|slp-vectorize|math-errno|"
    r"rounding-math|signed-zeros|trapping-math|associative-math|reciprocal-math|inline-functions|"
    r"permissive|exceptions|rtti|visibility-inlines-hidden|diagnostics-color|"
    r"stack-protector(?:-strong|-all)?|lto|ipa-\w+)|"
    r"-fvisibility=\w+|-ffp-contract=\w+|-fopenmp-version=\d+|-fabi-version=\d+|-fmax-errors=\d+"
)
_NVCC_OK = re.compile(
    r"-O[0-3]|--?use_fast_math|-lineinfo|--?generate-line-info|-g|-G|--?expt-relaxed-constexpr|"
    r"--?expt-extended-lambda|--?extended-lambda|-std=c\+\+\d\w|-arch=(?:sm|compute)_\d+[af]?|"
    r"-gencode=arch=compute_\d+[af]?,code=\[?(?:sm|compute)_\d+[af]?(?:,(?:sm|compute)_\d+[af]?)*\]?|"
    r"--?gpu-architecture=(?:sm|compute)_\d+[af]?|-code=(?:sm|compute)_\d+[af]?|"
    r"--?maxrregcount=\d+|--?ftz=(?:true|false)|--?prec-div=(?:true|false)|--?prec-sqrt=(?:true|false)|"
    r"--?fmad=(?:true|false)|--?restrict|-res-usage|--?resource-usage|-D\w+(?:=[\w.+\-\"']*)?|-U\w+|"
    r"-w|--?disable-warnings|-Wno-deprecated-gpu-targets|--?default-stream[= ](?:per-thread|legacy)|"
    r"-t\d+|--?threads[= ]\d+|--?diag-suppress=[\d,]+|-Xptxas=[\w\-,=]+|--ptxas-options=[\w\-,=]+|"
    r"--?split-compile=\d+|--?relocatable-device-code=(?:true|false)|-rdc=(?:true|false)|"
    r"-U__CUDA_NO_\w+__|-D__CUDA_NO_\w+__"
)
_LD_OK = re.compile(
    r"-l(?:cuda|cudart|cublas|cublasLt|curand|cusparse|cufft|cusolver|nvrtc|nvToolsExt|"
    r"cudnn|m|gomp|pthread|dl|rt|c10|c10_cuda|torch|torch_cpu|torch_cuda|torch_python)"
)
_NEEDS_VALUE = {"-Xcompiler", "-Xptxas", "--compiler-options", "-Xlinker", "-I", "-isystem", "-L"}


def allowed_dirs() -> list[str]:
    """Directories an include or library path may name: the system's, CUDA's and torch's (found without importing torch)."""  # noqa: E501
    dirs = ["/usr/include", "/usr/local/include", "/usr/lib", "/usr/local/cuda", "/opt/nvidia"]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        dirs.append(cuda_home)
    spec = importlib.util.find_spec("torch")
    if spec and spec.origin:
        dirs.append(os.path.dirname(spec.origin))
    for mod in ("nvidia", "triton", "cutlass"):  # wheel-installed CUDA libraries and headers
        spec = importlib.util.find_spec(mod)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(loc)
    return [os.path.realpath(d) for d in dirs]


def _dir_ok(path: str) -> bool:
    real = os.path.realpath(path)
    return os.path.isabs(path) and any(real == d or real.startswith(d + "/") for d in allowed_dirs())


def flag_problem(kwargs: dict[str, Any]) -> str:
    """'' when every flag and path of a load_inline call is on the allow-list, else why not (one line)."""
    for key, pattern in (("extra_cflags", _CXX_OK), ("extra_cuda_cflags", _NVCC_OK), ("extra_ldflags", _LD_OK)):
        flags = kwargs.get(key) or []
        if isinstance(flags, str):
            flags = [flags]
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            return f"{key} is not a list of strings"
        i = 0
        while i < len(flags):
            flag = flags[i].strip()
            if not flag:  # load_inline(extra_ldflags=[""]) is common and harmless
                i += 1
                continue
            if flag in _NEEDS_VALUE and i + 1 < len(flags):  # "-Xcompiler", "-O3" as two items
                flag, i = flag + "=" + flags[i + 1].strip(), i + 1
            why = _refused(flag, pattern)
            if why:
                return f"{key} flag {flag!r} is not allowed in a shared build: {why}"
            i += 1
    paths = kwargs.get("extra_include_paths") or []
    for p in [paths] if isinstance(paths, str) else paths:
        if not isinstance(p, str) or not _dir_ok(p):
            return (
                f"extra_include_paths {p!r} is outside the system, CUDA and torch directories "
                "(headers from a directory the candidate can write)"
            )
    return ""


_REFUSED = [
    (re.compile(r"-fplugin"), "loads a shared object into the compiler"),
    (
        re.compile(
            r"-B|--compiler-bindir|-ccbin|-wrapper|-specs|-fuse-ld|--use-local-env|-no-integrated-as|"
            r"--dryrun|-save-temps|--keep"
        ),
        "chooses or wraps the programs the compiler driver runs",
    ),
    (re.compile(r"@|--options-file|-optf"), "reads options from a file the candidate may have written"),
    (re.compile(r"-Wl,|-Xlinker|--linker-options"), "passes options to the linker (plugins, -rpath, scripts)"),
    (
        re.compile(r"-include|-imacros|-I|-isystem|-iquote|-idirafter|-L"),
        "a path outside the system, CUDA and torch directories",
    ),
]


def _refused(flag: str, pattern: re.Pattern) -> str:
    for prefix in ("-Xcompiler=", "--compiler-options=", "-Xcompiler "):
        if flag.startswith(prefix):  # host-compiler flags through nvcc: each checked as a C++ flag
            for item in flag[len(prefix) :].split(","):
                why = _refused(item.strip(), _CXX_OK)
                if why:
                    return f"-Xcompiler {item.strip()!r}: {why}"
            return ""
    for prefix in ("-I", "-isystem", "-L"):
        if flag.startswith(prefix):
            path = flag[len(prefix) :].lstrip("= ")
            return "" if path and _dir_ok(path) else "a path outside the system, CUDA and torch directories"
    if pattern.fullmatch(flag):
        return ""
    for bad, why in _REFUSED:
        if bad.match(flag):
            return why
    return "not on the allow-list of compiler flags (engine/extensions/static_builds.py)"
