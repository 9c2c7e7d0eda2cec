"""The key of a `load()` build covers every file the build reads (engine/child/build_inputs.py):
a header that changes between two builds of the same source changes the key, so a trusted build
made with one header is never loaded for the same source beside another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from kernelwright.engine.child import build_inputs

SOURCE = """#include <pybind11/pybind11.h>
#include "kw_value.h"
int value() { return KW_VALUE; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }
"""

# one process of each side: the trusted builder (publish) and an evaluation that loads only the
# builder's verified artefacts (private_root), as engine/extensions/trusted_builds.py runs them
BUILD = """
import json, os, sys
from kernelwright.engine.child import build
root, folder, side = sys.argv[1], sys.argv[2], sys.argv[3]
if side == "trusted":
    build.install_build_cache(root, None, publish=True)
else:
    verified = json.loads(sys.argv[4])
    build.install_build_cache(root, None, verified=verified, private_root=os.path.join(folder, "private"))
from torch.utils.cpp_extension import load
module = load(name="kw_header_key", sources=[os.path.join(folder, "ext.cpp")])
(entry,) = build.BUILD_LOG
print(json.dumps({"value": module.value() if module else None, "dir": entry["dir"], "key": entry["key"],
                  "sha256": entry.get("sha256"), "cache": entry.get("cache")}))
"""


def _sources(folder: Path, value: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "ext.cpp").write_text(SOURCE)
    (folder / "kw_value.h").write_text(f"#define KW_VALUE {value}\n")
    return folder


def _build(root: Path, folder: Path, side: str, verified: dict | None = None) -> dict:
    argv = [sys.executable, "-c", BUILD, str(root), str(folder), side, json.dumps(verified or {})]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_trusted_build_with_one_header_is_not_loaded_beside_another(tmp_path):
    root = tmp_path / "builds"
    trusted = _build(root, _sources(tmp_path / "a", 1), "trusted")
    verified = {Path(trusted["dir"]).name: trusted["sha256"]}
    same = _build(root, _sources(tmp_path / "b", 1), "evaluation", verified)
    assert same["key"] == trusted["key"] and same["cache"] == "verified" and same["value"] == 1  # shared
    other = _build(root, _sources(tmp_path / "c", 2), "evaluation", verified)
    assert other["key"] != trusted["key"] and other["cache"] == "private"
    assert other["value"] == 2  # its own header's, not the one baked into the trusted build


@pytest.mark.slow
def test_the_included_files_are_the_preprocessors(tmp_path):
    """A header through a quoted include, a search path and a macro; torch's and the system's
    left to the toolchain's fingerprint; names relative to the source's folder."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "deep.h").write_text("#define DEEP 1\n")
    (tmp_path / "kw.h").write_text('#include "deep.h"\n#define PICK "picked.h"\n')
    (tmp_path / "picked.h").write_text("int picked;\n")
    src = tmp_path / "ext.cpp"
    src.write_text('#include <torch/extension.h>\n#include <vector>\n#include "kw.h"\n#include PICK\n')
    files = build_inputs.included_files(str(src), {"extra_include_paths": [str(tmp_path / "inc")]}, False)
    assert isinstance(files, list), files
    assert [name for name, _ in files] == ["kw.h", "inc/deep.h", "picked.h"]
    before = dict(files)
    (tmp_path / "inc" / "deep.h").write_text("#define DEEP 2\n")
    after = dict(build_inputs.included_files(str(src), {"extra_include_paths": [str(tmp_path / "inc")]}, False))
    assert after["inc/deep.h"] != before["inc/deep.h"] and after["kw.h"] == before["kw.h"]


def test_a_source_the_preprocessor_cannot_read_gets_a_key_of_its_own(tmp_path):
    src = tmp_path / "ext.cpp"
    src.write_text('#error "not this one"\n')
    first = build_inputs.included_files(str(src), {}, False)
    assert isinstance(first, str) and first != build_inputs.included_files(str(src), {}, False)


def test_flags_that_change_what_is_read_are_kept():
    kept = build_inputs._kept(["-O3", "-DX=1", "-I", "/inc", "-Wall", "-std=c++20"])
    assert kept == ["-DX=1", "-I", "/inc", "-std=c++20"]
    assert build_inputs._kept("-O2 -include pre.h -UNDEBUG") == ["-include", "pre.h", "-UNDEBUG"]
    assert build_inputs._dependencies("x.o: x.cpp a.h \\\n b\\ c.h\n") == ["x.cpp", "a.h", "b c.h"]
