"""KernelBench problems by level and id: `kernelwright eval level1/19 CANDIDATE --kernelbench PATH`
from a local checkout, and from KernelBench's dataset through `datasets` (a small local file the
test writes, in the dataset's columns); bad ids and sources are one line, exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES, ROOT
from kernelwright.cli.kernelbench import parse_id
from kernelwright.store.queries import default_store

needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs the datasets package")


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *args], capture_output=True, text=True, env=env, timeout=120
    )


def checkout(root: Path) -> Path:
    """KernelBench's layout: the repository, its KernelBench/ folder, one folder per level."""
    level1 = root / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    (level1 / "19_ReLU.py").write_text(ADD_ONE.read_text())
    (level1 / "1_Square_matrix_multiplication_.py").write_text("raise SystemExit('not this one')\n")
    return root


def test_ids_are_level_slash_number():
    assert parse_id("level1/19") == (1, 19) and parse_id("level_2/5") == (2, 5)
    assert parse_id("19") is None and parse_id("level1/19_ReLU.py") is None


@pytest.mark.slow
def test_eval_by_id_from_a_local_checkout(tmp_path):
    repo = checkout(tmp_path / "kb")
    for source in (repo, repo / "KernelBench"):  # the repository, or its KernelBench/ folder
        out = cli(
            "eval",
            "level1/19",
            str(CANDIDATES / "py_correct.py"),
            "--kernelbench",
            str(source),
            "--device",
            "cpu",
            "--json",
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["status"] == "passed"
    missing = cli("eval", "level1/42", str(CANDIDATES / "py_correct.py"), "--kernelbench", str(repo), "--device", "cpu")
    assert missing.returncode == 2 and "no problem 42" in missing.stderr and "Traceback" not in missing.stderr
    no_flag = cli("eval", "level1/19", str(CANDIDATES / "py_correct.py"), "--device", "cpu")
    assert no_flag.returncode == 2 and "needs --kernelbench" in no_flag.stderr


@needs_datasets
def test_eval_by_id_from_the_dataset_format(tmp_path):
    rows = [
        {"code": ADD_ONE.read_text(), "level": 1, "name": "19_ReLU", "problem_id": 19},
        {"code": "raise SystemExit(3)\n", "level": 2, "name": "19_Other", "problem_id": 19},
    ]
    data = tmp_path / "kernelbench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli(
        "eval", "level1/19", str(CANDIDATES / "py_correct.py"), "--kernelbench", str(data), "--device", "cpu", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "passed"
    (written,) = (default_store().parent / "kernelbench").rglob("*.py")  # beside the store: this test's own
    assert written.name == "19_ReLU.py" and written.parent.name == "level1" and written.read_text() == rows[0]["code"]
    wrong = cli("eval", "level3/1", str(CANDIDATES / "py_correct.py"), "--kernelbench", str(data), "--device", "cpu")
    assert wrong.returncode == 2 and "no problem 1 in level 3" in wrong.stderr
