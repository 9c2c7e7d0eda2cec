"""One rule for builds the candidate catches (docs/VERDICTS.md): however a build call fails (the
compiler, the precheck, or a module that built but cannot be imported), it is a compile_error,
and a candidate that catches the failure and falls back to PyTorch does not pass with its
fallback. An extension with an undefined symbol builds (the trusted builder never imports what
it builds) and fails when the evaluation loads it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import ADD_ONE, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

BF = FIXTURES / "builds"


@pytest.mark.slow
@pytest.mark.parametrize("trusted_cache", [True, False])
def test_a_module_that_cannot_be_imported_is_a_compile_error_caught_or_not(cpu_config, trusted_cache):
    cfg = cpu_config
    cfg.build.trusted_cache = trusted_cache  # loaded from the trusted cache, or built and loaded by the evaluation
    caught = evaluate(ADD_ONE, BF / "cpp_undefined_symbol_fallback.py", cfg)
    assert caught.status is Status.COMPILE_ERROR, caught.error_log  # not passed with the PyTorch fallback
    assert caught.error_log.startswith("The candidate caught this build failure and would have run PyTorch instead")
    assert "undefined symbol" in caught.error_log and caught.metadata["build_failure_caught"] is True
    plain = evaluate(ADD_ONE, BF / "cpp_undefined_symbol.py", cfg)
    assert plain.status is Status.COMPILE_ERROR, plain.error_log  # not a runtime_error at import
    assert "undefined symbol" in plain.error_log and "caught this build failure" not in plain.error_log
    assert any("undefined symbol" in i.message for i in plain.compile_issues)


def test_a_call_torch_rejects_before_building_is_a_compile_error_when_caught(cpu_config):
    r = evaluate(ADD_ONE, BF / "cpp_bad_argument_fallback.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert r.error_log.startswith("The candidate caught this build failure") and "optimise" in r.error_log


# ---- a build that cannot succeed fails after one compiler run ----------------------------------------


def test_an_error_in_main_cpp_of_the_lean_build_is_certain_and_one_in_cuda_cu_is_not():
    from kernelwright.engine.child import build

    main = build.parse_compiler_output("/tmp/b/main.cpp:3:40: error: expected ';' before '}' token", None)
    cuda = build.parse_compiler_output('/tmp/b/cuda.cu(12): error: identifier "at_foo" is undefined', None)
    assert build.certain_failure(main) and not build.certain_failure(cuda)
    assert not build.certain_failure([])


MAIN_CPP_ERROR = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda = r"""
__global__ void add_one_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + 1.f;
}
torch::Tensor add_one(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp = "torch::Tensor add_one(torch::Tensor x)"  # the ';' is missing: main.cpp cannot compile
ext = load_inline(name="kw_test_main_cpp_error", cpp_sources=cpp, cuda_sources=cuda, functions=["add_one"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.add_one(x)
'''


@pytest.mark.gpu
def test_a_main_cpp_error_fails_after_the_lean_build_alone(cuda_config, tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(MAIN_CPP_ERROR)
    r = evaluate(ADD_ONE, cand, cuda_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    trusted = r.metadata["trusted_build"]["builds"]
    assert trusted and not trusted[0]["ok"]  # the trusted builder's verdict, replayed
    builds = r.metadata["builds"]
    assert len(builds) == 1 and builds[0]["cache"] == "failed in the trusted build"
    assert any(i.file == "main.cpp" for i in r.compile_issues)


# ---- builds whose arguments are computed at run time ---------------------------------------------


def test_recorded_calls_are_checked_like_calls_read_from_the_text():
    from kernelwright.engine.extensions import static_builds

    ok, why = static_builds.check_recorded(
        {"name": "ext", "cpp_sources": "int f();", "functions": ["f"], "verbose": True}
    )
    assert ok == {"name": "ext", "cpp_sources": "int f();", "functions": ["f"]} and why == ""
    for call, reason in [
        ({"name": "ext", "cpp_sources": "", "extra_cflags": ["-fplugin=/tmp/x.so"]}, "not allowed"),
        ({"name": "../x", "cpp_sources": ""}, "plain identifier"),
        ({"name": "ext", "cpp_sources": "", "evil": 1}, "unknown argument"),
        ({"name": "ext", "cpp_sources": {"a": object()}}, "not plain data"),
        ("not a dict", "not a call"),
    ]:
        kwargs, why = static_builds.check_recorded(call)
        assert kwargs is None and reason in why, (call, why)


@pytest.mark.slow
def test_a_call_computed_at_run_time_is_built_by_the_trusted_builder_in_a_prebuild(cpu_config):
    from kernelwright.engine.extensions import static_builds, trusted_builds
    from kernelwright.engine.extensions.prebuild import prebuild

    text = (BF / "cpp_computed_sources.py").read_text()
    assert static_builds.scan(text).private and not static_builds.scan(text).calls  # the text alone: unresolved
    trusted_builds.forget()
    pre = prebuild(ADD_ONE, text, cpu_config, None)
    assert pre.ok, pre.error
    (built,) = pre.builds
    assert built["name"].startswith("kw_test_computed_sources_") and built["ok"]
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.PASSED, r.error_log
    tb = r.metadata["trusted_build"]
    assert tb["remembered"] and tb["recorded"] == 1 and tb["private"] == []  # no builder, nothing private
    (loaded,) = r.metadata["builds"]
    assert loaded["cache"] == "verified"  # the evaluation loaded the trusted build,
    assert loaded["name"] != built["name"] and loaded["built_as"] == built["name"]  # made under another name
    trusted_builds.forget()


@pytest.mark.slow
def test_a_recorder_that_ends_without_its_record_is_not_taken_for_a_candidate_that_builds_nothing(cpu_config, tmp_path):
    """A recorder that dies before its record (killed, timed out, a candidate that exits at import)
    has recorded no call: the prebuild says why and is not ok, and nothing is remembered for the text."""
    from kernelwright.engine.extensions import trusted_builds
    from kernelwright.engine.extensions.prebuild import prebuild

    text = (BF / "cpp_computed_sources.py").read_text().replace("OFFSET = 1", "import os\nos._exit(3)\nOFFSET = 1")
    config = replace(cpu_config, cache_dir=str(tmp_path / "cache"))
    trusted_builds.forget()
    pre = prebuild(ADD_ONE, text, config, None)
    assert not pre.ok and pre.builds == []
    assert "the build recorder exited with code 3 before it recorded a call" in pre.error, pre.error
    assert not list((tmp_path / "cache").rglob("recorded-*.json"))  # a later build records it again
    trusted_builds.forget()


@pytest.mark.slow
def test_a_load_of_files_the_candidate_writes_is_built_by_the_trusted_builder_in_a_prebuild(cpu_config):
    from kernelwright.engine.extensions import static_builds, trusted_builds
    from kernelwright.engine.extensions.prebuild import prebuild

    text = (BF / "cpp_load_written_files.py").read_text()
    assert any("load(...)" in p for p in static_builds.scan(text).private)  # the text alone: not buildable
    trusted_builds.forget()
    pre = prebuild(ADD_ONE, text, cpu_config, None)
    assert pre.ok, pre.error
    assert [b["name"] for b in pre.builds] == ["kw_test_load_written"] and pre.builds[0]["ok"]
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.PASSED, r.error_log
    tb = r.metadata["trusted_build"]
    assert tb["remembered"] and tb["recorded"] == 1 and tb["private"] == []
    first, loaded = r.metadata["builds"]  # its first try, before it wrote the file, fails at once
    assert first["ok"] is False and not first.get("build_s")
    assert loaded["kind"] == "load" and loaded["cache"] == "verified"  # nothing built on the GPU's path
    trusted_builds.forget()


@pytest.mark.slow
def test_a_recorded_load_that_fails_in_its_compiler_is_replayed_not_built_again(cpu_config):
    """CUDA-L1's `75_` on the H100 (2026-11-26): its recorded load() failed in the trusted builder,
    and the evaluation compiled it again for 13.5 s on the GPU's path before the same failure."""
    from kernelwright.engine.extensions import trusted_builds
    from kernelwright.engine.extensions.prebuild import prebuild

    text = (BF / "cpp_load_written_broken.py").read_text()
    trusted_builds.forget()
    pre = prebuild(ADD_ONE, text, cpu_config, None)
    (built,) = pre.builds
    assert built["name"] == "kw_test_load_broken" and not built["ok"] and "blockIdx" in built["output"]
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.COMPILE_ERROR, r.error_log  # caught, with a fallback: one rule (VERDICTS.md)
    (replayed,) = r.metadata["builds"]
    assert replayed["kind"] == "load" and replayed["cache"] == "failed in the trusted build"
    trusted_builds.forget()


def test_a_recorded_load_is_replayed_only_where_the_builder_had_every_file_it_includes():
    from kernelwright.engine.child.trusted_builder import _self_contained

    own = {"name": "e", "load_sources": [["k.cu", '#include "k.h"\n#include <torch/extension.h>'], ["k.h", ""]]}
    assert _self_contained(own)
    beside = {"name": "e", "load_sources": [["k.cu", '  #  include "helpers.cuh"\n']]}  # written beside, not recorded
    assert not _self_contained(beside)
    assert not _self_contained(dict(own, extra_include_paths=["/tmp/inc"]))


def test_recorded_load_calls_are_checked_as_hostile_input():
    from kernelwright.engine.extensions import static_builds

    ok = {"name": "ext", "load_sources": [["k.cu", "__global__ void f() {}"], ["b.cpp", "int g();"]]}
    assert static_builds.check_recorded(ok) == (ok, "")
    for call, reason in [
        (dict(ok, load_sources=[["../../etc/x.cpp", ""]]), "plain C/C++/CUDA file name"),
        (dict(ok, load_sources=[["k.so", ""]]), "plain C/C++/CUDA file name"),
        (dict(ok, load_sources=[["k.cu", ""], ["k.cu", ""]]), "twice"),
        (dict(ok, load_sources=[]), "no source files"),
        (dict(ok, extra_cflags=["-fplugin=/tmp/p.so"]), "not allowed"),
        (dict(ok, sources=["k.cu"]), "unknown argument"),
    ]:
        kwargs, why = static_builds.check_recorded(call)
        assert kwargs is None and reason in why, (call, why)


LAZY = {
    # the extension is built in ModelNew.__init__, from sources put together there
    "init": """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = "torch::Tensor add_one(torch::Tensor x) { return torch::relu(x) + 1; }"


def _header():
    return "#include <torch/extension.h>"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="kw_lazy_init", cpp_sources=_header() + "\\n" + SRC,
                               functions=["add_one"])

    def forward(self, x):
        return self.ext.add_one(x)
""",
    # built in __init__ only where CUDA is there (a guard many published kernels have; the recorder
    # sees no GPU, so it answers that CUDA is available)
    "init if cuda": """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = "torch::Tensor add_one(torch::Tensor x) { return torch::relu(x) + 1; }"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = None
        if torch.cuda.is_available():
            src = "#include <torch/extension.h>\\n" + SRC
            self.ext = load_inline(name="kw_lazy_init_if_cuda", cpp_sources=src, functions=["add_one"])

    def forward(self, x):
        return self.ext.add_one(x) if self.ext is not None and x.is_cuda else torch.relu(x) + 1
""",
    # CUDA tensors made in __init__ before the build (a weight's sums moved with .cuda(), a buffer
    # on device="cuda", the module moved with .to): the shape of CUDA-L1's 23_Conv3d_GroupNorm_Mean,
    # which the recorder never reached; it makes them on the CPU now
    "init, cuda tensors first": """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).to("cuda")
        self.sums = self.lin.weight.sum(dim=-1).contiguous().cuda()
        self.scratch = torch.zeros(4, device=torch.device("cuda", torch.cuda.current_device()))
        torch.cuda.synchronize()
        src = "#include <torch/extension.h>\\n"
        src += "torch::Tensor add_one(torch::Tensor x) { return torch::relu(x) + 1; }"
        self.ext = load_inline(name="kw_lazy_cuda_first", cpp_sources=src, functions=["add_one"])

    def forward(self, x):
        return self.ext.add_one(x)
""",
    # built at the first call, through a global set on first use (how many published kernels do it)
    "first call": """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_ext = None


def _get():
    global _ext
    if _ext is None:
        body = "torch::Tensor add_one(torch::Tensor x) { return torch::relu(x) + 1; }"
        parts = ["#include <torch/extension.h>", body]
        _ext = load_inline(name="kw_lazy_call", cpp_sources="\\n".join(parts), functions=["add_one"])
    return _ext


class ModelNew(nn.Module):
    def forward(self, x):
        return _get().add_one(x)
""",
    # the device chosen at import, a tensor made there: told that CUDA is available, the recorder
    # cannot import it (no GPU here), so it imports it as it is, and the first call still builds
    "first call, device at import": """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ONE = torch.ones(1, device=DEVICE)
_ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        global _ext
        if _ext is None:
            src = "#include <torch/extension.h>\\n"
            src += "torch::Tensor add_one(torch::Tensor x) { return torch::relu(x) + 1; }"
            _ext = load_inline(name="kw_lazy_device", cpp_sources=src, functions=["add_one"])
        return _ext.add_one(x)
""",
}


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted(LAZY))
def test_a_build_made_in_init_or_at_the_first_call_is_recorded_given_the_problem(cpu_config, tmp_path, where):
    """The build recorder constructs ModelNew and calls it once on the CPU (given the problem): the
    builds made there reach the trusted builder, checked as hostile input like any recorded call."""
    from kernelwright.engine.extensions import static_builds, trusted_builds
    from kernelwright.engine.isolation.environment import child_env

    text = LAZY[where]
    assert static_builds.scan(text).private  # the text alone: not resolved
    env = child_env(cpu_config, tmp_path / "tmp")
    alone = trusted_builds.record_calls(text, cpu_config, tmp_path / "a", env).calls
    assert alone == []  # its module-level code builds nothing
    rec = trusted_builds.record_calls(text, cpu_config, tmp_path / "b", env, ADD_ONE.read_text())
    calls, refused = rec.calls, rec.refused
    names = {"init": "kw_lazy_init", "init if cuda": "kw_lazy_init_if_cuda", "first call": "kw_lazy_call"}
    names["init, cuda tensors first"] = "kw_lazy_cuda_first"
    names["first call, device at import"] = "kw_lazy_device"
    assert refused == [] and [c["name"] for c in calls] == [names[where]]
    assert calls[0]["functions"] == ["add_one"] and "torch::relu(x) + 1" in calls[0]["cpp_sources"]
