"""Lean torch headers for CUDA sources: what the rewrite does, where it does not apply, and the
build's fallback to the source as written (the build itself is faked: no GPU torch in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_ext

from conftest import EXAMPLES
from kernelwright.engine.child import build
from kernelwright.engine.child.lean_headers import MARK, lean_cuda_sources

INCLUDE = Path(cpp_ext._TORCH_PATH) / "include"


def example_source() -> str:
    text = (EXAMPLES / "cuda_swish" / "candidate.py").read_text()
    return re.search(r'source = r"""(.*?)"""', text, re.S).group(1)


def test_umbrella_headers_give_way_to_the_ops_the_source_calls():
    src = example_source()
    lean = lean_cuda_sources([src], INCLUDE)
    assert lean is not None and lean.op_headers == ["empty_like"]
    prelude, body = lean.cuda_sources
    assert MARK in prelude and "#include <ATen/core/Tensor.h>" in prelude
    assert "#include <ATen/ops/empty_like.h>" in prelude
    assert "using namespace at;" in prelude and "kFloat32" in prelude  # torch's own namespace block
    assert "#include <torch/extension.h>" not in body.replace("// (lean) #include <torch/extension.h>", "")
    assert "#include <ATen/cuda/CUDAContext.h>" in body  # everything else as written
    assert body.count("\n") == src.count("\n")  # the candidate's lines keep their numbers


def test_unqualified_calls_count_under_using_namespace_torch():
    src = "#include <torch/extension.h>\nusing namespace torch;\nTensor f(Tensor x) { return zeros_like(x); }\n"
    lean = lean_cuda_sources([src], INCLUDE)
    assert lean is not None and "zeros_like" in lean.op_headers
    assert "AT_DISPATCH" not in lean.cuda_sources[0]


def test_dispatch_macros_get_their_header():
    src = (
        "#include <torch/extension.h>\n"
        'void f(at::Tensor x) { AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] {}); }\n'
    )
    assert "#include <ATen/Dispatch.h>" in lean_cuda_sources([src], INCLUDE).cuda_sources[0]


@pytest.mark.parametrize(
    "src",
    [
        "#include <torch/extension.h>\nPYBIND11_MODULE(m, m) {}\n",
        "#include <torch/extension.h>\nauto f(torch::Tensor x) { return torch::nn::functional::relu(x); }\n",
        "#include <torch/extension.h>\nTORCH_LIBRARY(my, m) {}\n",
        "",
    ],
)
def test_bindings_frontend_and_registration_are_left_as_written(src):
    assert lean_cuda_sources([src], INCLUDE) is None


# ---- the build wiring, with torch's load_inline faked -----------------------------------------------


class FakeInline:
    """Stands in for torch's load_inline: a lean build (no_implicit_headers) fails when told to."""

    def __init__(self, lean_fails: bool):
        self.lean_fails = lean_fails
        self.calls: list[dict] = []

    def __call__(
        self,
        name,
        cpp_sources,
        cuda_sources=None,
        functions=None,
        no_implicit_headers=False,
        build_directory=None,
        **kwargs,
    ):
        self.calls.append(
            {"lean": no_implicit_headers, "cpp": cpp_sources, "cuda": cuda_sources, "dir": build_directory}
        )
        if no_implicit_headers and self.lean_fails:
            raise RuntimeError(
                f'Error building extension \'{name}\': cuda.cu(9): error: namespace "torch" has no member "indexing"'
            )
        Path(build_directory, f"{name}.so").write_text("")  # what the cache looks for next time
        return type("Module", (), {"run": staticmethod(lambda x: x)})()


@pytest.fixture
def fake_inline(monkeypatch, tmp_path):
    def install(lean_fails: bool) -> FakeInline:
        fake = FakeInline(lean_fails)
        monkeypatch.setattr(cpp_ext, "load_inline", fake)
        monkeypatch.setattr(cpp_ext, "load", cpp_ext.load)  # restored after the test, like load_inline
        if hasattr(cpp_ext, "remove_extension_h_precompiler_headers"):
            monkeypatch.setattr(
                cpp_ext, "remove_extension_h_precompiler_headers", cpp_ext.remove_extension_h_precompiler_headers
            )
        monkeypatch.setattr(build, "BUILD_LOG", [])
        monkeypatch.setattr(build, "BUILT_MODULES", [])
        build.install_build_cache(tmp_path / "builds", None, use_pch=False, lean_headers=True)
        return fake

    return install


def test_a_lean_build_that_succeeds_is_the_build(fake_inline):
    fake = fake_inline(lean_fails=False)
    cpp_ext.load_inline(
        name="ext", cpp_sources="at::Tensor run(at::Tensor x);", cuda_sources=example_source(), functions=["run"]
    )
    assert [c["lean"] for c in fake.calls] == [True]
    assert fake.calls[0]["cpp"][0] == "#include <torch/extension.h>"  # the bindings keep their header
    (entry,) = build.BUILD_LOG
    assert entry["ok"] and entry["lean_headers"] == {"used": True, "op_headers": ["empty_like"]}


def test_a_failed_lean_build_falls_back_and_is_remembered(fake_inline):
    fake = fake_inline(lean_fails=True)
    call = dict(
        name="ext", cpp_sources="at::Tensor run(at::Tensor x);", cuda_sources=example_source(), functions=["run"]
    )
    cpp_ext.load_inline(**call)
    assert [c["lean"] for c in fake.calls] == [True, False]  # lean, then as written
    (entry,) = build.BUILD_LOG  # the lean failure is not the candidate's build error
    assert entry["ok"] and entry["lean_headers"]["used"] is False
    assert "has no member" in entry["lean_headers"]["reason"]
    assert fake.calls[1]["cuda"] == call["cuda_sources"]  # the source as written, untouched
    cpp_ext.load_inline(**call)  # the same source again: no second lean attempt
    assert [c["lean"] for c in fake.calls] == [True, False, False]
    assert "earlier lean build" in build.BUILD_LOG[-1]["lean_headers"]["reason"]
