"""The shared build cache cannot be poisoned by a candidate (engine/extensions/static_builds.py,
engine/extensions/trusted_builds.py, engine/child/trusted_builder.py, the loading side in child/build.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES, EXAMPLES, FIXTURES, seed_headers
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.extensions import static_builds, trusted_builds
from kernelwright.engine.isolation import sandbox

SWISH = EXAMPLES / "cpu_swish"
# the C++ candidate the cache tests below build: one function, torch's default flags. What they assert
# is what an entry's bytes are trusted for, whatever the extension; the example's (-O3 -march=native)
# took twice as long to compile, and its flags get no precompiled header in the run (tests/conftest.py)
CPP = CANDIDATES / "cpp_same_name_1.py"


# ---- reading the calls without running the candidate ------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        SWISH / "candidate.py",
        CANDIDATES / "cuda_same_name_1.py",
        CANDIDATES / "cuda_needs_full_headers.py",
        CANDIDATES / "cpp_wrong.py",
        CANDIDATES / "cuda_swish_plus_torch.py",
    ],
)
def test_real_candidates_calls_are_resolved_statically(path):
    scan = static_builds.scan(path.read_text())
    assert len(scan.calls) == 1 and not scan.private, scan.private
    kw = scan.calls[0].kwargs
    assert isinstance(kw["name"], str) and isinstance(kw["cpp_sources"], (str, list))
    assert "verbose" not in kw and "build_directory" not in kw


def test_constants_concatenations_and_joins_are_resolved():
    text = """
from torch.utils import cpp_extension
HEADER = "#include <torch/extension.h>\\n"
BODY = HEADER + "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"] + ["-ffast-math"]
ext = cpp_extension.load_inline("ext_a", "\\n".join([BODY, "// end"]), functions=["f"], extra_cflags=FLAGS)
"""
    (call,) = static_builds.scan(text).calls
    assert call.kwargs["name"] == "ext_a" and call.kwargs["cpp_sources"].startswith("#include <torch/extension.h>\n")
    assert call.kwargs["cpp_sources"].endswith("// end") and call.kwargs["extra_cflags"] == ["-O3", "-ffast-math"]


@pytest.mark.parametrize(
    "code, why",
    [
        ('src = open("k.cpp").read()\nload_inline("e", src)', "computed at run time"),
        ('n = 4\nload_inline("e", f"int a[{n}];")', "computed at run time"),
        ('load_inline(name="e" + str(1), cpp_sources="")', "computed at run time"),
        ('load("e", ["k.cpp"])', "load(...) builds files the candidate writes"),
        ('def make():\n    return "x"\nload_inline("e", make())', "computed at run time"),
    ],
)
def test_dynamic_calls_are_left_to_a_private_build(code, why):
    scan = static_builds.scan("from torch.utils.cpp_extension import load_inline, load\n" + code)
    assert not scan.calls and any(why in p for p in scan.private), scan.private


@pytest.mark.parametrize(
    "key, flags, why",
    [
        ("extra_cflags", ["-fplugin=/tmp/evil.so"], "loads a shared object into the compiler"),
        ("extra_cflags", ["-B/tmp/evil"], "programs the compiler driver runs"),
        ("extra_cflags", ["-specs=/tmp/evil.specs"], "programs the compiler driver runs"),
        ("extra_cflags", ["-wrapper", "/tmp/evil"], "programs the compiler driver runs"),
        ("extra_cflags", ["@/tmp/opts"], "reads options from a file"),
        ("extra_cflags", ["-I/tmp/headers"], "outside the system, CUDA and torch directories"),
        ("extra_cflags", ["-include", "/tmp/evil.h"], "outside the system, CUDA and torch directories"),
        ("extra_cuda_cflags", ["-ccbin=/tmp/evil"], "programs the compiler driver runs"),
        ("extra_cuda_cflags", ["--compiler-bindir", "/tmp/evil"], "programs the compiler driver runs"),
        ("extra_cuda_cflags", ["-Xcompiler", "-fplugin=/tmp/evil.so"], "loads a shared object"),
        ("extra_cuda_cflags", ["--options-file", "/tmp/o"], "reads options from a file"),
        ("extra_ldflags", ["-Wl,--plugin=/tmp/evil.so"], "passes options to the linker"),
        ("extra_ldflags", ["-Xlinker", "-rpath=/tmp"], "passes options to the linker"),
        ("extra_ldflags", ["-L/tmp/libs"], "outside the system, CUDA and torch directories"),
        ("extra_cflags", ["-fsomething-new"], "not on the allow-list"),
    ],
)
def test_flags_that_could_run_or_read_the_candidates_files_are_refused(key, flags, why):
    problem = static_builds.flag_problem({"name": "e", "cpp_sources": "", key: flags})
    assert why in problem, problem


def test_ordinary_flags_are_allowed():
    kw = {
        "extra_cflags": ["-O3", "-ffast-math", "-march=native", "-std=c++17", "-DNDEBUG", "-fopenmp"],
        "extra_cuda_cflags": [
            "-O3",
            "--use_fast_math",
            "-lineinfo",
            "-Xptxas=-v",
            "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-Xcompiler",
            "-O3,-fPIC",
            "--maxrregcount=64",
        ],
        "extra_ldflags": ["-lcublas", "-lcuda", ""],
    }
    assert static_builds.flag_problem(kw) == ""


# ---- evaluations: the cache cannot be poisoned ------------------------------------------------


def _bwrap_ok() -> bool:
    try:
        return sandbox.resolve("bwrap") == "bwrap"
    except sandbox.SandboxUnavailable:
        return False


def _modes() -> list:
    # bubblewrap first: it leaves the entry as built, and the unsandboxed test then starts from it
    return [pytest.param("bwrap", marks=pytest.mark.skipif(not _bwrap_ok(), reason="no bubblewrap")), "none"]


@pytest.fixture(scope="module")
def poison_cache_dir(tmp_path_factory, cache_dir):
    """One cache for this module's tests, never the session's shared one: a poisoning test must not
    touch that. `CPP` is built into it once (by the first test that evaluates it), with the
    shared cache's precompiled headers where they are made already (these tests are about what an
    entry's bytes are trusted for, not about parsing torch's headers)."""
    d = tmp_path_factory.mktemp("kw-poison-cache")
    seed_headers(d, cache_dir)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def own_cache(poison_cache_dir, cpu_config, cache_dir):
    """The module's own cache, with this process's memory of its hashes forgotten: each test starts
    as a new process would, trusting only what the entries' manifests say. Seeded again with the
    shared cache's headers: the module's first test may start before the run's first header is
    made (the compile error's build then parses torch's headers in about 3 s, not 30 s)."""
    d = poison_cache_dir
    seed_headers(d, cache_dir)
    cpu_config.cache_dir = str(d)
    cpu_config.time_candidate = False
    cpu_config.timeouts.correctness = cpu_config.timeouts.init = 180  # a shared two-core machine can be slow
    trusted_builds.forget()
    yield d
    trusted_builds.forget()


@pytest.mark.slow
@pytest.mark.parametrize("mode", _modes())
def test_a_poisoned_cache_entry_is_never_loaded(cpu_config, own_cache, mode):
    cpu_config.sandbox = mode
    first = evaluate(ADD_ONE, CPP, cpu_config)
    assert first.status is Status.PASSED, first.error_log
    (b,) = first.metadata["builds"]
    assert b["cache"] == "verified" and first.metadata["trusted_build"]["verified"] == 1
    entry = own_cache / "builds" / Path(b["dir"]).name
    artefact = next(entry.glob("kw_same_name*.so"))
    good, manifest = artefact.read_bytes(), (entry / "kw-artefact.json").read_text()
    try:
        _poison_and_evaluate_again(cpu_config, own_cache, mode, artefact, good)
    finally:  # the module's cache as it was: under `none` a new process trusts the rewritten manifest
        artefact.write_bytes(good)
        (entry / "kw-artefact.json").write_text(manifest)


def _poison_and_evaluate_again(cpu_config, own_cache, mode, artefact, good):
    attacker = (FIXTURES / "host_attacks" / "poison_build_cache.py").read_text().replace("__CACHE__", str(own_cache))
    attack = evaluate(ADD_ONE, None, cpu_config, candidate_text=attacker)
    assert attack.status is Status.PASSED, attack.error_log
    if mode == "bwrap":  # the shared builds are mounted read-only for the candidate
        assert artefact.read_bytes() == good
        second = evaluate(ADD_ONE, CPP, cpu_config)
        assert second.status is Status.PASSED and second.metadata["builds"][0]["cache"] == "verified"
        return
    assert artefact.read_bytes() != good, "the attack did not land: the test proves nothing"
    second = evaluate(ADD_ONE, CPP, cpu_config)
    assert second.status is Status.PASSED, second.error_log
    (b2,) = second.metadata["builds"]
    assert b2["cache"] == "rejected: hash mismatch" and b2["ok"] and not b2["cached"]
    # no builder ran for the second (its calls were built before by this process): the bytes are still checked
    assert second.metadata["trusted_build"].get("remembered") is True
    assert str(own_cache / "builds") not in b2["dir"]  # built privately, in the evaluation's own directory


@pytest.mark.slow
def test_a_fresh_process_starts_no_builder_for_calls_an_earlier_one_built(cpu_config, own_cache):
    """One `kernelwright eval` after another: the second process reads what the first built from the
    cache's memo (a builder's start is a torch import, 3-5 s of a cached evaluation), unless a
    hash it names is no longer the one the entry's manifest holds."""
    cpu_config.sandbox = "none"
    first = evaluate(ADD_ONE, CPP, cpu_config)
    assert first.status is Status.PASSED, first.error_log
    (memo,) = (own_cache / "builds" / trusted_builds.MEMO_DIR).glob("done-*.json")
    trusted_builds.forget()  # a new process
    second = evaluate(ADD_ONE, CPP, cpu_config)
    assert second.status is Status.PASSED, second.error_log
    assert second.metadata["trusted_build"].get("remembered") is True  # no builder was started

    data = json.loads(memo.read_text())
    data["verified"] = {d: "0" * 64 for d in data["verified"]}  # names hashes the entries do not hold
    memo.write_text(json.dumps(data))
    trusted_builds.forget()
    third = evaluate(ADD_ONE, CPP, cpu_config)
    assert third.status is Status.PASSED, third.error_log
    assert not third.metadata["trusted_build"].get("remembered")  # the builder ran, and said what it holds


@pytest.mark.slow
def test_a_forbidden_flag_is_built_privately_and_never_published(cpu_config, own_cache):
    call = 'functions=["relu_add"]'
    text = CPP.read_text().replace(f"{call})", f'{call}, extra_cflags=["-Wl,-O1"])')
    assert "-Wl,-O1" in text
    published = set((own_cache / "builds").glob("kw_same_name*"))  # the candidate's own, built as written
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.PASSED, r.error_log
    (b,) = r.metadata["builds"]
    assert b["cache"] == "private" and b["ok"]
    assert any("'-Wl,-O1'" in p and "linker" in p for p in r.metadata["trusted_build"]["private"])
    assert set((own_cache / "builds").glob("kw_same_name*")) == published  # nothing new published


@pytest.mark.gpu
@pytest.mark.parametrize("mode", _modes())
def test_a_cuda_extension_is_built_by_the_trusted_builder_and_loaded_verified(cuda_config, tmp_path, mode):
    cuda_config.cache_dir, cuda_config.sandbox = str(tmp_path / "cache"), mode
    trusted_builds.forget()
    example = EXAMPLES / "cuda_swish"
    r = evaluate(example / "problem.py", example / "candidate.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    (b,) = r.metadata["builds"]
    assert b["cache"] == "verified" and b["lean_headers"]["used"] is True, (
        b,
        r.metadata["trusted_build"],
    )  # built lean
    assert r.metadata["trusted_build"]["builds"][0]["cached"] is False
    again = evaluate(example / "problem.py", example / "candidate.py", cuda_config)
    assert again.status is Status.PASSED and again.metadata["builds"][0]["cache"] == "verified"
    assert again.metadata["trusted_build"]["builds"][0]["cached"] is True


@pytest.mark.slow
def test_a_compile_error_is_reported_from_the_trusted_build_without_a_second_build(cpu_config, own_cache):
    r = evaluate(ADD_ONE, CANDIDATES / "cpp_compile_error.py", cpu_config)
    assert r.status is Status.COMPILE_ERROR and not r.compiled, r.error_log
    (b,) = r.metadata["builds"]
    assert b["cache"] == "failed in the trusted build" and b["ok"] is False
    assert r.metadata["trusted_build"]["builds"][0]["ok"] is False
    first = r.compile_issues[0]  # located in the candidate as when the evaluation built it itself
    assert "one_constant_never_declared" in first.message and first.candidate_line == 15
    assert b["dir"].startswith(str(own_cache / "builds"))  # the builder's directory: nothing was built privately
    # the same calls again (a retry, the same candidate in another round): the failure is remembered,
    # not compiled again (the builder's whole run, 15-50 s for published CUDA kernels, on the GPU's path)
    again = evaluate(ADD_ONE, CANDIDATES / "cpp_compile_error.py", cpu_config)
    assert again.status is Status.COMPILE_ERROR and again.metadata["trusted_build"].get("remembered"), again.metadata
    assert again.metadata["builds"][0]["cache"] == "failed in the trusted build"
    assert again.compile_issues[0].candidate_line == 15


# ---- the loading side, with torch's build faked (no compiler) ----------------------------------


class FakeBuild:
    """Stands in for torch's load_inline: writes an artefact into the directory it is given."""

    def __init__(self):
        self.dirs: list[str] = []

    def __call__(
        self,
        name,
        cpp_sources,
        cuda_sources=None,
        functions=None,
        build_directory=None,
        verbose=False,
        with_cuda=None,
        **kwargs,
    ):
        self.dirs.append(build_directory)
        Path(build_directory, f"{name}.so").write_bytes(b"built in " + build_directory.encode())
        return type("Module", (), {"f": staticmethod(lambda: "built")})()


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    def install(**kwargs) -> FakeBuild:
        fake = FakeBuild()
        monkeypatch.setattr(cpp_ext, "load_inline", fake)
        monkeypatch.setattr(cpp_ext, "load", cpp_ext.load)
        monkeypatch.setattr(
            cpp_ext,
            "_import_module_from_library",
            lambda name, path, py: type("Module", (), {"f": staticmethod(lambda: f"loaded {path}")})(),
        )
        monkeypatch.setattr(build, "BUILD_LOG", [])
        monkeypatch.setattr(build, "BUILT_MODULES", [])
        build.install_build_cache(tmp_path / "builds", None, **kwargs)
        return fake

    return install


def test_a_call_keys_the_same_however_it_is_written(fake_build):
    import torch.utils.cpp_extension as cpp_ext

    fake = fake_build()
    cpp_ext.load_inline("e", "int f();", None, ["f"])
    cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"], verbose=True, with_cuda=None)
    assert fake.dirs[0] == fake.dirs[1]  # the trusted builder calls with keywords, candidates often do not


def test_a_call_keys_the_same_where_torchs_pch_can_be_used_and_where_it_cannot(fake_build, monkeypatch):
    """The trusted builder can write torch's install (its precompiled header is used), the
    sandboxed runner cannot: the same call must get the same key on both sides, or every call with
    torch's default flags is built again in the evaluation (found on a published corpus on an H200)."""
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    dirs = []
    for usable in (True, False):
        monkeypatch.setattr(build, "pch_usable", lambda kwargs, usable=usable: usable)
        monkeypatch.setattr(build, "_prepare_pch", lambda: True)
        fake = fake_build(use_pch=True)
        cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
        dirs += fake.dirs
    assert len(dirs) == 2 and dirs[0] == dirs[1], dirs


def test_the_evaluation_loads_a_matching_artefact_and_builds_a_mismatching_one_privately(fake_build, tmp_path):
    import hashlib

    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    fake = fake_build(publish=True)  # the trusted side builds and records
    cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
    shared = Path(fake.dirs[0])
    sha = build._record_artefact(shared, "e")
    assert sha == hashlib.sha256((shared / "e.so").read_bytes()).hexdigest()
    private = tmp_path / "private"

    fake = fake_build(verified={shared.name: sha}, private_root=private)
    mod = cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
    (entry,) = build.BUILD_LOG
    assert entry["cache"] == "verified" and entry["cached"] and not fake.dirs
    assert mod.f() == f"loaded {private / ('verified-' + shared.name)}"  # a private copy is loaded

    (shared / "e.so").write_bytes(b"poisoned")
    fake = fake_build(verified={shared.name: sha}, private_root=private)
    mod = cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
    (entry,) = build.BUILD_LOG
    assert entry["cache"] == "rejected: hash mismatch" and fake.dirs == [str(private / shared.name)]
    assert (shared / "e.so").read_bytes() == b"poisoned"  # nothing is written to the shared cache

    fake = fake_build(verified={}, private_root=private)  # not prebuilt: private
    cpp_ext.load_inline(name="e", cpp_sources="int g();", functions=["g"])
    assert build.BUILD_LOG[0]["cache"] == "private" and fake.dirs[0].startswith(str(private))


def test_a_call_made_under_a_name_of_its_own_process_loads_the_build_of_the_same_call(fake_build, tmp_path):
    """Published kernels name their extension per process (`f"ext_{id(self)}"`): the recorder's call
    and the evaluation's differ only in the name. The evaluation loads the trusted build of the same
    sources and flags (or replays its failure); other sources under the same name do not match."""
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    fake = fake_build(publish=True)
    cpp_ext.load_inline(name="ext_1401", cpp_sources="int f();", functions=["f"])
    shared = Path(fake.dirs[0])
    sha = build._record_artefact(shared, "ext_1401")
    private = tmp_path / "private"

    fake = fake_build(verified={shared.name: sha}, private_root=private)
    mod = cpp_ext.load_inline(name="ext_2207", cpp_sources="int f();", functions=["f"])
    (entry,) = build.BUILD_LOG
    assert entry["cache"] == "verified" and entry["built_as"] == "ext_1401" and not fake.dirs
    assert mod.f() == f"loaded {private / ('verified-' + shared.name)}"

    fake = fake_build(verified={shared.name: sha}, private_root=private)  # other code, the same name
    cpp_ext.load_inline(name="ext_1401", cpp_sources="int g();", functions=["g"])
    assert build.BUILD_LOG[0]["cache"] == "private" and fake.dirs[0].startswith(str(private))

    failed = {shared.name: "Error building extension 'ext_1401': f.cpp:1: error: expected ';'"}
    fake = fake_build(failed=failed, private_root=private)
    with pytest.raises(build.CandidateBuildError, match="expected ';'"):
        cpp_ext.load_inline(name="ext_3302", cpp_sources="int f();", functions=["f"])
    assert build.BUILD_LOG[0]["cache"] == "failed in the trusted build" and not fake.dirs


def test_the_trusted_builder_rebuilds_an_entry_without_a_hash_record(fake_build):
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    fake = fake_build(publish=True)
    cpp_ext.load_inline(name="e", cpp_sources="int f();")
    shared = Path(fake.dirs[0])
    (shared / build.MANIFEST).unlink()  # an artefact nobody trusted recorded: planted, or from before
    (shared / "planted.o").write_bytes(b"x")
    fake = fake_build(publish=True)
    cpp_ext.load_inline(name="e", cpp_sources="int f();")
    assert fake.dirs == [str(shared)] and not (shared / "planted.o").exists()
    assert build.BUILD_LOG[0]["cached"] is False and (shared / build.MANIFEST).exists()


class BatonBuild(FakeBuild):
    """A build that honours torch's FileBaton the way `torch.utils.cpp_extension` does: a `lock` file
    in the build directory means another build of it is in progress (torch would wait while it
    exists, for ever if its owner died)."""

    def __call__(self, name, cpp_sources, cuda_sources=None, functions=None, build_directory=None, **kwargs):
        from torch.utils.file_baton import FileBaton

        baton = FileBaton(os.path.join(build_directory, "lock"))
        if not baton.try_acquire():
            raise AssertionError(f"torch would wait for ever on {build_directory}/lock")
        try:
            return super().__call__(name, cpp_sources, cuda_sources, functions, build_directory, **kwargs)
        finally:
            baton.release()


@pytest.mark.parametrize("mode", ["trusted builder", "evaluation, private", "evaluation, no trusted cache"])
def test_a_build_killed_mid_way_does_not_block_the_next_build_of_the_same_sources(monkeypatch, tmp_path, mode):
    """A killed build leaves torch's `lock` in its directory; the next build of the same sources
    must go ahead (torch alone would wait for it for ever: every later evaluation a time-out)."""
    import torch.utils.cpp_extension as cpp_ext
    from torch.utils.file_baton import FileBaton

    from kernelwright.engine.child import build

    kwargs = {
        "trusted builder": {"publish": True},
        "evaluation, private": {"private_root": tmp_path / "private"},
        "evaluation, no trusted cache": {},
    }[mode]
    monkeypatch.setattr(build, "BUILD_LOG", [])
    monkeypatch.setattr(build, "BUILT_MODULES", [])
    probe = FakeBuild()  # where this call builds (the directory is keyed by content)
    monkeypatch.setattr(cpp_ext, "load_inline", probe)
    build.install_build_cache(tmp_path / "builds", None, **kwargs)
    cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
    build_dir = Path(probe.dirs[0])
    for f in build_dir.iterdir():
        f.unlink()  # as if the first build had been killed before it wrote anything ...
    assert FileBaton(str(build_dir / "lock")).try_acquire()  # ... holding torch's baton

    baton = BatonBuild()
    monkeypatch.setattr(cpp_ext, "load_inline", baton)
    monkeypatch.setattr(build, "BUILD_LOG", [])
    build.install_build_cache(tmp_path / "builds", None, **kwargs)
    cpp_ext.load_inline(name="e", cpp_sources="int f();", functions=["f"])
    assert baton.dirs == [str(build_dir)] and build.BUILD_LOG[0]["ok"]
    assert not (build_dir / "lock").exists()


def test_a_build_in_progress_is_waited_for_not_broken_into(monkeypatch, tmp_path):
    """The baton is removed only by a builder holding the directory's flock: while another process
    builds (and holds it), a second build of the same directory waits for it."""
    import fcntl
    import threading

    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    monkeypatch.setattr(build, "BUILD_LOG", [])
    monkeypatch.setattr(build, "BUILT_MODULES", [])
    probe = FakeBuild()
    monkeypatch.setattr(cpp_ext, "load_inline", probe)
    build.install_build_cache(tmp_path / "builds", None)
    cpp_ext.load_inline(name="e", cpp_sources="int g();", functions=["g"])
    build_dir = Path(probe.dirs[0])
    (build_dir / "e.so").unlink()
    holder = open(build_dir.parent / f".{build_dir.name}.lock", "w")  # a live builder elsewhere
    fcntl.flock(holder, fcntl.LOCK_EX)
    (build_dir / "lock").write_text("")  # its baton
    done = threading.Event()

    def second():
        cpp_ext.load_inline(name="e", cpp_sources="int g();", functions=["g"])
        done.set()

    baton = BatonBuild()
    monkeypatch.setattr(cpp_ext, "load_inline", baton)
    build.install_build_cache(tmp_path / "builds", None)
    t = threading.Thread(target=second, daemon=True)
    t.start()
    assert not done.wait(0.5) and (build_dir / "lock").exists()  # waits; the live baton stays
    (build_dir / "lock").unlink()  # the live builder finishes ...
    holder.close()  # ... and lets go
    assert done.wait(10) and baton.dirs == [str(build_dir)]


def test_only_a_compilers_own_diagnostic_outlives_the_process(tmp_path):
    """A failed build is kept for later processes only as the compiler's verdict on the sources: a
    compiler killed for memory, or a full disk, is built again by the next process."""
    for output, kept in [
        ("main.cpp:3:1: error: expected ';' before '}' token", True),
        ('cuda.cu(12): error: identifier "N" is undefined', True),
        ("c++: fatal error: Killed signal terminated program cc1plus", False),
        ("ninja: build stopped: subcommand failed.", False),
        ("cuda.cu:1: fatal error: error writing to /tmp/ccX.s: No space left on device", False),
    ]:
        root = tmp_path / str(abs(hash(output)))
        trusted_builds._write_done(root, "calls", ({}, {"e-0123": output}, [{"name": "e", "ok": False}]))
        assert (trusted_builds._read_done(root, "calls") is not None) is kept, output
    trusted_builds.forget()


@pytest.mark.slow
def test_the_build_is_a_stage_on_the_live_line_and_a_cold_first_build_says_so(cpu_config, cache_dir, tmp_path):
    """The trusted builder's compilation, before the evaluation child's own stages: on the live line
    (which extension, which of how many, and that it is a first build), in stage_times.build_s and
    the console's stages row; the same code again comes from the cache and says nothing of it."""
    from kernelwright.cli.console import cold_build

    seed_headers(tmp_path / "cache", cache_dir)
    cpu_config.cache_dir = str(tmp_path / "cache")
    cpu_config.time_candidate = False
    trusted_builds.forget()
    try:
        stages: list[str] = []
        first = evaluate(ADD_ONE, CPP, cpu_config, on_stage=stages.append)
        name = static_builds.scan(CPP.read_text()).calls[0].kwargs["name"]
        compiling = f"build: compiling {name} (1 of 1; {trusted_builds.COLD})"
        assert compiling in stages and stages.index(compiling) < stages.index("startup"), stages
        built = first.metadata["trusted_build"]
        assert first.stage_times.build_s is not None and first.stage_times.build_s >= built["wall_s"] > 0
        assert cold_build(first) == f"compiled 1 extension not built on this machine before ({built['wall_s']:.1f}s)"
        again: list[str] = []
        second = evaluate(ADD_ONE, CPP, cpu_config, on_stage=again.append)
        assert not any(s.startswith("build: ") for s in again) and cold_build(second) is None, again
    finally:
        trusted_builds.forget()
