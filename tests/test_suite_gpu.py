"""`kernelwright suite eval` on the GPU: one-kernel CUDA candidates (the suite-throughput
benchmark's), built ahead on the CPU by the BuildPool, so each evaluation finds its extension
in the cache; the verdicts equal one `kernelwright eval` each."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks import suite_throughput
from kernelwright.cli.main import app


@pytest.mark.gpu
def test_suite_eval_of_cuda_candidates_prebuilds_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_CACHE", str(tmp_path / "cache"))  # cold: every candidate is built here
    probs, cands = suite_throughput.write_suite(tmp_path / "suite", 4, "cuda", 1024)
    out = CliRunner().invoke(
        app,
        [
            "suite",
            "eval",
            str(probs),
            str(cands),
            "--device",
            "cuda",
            "--trials",
            "3",
            "--name",
            "gpu",
            "--out",
            str(tmp_path / "out"),
            "--store",
            str(tmp_path / "kw.db"),
            "--build-workers",
            "2",
        ],
    )
    assert out.exit_code == 0, out.output
    records = {
        p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out").glob("level1/*/000_*/eval.json")
    }
    assert len(records) == 4 and all(r["status"] == "passed" for r in records.values()), records
    # the BuildPool built each extension ahead: the evaluation only imports it from the cache
    for name, rec in records.items():
        builds = rec["metadata"].get("builds", [])
        assert builds and all(b.get("cached") for b in builds), (name, builds)
    one = CliRunner().invoke(
        app,
        [
            "eval",
            str(probs / "1_affine_relu_1.py"),
            str(cands / "1_affine_relu_1.py"),
            "--device",
            "cuda",
            "--trials",
            "3",
            "--json",
        ],
    )
    assert json.loads(one.output)["status"] == records["1_affine_relu_1"]["status"]
