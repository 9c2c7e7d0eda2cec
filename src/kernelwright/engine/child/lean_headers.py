"""Lean torch headers for a candidate's CUDA sources: the build-speed rewrite of `cuda.cu`.

`load_inline` starts `cuda.cu` with `#include <torch/types.h>` and candidates usually add
`#include <torch/extension.h>`. Those pull in every ATen operator's declarations, autograd and
(for extension.h) torch's C++ frontend and pybind11, and nvcc parses that text three times
(host preprocessing, the device front end `cicc`, the host front end `cudafe++`, then gcc):
most of a one-kernel build's minute. The host code of a kernel file uses a handful of things:
`at::Tensor` and its methods, `TORCH_CHECK`, a few factory functions (`torch::empty_like`),
maybe `AT_DISPATCH_*` and the current stream.

`lean_cuda_sources` gives the same sources with those umbrella headers replaced by
`<ATen/core/Tensor.h>`, one `<ATen/ops/NAME.h>` per torch/ATen function the source calls (the
per-operator headers PyTorch compiles its own kernels with), `<ATen/Dispatch.h>` where a dispatch
macro appears, and torch's own `namespace torch { using namespace at; ... }` block copied from
the installed `<torch/types.h>`. Everything else in the source is left as written, line for line.
It returns None where the rewrite does not apply (Python bindings, torch's C++ frontend, operator
registration in the CUDA source). The build falls back to the source as written when the lean
build fails, so the rewrite can make a build faster, never make it fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# umbrella headers that the lean set stands in for
_UMBRELLA = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch/extension\.h|torch/torch\.h|torch/all\.h|torch/types\.h|'
    r'ATen/ATen\.h|ATen/Functions\.h)[>"][^\n]*$',
    re.M,
)
# constructs that need what only the umbrella headers declare: bindings, the C++ frontend, registration
_NOT_LEAN = re.compile(
    r"PYBIND11|pybind11|\bpy::|torch::(?:nn|optim|jit|autograd|data|serialize|python|Library|library)\b|"
    r"TORCH_LIBRARY|TORCH_MODULE|torch/python\.h|torch/script\.h|at::native::|torch::stable"
)
_QUALIFIED_CALL = re.compile(r"\b(?:torch|at)::([A-Za-z_]\w*)\s*[(<]")
_ANY_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_USING_NS = re.compile(r"\busing\s+namespace\s+(?:torch|at)\s*;")
_TORCH_NS_BLOCK = re.compile(r"^namespace torch \{\n(.*?)^\} // namespace torch", re.M | re.S)

MARK = "// kernelwright lean headers"


@dataclass
class LeanSources:
    cuda_sources: list[str]  # to build with load_inline(no_implicit_headers=True)
    op_headers: list[str]  # the per-operator headers included, for the record


def _torch_namespace_block(include_dir: Path) -> str | None:
    """The `namespace torch { ... }` block of the installed <torch/types.h> (aliases and kX constants)."""
    path = include_dir / "torch" / "csrc" / "api" / "include" / "torch" / "types.h"
    try:
        m = _TORCH_NS_BLOCK.search(path.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def lean_cuda_sources(cuda_sources: list[str], include_dir: Path) -> LeanSources | None:
    """The CUDA sources with lean torch headers, or None where the rewrite does not apply."""
    text = "\n".join(cuda_sources)
    if not text.strip() or _NOT_LEAN.search(text) or MARK in text:
        return None
    ns_block = _torch_namespace_block(include_dir)
    ops_dir = include_dir / "ATen" / "ops"
    if ns_block is None or not (include_dir / "ATen" / "core" / "Tensor.h").is_file() or not ops_dir.is_dir():
        return None
    names = set(_QUALIFIED_CALL.findall(text))
    if _USING_NS.search(text):  # unqualified calls may be torch functions too
        names |= set(_ANY_CALL.findall(text))
    ops = sorted(n for n in names if (ops_dir / f"{n}.h").is_file())
    prelude = [
        f"{MARK}: <torch/types.h> and <torch/extension.h> replaced by what this source uses "
        "(BuildConfig.lean_headers=False builds it as written)",
        "#include <cuda.h>",
        "#include <cuda_runtime.h>",
        "#include <ATen/core/Tensor.h>",
        "#include <c10/core/TensorOptions.h>",
        "#include <c10/util/Exception.h>",
    ]
    if "AT_DISPATCH" in text:
        prelude.append("#include <ATen/Dispatch.h>")
    prelude += [f"#include <ATen/ops/{op}.h>" for op in ops]
    # torch's aliases and kX constants; unused ones would warn here (they are in a system header upstream)
    prelude += [
        "#pragma nv_diag_suppress 177",
        "namespace torch {",
        ns_block.rstrip(),
        "} // namespace torch",
        "#pragma nv_diag_default 177",
    ]
    # each umbrella include becomes a comment on its own line: the candidate's lines keep their numbers
    body = [_UMBRELLA.sub(lambda m: "// (lean) " + m.group(0).strip(), s) for s in cuda_sources]
    return LeanSources(cuda_sources=["\n".join(prelude)] + body, op_headers=ops)
