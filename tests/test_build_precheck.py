"""Builds that cannot succeed are reported before the compiler runs, and a build failure the
candidate caught (to fall back to PyTorch) is said in the log."""

from __future__ import annotations

import pytest

from conftest import ADD_ONE, EXAMPLES, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import build

BF = FIXTURES / "builds"
SWISH = EXAMPLES / "cpu_swish" / "problem.py"


# ---- the check itself ------------------------------------------------------------------------------


def test_a_global_kernel_named_in_functions_with_empty_cpp_sources_is_undeclared():
    assert build.undeclared_functions("", ["swish_kernel"]) == ["swish_kernel"]


def test_declared_functions_pass_the_check():
    cpp = "torch::Tensor relu_plus_one(torch::Tensor x);"
    assert build.undeclared_functions(cpp, ["relu_plus_one"]) == []
    assert build.undeclared_functions([cpp], {"relu_plus_one": "docstring"}) == []
    assert build.undeclared_functions(cpp, None) == []
    assert build.undeclared_functions(cpp, "relu_plus_one") == []


def test_only_the_undeclared_names_are_listed():
    cpp = "torch::Tensor launcher(torch::Tensor x);"
    assert build.undeclared_functions(cpp, ["launcher", "my_kernel"]) == ["my_kernel"]


def test_a_name_merely_contained_in_another_is_not_a_declaration():
    assert build.undeclared_functions("torch::Tensor relu_kernel_launch(torch::Tensor x);", ["relu_kernel"]) == [
        "relu_kernel"
    ]


MODULE = """
torch::Tensor f(torch::Tensor x) { return x + 1; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
"""


def test_a_module_of_its_own_and_functions_too_defines_the_module_twice():
    assert build.module_defined_twice(MODULE, "ext", ["f"]) is True
    assert build.module_defined_twice([MODULE], "ext", []) is True  # torch appends its block for [] too
    assert build.module_defined_twice(MODULE.replace("TORCH_EXTENSION_NAME", "ext"), "ext", ["f"]) is True
    # as CUDA-L1's 11_ and 21_ (level 2) are written: macros of their own, an include guard closed before
    defines = '#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")\n'
    assert build.module_defined_twice(defines + MODULE, "ext", ["f"]) is True
    guard = "#ifndef EXT_H\n#define EXT_H\nint g();\n#endif\n"
    assert build.module_defined_twice(guard + MODULE, "ext", ["f"]) is True
    assert build.module_defined_twice('TORCH_CHECK(ok, "NO ERROR");\n' + MODULE, "ext", ["f"]) is True


@pytest.mark.parametrize(
    ("text", "functions"),
    [
        (MODULE, None),  # no functions: torch adds no block, the candidate's is the only one
        (MODULE.replace("TORCH_EXTENSION_NAME", "other_name"), ["f"]),  # another module's init: it builds
        ("// " + MODULE.replace("\n", "\n// "), ["f"]),  # commented out
        ("/*" + MODULE + "*/", ["f"]),
        ("#ifndef SKIP\n" + MODULE + "#endif\n", ["f"]),  # the preprocessor may drop it: not certain
        ("#define TORCH_EXTENSION_NAME other\n" + MODULE, ["f"]),
        ('#include "my_module.h"\n' + MODULE, ["f"]),  # a header of its own could rename it
        ("#define REGISTER \\\n" + MODULE.strip().replace("\n", " \\\n"), ["f"]),  # a macro never used
        ('const char* doc = R"(\n' + MODULE + ')";', ["f"]),  # inside a raw string: not read
    ],
)
def test_a_module_block_that_may_not_clash_is_left_to_the_compiler(text, functions):
    assert build.module_defined_twice(text, "ext", functions) is False


# ---- through the engine: no compiler run, a clear message ----------------------------------------------


def _no_compiler_ran(r) -> None:
    """Neither the trusted builder nor the runner made a build directory or a cache key for the
    load: the precheck answered, and no compiler ran. (Not a time: the trusted builder's own start,
    a torch import, takes 5-10 s on a loaded 2-core machine, as long as a small compile.)"""
    seen = r.metadata["builds"] + r.metadata.get("trusted_build", {}).get("builds", [])
    assert seen and all(b.get("precheck") is True and not b.get("dir") and not b.get("key") for b in seen), seen


def test_undeclared_function_is_a_compile_error_found_before_compiling(cpu_config):
    r = evaluate(ADD_ONE, BF / "global_kernel_in_functions.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert "names 'relu_kernel', a __global__ kernel in cuda_sources, which no C++ source declares" in r.error_log
    assert "no compiler was run" in r.error_log
    assert "caught this build failure" not in r.error_log  # the candidate did not catch it
    issue = r.compile_issues[0]
    assert issue.candidate_line == 23  # the line of functions=[...] in the fixture
    builds = r.metadata["builds"]
    assert builds and builds[0]["precheck"] is True
    _no_compiler_ran(r)


def test_a_caught_build_failure_says_the_candidate_would_have_run_pytorch(cpu_config):
    r = evaluate(SWISH, BF / "global_kernel_in_functions_fallback.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert r.error_log.startswith("The candidate caught this build failure and would have run PyTorch instead")
    assert "names 'swish_kernel'" in r.error_log
    assert "a __global__ kernel in cuda_sources" in r.error_log
    assert "torch::Tensor swish_forward(torch::Tensor x);" in r.error_log  # the launcher it should bind
    assert r.metadata["build_failure_caught"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "stage", "caught"),
    [
        ("init_build_fallback.py", "init", True),  # CUDA-L1's 23_ and 47_: built in __init__, warned, fell back
        ("first_call_build_fallback.py", "correctness", True),  # CUDA-L1's 71_: built at the first forward
        ("init_build_raises.py", "init", False),  # built in __init__, its failure wrapped and raised
    ],
)
def test_a_build_that_fails_after_import_is_a_compile_error_as_at_import(cpu_config, fixture, stage, caught):
    """One rule for a build the candidate makes, wherever it makes it (docs/VERDICTS.md): these
    passed with their PyTorch fallback while the rule looked at the builds made at import only."""
    r = evaluate(SWISH, BF / fixture, cpu_config)
    assert r.status is Status.COMPILE_ERROR, (r.status, r.error_log)
    assert r.error_stage is not None and r.error_stage.value == stage
    assert "names 'swish_scale_kernel', a __global__ kernel in cuda_sources" in r.error_log
    assert r.error_log.startswith("The candidate caught this build failure") is caught
    assert r.metadata.get("build_failure_caught", False) is caught
    assert [b["ok"] for b in r.metadata["builds"]] == [False]  # reported, although made after the import


@pytest.mark.slow
def test_a_real_compile_error_caught_by_a_fallback_says_so_too(cpu_config):
    r = evaluate(ADD_ONE, BF / "cpp_compile_error_fallback.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert r.error_log.startswith("The candidate caught this build failure and would have run PyTorch instead")
    assert "Compilation of extension 'kw_test_relu_fallback_error' failed" in r.error_log
    assert not r.metadata["builds"][0].get("precheck")


def test_a_module_defined_twice_is_a_compile_error_found_before_compiling(cpu_config):
    """CUDA-L1's 3_, 10_, 50_ and 84_ (level 1): the compiler's "redefinition of PyInit_..." came after
    27-87 s of build on the H100; the precheck says it at once, and the fallback is not evaluated."""
    r = evaluate(ADD_ONE, BF / "module_defined_twice.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR, r.error_log
    assert r.error_log.startswith("The candidate caught this build failure and would have run PyTorch instead")
    assert "two definitions of PyInit_relu_plus_one_twice" in r.error_log
    assert "no compiler was run" in r.error_log
    assert r.metadata["builds"][0]["precheck"] is True
    _no_compiler_ran(r)
