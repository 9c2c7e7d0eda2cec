"""Whose kernel is it: the candidate's own, or PyTorch's (with the libraries PyTorch calls)?

Standard library only: both the child (torch.profiler) and the parent (ncu) classify names.

Evidence, strongest first:
1. The kernel's base name (no namespaces, template arguments or parameters) is a kernel the
   candidate defines: a `__global__` function in its CUDA sources, or a `@triton.jit` function.
2. The name carries a namespace or prefix of PyTorch or a library it calls (at::native, c10,
   cuBLAS/cuBLASLt, cuDNN, CUTLASS in cuBLAS, cub/thrust, torch.compile's Triton kernels,
   FlashAttention inside PyTorch, memcpy/memset).
3. The mangled identifier occurs in one of the candidate's built extension binaries.
Otherwise the origin is "unknown".

A candidate kernel that happens to share a base name with a PyTorch kernel is still PyTorch's
when its full name carries a PyTorch namespace (rule 2 before a bare rule-1 match).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

CANDIDATE = "candidate"
PYTORCH = "pytorch"
UNKNOWN = "unknown"

# Namespaces / prefixes of kernels that PyTorch (or a library it calls) launches.
_PYTORCH_PATTERNS = [
    r"\bat::",
    r"\bc10::",
    r"\btorch::",
    r"\bat_cuda_detail::",
    r"\bpytorch_flash::",
    r"\bfmha_",
    r"\bcutlass::",
    r"\bcutlass3x_",
    r"\bcublas",
    r"\bcublasLt",
    r"\bcudnn",
    r"\bcub::",
    r"\bthrust::",
    r"^nvjet_",
    r"\bnvjet_",
    r"\bsm\d+_xmma_",
    r"^(?:ampere|volta|turing|hopper|sm\d+)_[sdhb]?gemm",
    r"^(?:ampere|volta|turing|hopper)_",
    r"\bgemv2?[NT]?_kernel",
    r"\bgemvx?_kernel",
    r"\bsplitKreduce_kernel",
    r"\bgemmk1_kernel",
    r"\bdot_kernel\b",
    r"\breduce_1Block_kernel",
    r"\bscal_kernel",
    r"\baxpy_kernel",
    r"^triton_(?:poi|red|per|tem|for|mm|bmm)_",
    r"^triton__",
    r"^Memcpy",
    r"^Memset",
    r"^\[?memcpy",
    r"^\[?memset",
    r"\bxmma_",
    r"^void (?:at|c10|cub|thrust)::",
    r"\bflash_fwd",
    r"\bflash_bwd",
    r"\bmemory_efficient_attention",
    r"\bnchwToNhwc",
    r"\bnhwcToNchw",
    r"\bimplicit_convolve",
    r"\bcask_",
    r"\bgeneric_elementwise_kernel",
]
_PYTORCH_RE = re.compile("|".join(f"(?:{p})" for p in _PYTORCH_PATTERNS))

# Kernel definitions in candidate source text.
_GLOBAL_RE = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+|inline\s+|__forceinline__\s+)*"
    r"void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)
_TRITON_RE = re.compile(
    r"@triton\.(?:jit|autotune|heuristics)\b[^\n]*\n(?:\s*@[^\n]*\n|\s*[^\n]*\)\s*\n)*?\s*def\s+(\w+)"
)
_CPU_OP_PREFIX = "kw::candidate:"  # the child's label around calls into the candidate's extensions


def _demangle_head(name: str) -> str | None:
    """The function's own identifier from an Itanium-mangled name: `_Z19swish_kernelPKf` -> `swish_kernel`."""
    if not name.startswith("_Z"):
        return None
    i = 2 + (1 if name[2:3] == "N" else 0)
    last = None
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        last = name[j : j + n]
        i = j + n
        if name[1:3] != "ZN":  # not nested: one identifier only
            break
    return last


def base_name(kernel_name: str) -> str:
    """`void ns::foo<128, float>(float const*, int)` -> `foo`; `foo_kernel` stays `foo_kernel`;
    a mangled `_Z7foo_ker...` -> `foo_ker`."""
    name = kernel_name.strip()
    head = _demangle_head(name)
    if head:
        return head
    # drop the parameter list (the last balanced parenthesis group at the end)
    depth = 0
    cut = len(name)
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    if cut < len(name) and name.endswith(")"):
        name = name[:cut]
    # drop template arguments
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    name = name.split(" ")[-1] if " " in name else name  # return type: "void foo" -> "foo"
    return name.split("::")[-1]


def candidate_kernel_names(texts: Iterable[str]) -> set[str]:
    """Names of the kernels a candidate defines in its sources (CUDA `__global__`, Triton `@jit`)."""
    names: set[str] = set()
    for text in texts:
        if not text:
            continue
        names.update(_GLOBAL_RE.findall(text))
        names.update(_TRITON_RE.findall(text))
    return names


def binary_has_symbol(binaries: Iterable[bytes], identifier: str) -> bool:
    """The Itanium-mangled form of the identifier (`<len><name>`) occurs in one of the binaries."""
    if not identifier or not re.fullmatch(r"\w+", identifier):
        return False
    needle = f"{len(identifier)}{identifier}".encode()
    return any(needle in b for b in binaries)


def classify(
    name: str, candidate_kernels: set[str] | frozenset[str] = frozenset(), binaries: Iterable[bytes] = ()
) -> str:
    """Origin of a kernel (or CPU op) name: "candidate", "pytorch" or "unknown"."""
    if name.startswith(_CPU_OP_PREFIX):
        return CANDIDATE
    if name.startswith("aten::") or name.startswith("prim::") or name.startswith("c10d::"):
        return PYTORCH
    base = base_name(name)
    if _PYTORCH_RE.search(name):
        return PYTORCH
    if base in candidate_kernels:
        return CANDIDATE
    if binaries and binary_has_symbol(binaries, base):
        return CANDIDATE
    return UNKNOWN


def read_binaries(paths: Iterable[str | Path], limit_bytes: int = 256 * 2**20) -> list[bytes]:
    """The bytes of the candidate's built extensions (`*.so` in its build directories)."""
    out: list[bytes] = []
    total = 0
    for p in paths:
        for so in sorted(Path(p).glob("*.so")) if Path(p).is_dir() else [Path(p)]:
            try:
                data = so.read_bytes()
            except OSError:
                continue
            total += len(data)
            if total > limit_bytes:
                return out
            out.append(data)
    return out


def cpu_op_label(module_name: str, function: str) -> str:
    return f"{_CPU_OP_PREFIX}{module_name}.{function}"


def candidate_texts(candidate_path: str | None, build_dirs: Iterable[str]) -> list[str]:
    """The candidate's file and the sources generated into its build directories."""
    texts = []
    paths = [Path(candidate_path)] if candidate_path else []
    for d in build_dirs:
        p = Path(d)
        if p.is_dir():
            paths += [f for f in p.iterdir() if f.suffix in (".cu", ".cpp", ".cuh", ".h")]
    for p in paths:
        try:
            texts.append(p.read_text(errors="replace"))
        except OSError:
            pass
    return texts
