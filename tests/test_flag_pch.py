"""A precompiled <torch/extension.h> per flag set of C++ candidates (engine/child/flag_pch.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelwright.engine.child import flag_pch
from kernelwright.engine.extensions import trusted_builds
from kernelwright.engine.isolation import environment

LLM_FLAGS = ["-O3", "-ffast-math", "-march=native"]


@pytest.mark.parametrize(
    "flags, with_cuda, other, ok",
    [
        (LLM_FLAGS, False, {}, True),
        (["-O2", "-fopenmp", "-DUSE_FAST=1", "-Wno-unused-variable", "-std=c++20", "-mavx2", "-g"], False, {}, True),
        (["-O3", "-fplugin=/tmp/p.so"], False, {}, False),  # a shared object loaded into the compiler
        (["-O3", "-include", "/etc/passwd"], False, {}, False),
        (["-O3", "-Wl,-O1"], False, {}, False),  # linker options
        (["-I/tmp/mine"], False, {}, False),  # an include path of its own could shadow torch's headers
        (["-O3", "-specs=/tmp/s"], False, {}, False),
        (["-O3", "-fdebug-prefix-map=/a=/b"], False, {}, False),  # a path
        (LLM_FLAGS, True, {}, False),  # CUDA: the host pass through nvcc is not checked yet
        (LLM_FLAGS, False, {"extra_include_paths": ["/tmp/x"]}, False),
        (LLM_FLAGS, False, {"use_pch": False}, False),  # the candidate's own choice stands
        ("-O3", False, {}, False),  # a string, not a list: as torch reads it, not ours to guess
        ([], False, {}, True),  # torch's default flags: the empty set's header (where torch's own is not made)
        (LLM_FLAGS, False, {"use_pch": True}, False),  # torch's own header, made in its installation
    ],
)
def test_only_simple_flag_sets_get_a_header(flags, with_cuda, other, ok):
    got = flag_pch.accepted({"extra_cflags": flags, **other}, with_cuda)
    assert (got == list(flags)) if ok else got is None


def test_a_flag_set_is_recorded_at_its_first_build_and_made_at_its_second(tmp_path, monkeypatch):
    made = []

    def fake_make(flags, here):
        made.append(flags)
        (here / "torch").mkdir(exist_ok=True)
        (here / "torch" / "extension.h.gch").write_bytes(b"pch")

    monkeypatch.setattr(flag_pch, "_make", fake_make)
    monkeypatch.setattr("torch.utils.cpp_extension.check_compiler_is_gcc", lambda _c: True)
    root = tmp_path / "kw-pch"
    assert flag_pch.header_dir(LLM_FLAGS, 2, root) is None and made == []  # seen once: nothing made
    here = flag_pch.header_dir(LLM_FLAGS, 2, root)
    assert here is not None and made == [LLM_FLAGS] and (here / "torch" / "extension.h.gch").exists()
    assert flag_pch.header_dir(LLM_FLAGS, 2, root) == here and len(made) == 1  # made once
    for other in (["-O2"], ["-O1"]):  # two more sets beyond `keep` = 2: the least recently used goes
        flag_pch.header_dir(other, 2, root)
        flag_pch.header_dir(other, 2, root)
    assert len(made) == 3 and len(list(root.glob("*/torch/extension.h.gch"))) == 2
    assert not (here / "torch" / "extension.h.gch").exists()


def test_a_header_the_compiler_will_not_make_is_tried_once(tmp_path, monkeypatch):
    import subprocess

    tries = []

    def failing_make(flags, here):
        tries.append(flags)
        raise subprocess.CalledProcessError(1, ["c++"])

    monkeypatch.setattr(flag_pch, "_make", failing_make)
    monkeypatch.setattr("torch.utils.cpp_extension.check_compiler_is_gcc", lambda _c: True)
    root = tmp_path / "kw-pch"
    for _ in range(4):
        assert flag_pch.header_dir(LLM_FLAGS, 2, root) is None
    assert len(tries) == 1 and (root / flag_pch._key(LLM_FLAGS) / flag_pch.FAILED).exists()


def test_a_build_that_finds_the_header_being_made_goes_on_without_it(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr("torch.utils.cpp_extension.check_compiler_is_gcc", lambda _c: True)
    monkeypatch.setattr(flag_pch, "_make", lambda *_a: pytest.fail("made while another build holds the lock"))
    root = tmp_path / "kw-pch"
    assert flag_pch.header_dir(LLM_FLAGS, 2, root) is None
    here = root / flag_pch._key(LLM_FLAGS)
    with open(here / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert flag_pch.header_dir(LLM_FLAGS, 2, root) is None


CANDIDATE = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = "torch::Tensor f(torch::Tensor x) {{ return x {op} 1; }}"
ext = load_inline("kw_flag_pch_{tag}", SRC, functions=["f"], extra_cflags={flags!r})


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="precompiled headers: Linux and gcc only")
def test_a_build_with_torchs_default_flags_compiles_with_the_header_made_for_them(tmp_path, cpu_config):
    """torch's own precompiled header cannot be made in the trusted builder's sandbox (torch's
    installation is read-only there): a candidate with torch's default flags is built with the empty
    flag set's header, kept in the build cache (this session's: the run's controller makes it as the
    run starts, tests/conftest.py), and gcc, run with that build's own command line
    (from its build.ninja), loads it. The flag-set rule (made at a set's second build) is the test above's."""
    if cpu_config.sandbox != "bwrap":
        pytest.skip("without bubblewrap the trusted builder can write torch's installation and uses torch's own header")
    root = Path(cpu_config.cache_dir) / "builds" / flag_pch.SUBDIR
    here = root / flag_pch._key([])
    here.mkdir(parents=True, exist_ok=True)
    (here / flag_pch.SEEN).write_text("")  # seen before (that rule is the test above's)
    end = time.monotonic() + 600
    while flag_pch.header_dir([], flag_pch.DEFAULT_KEEP, root) is None:  # made here, or by another process
        assert time.monotonic() < end and not (here / flag_pch.FAILED).exists(), "no header for the default flags"
        time.sleep(1.0)
    trusted_builds.forget()
    env = environment.child_env(cpu_config, tmp_path / "tmp")
    out = trusted_builds.build(CANDIDATE.format(tag="default", op="-", flags=[]), cpu_config, tmp_path / "b", env)
    assert out.error == "" and len(out.builds) == 1 and out.builds[0]["ok"], out.builds
    gch = here / "torch" / "extension.h.gch"
    build_dir = Path(cpu_config.cache_dir) / "builds" / out.builds[0]["dir"]
    if out.builds[0]["cached"]:  # built by an earlier run on this cache: its build.ninja is the one to read
        assert (build_dir / "build.ninja").exists()
    else:
        assert out.builds[0]["pch"] == "flags" and gch.exists()
    ninja = (build_dir / "build.ninja").read_text()
    cflags = re.search(r"^cflags = (.*)$", ninja, re.M).group(1)
    post = re.search(r"^post_cflags = (.*)$", ninja, re.M).group(1)
    cxx = re.search(r"^cxx = (.*)$", ninja, re.M).group(1)
    assert f"-I{here}" in cflags
    res = subprocess.run(
        [*shlex.split(cxx), *shlex.split(cflags), "-H", "-fsyntax-only", "main.cpp", *shlex.split(post)],
        cwd=build_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"! {gch}" in res.stderr, res.stderr[:2000]  # gcc's mark for a precompiled header it used
    trusted_builds.forget()
