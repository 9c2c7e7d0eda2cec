"""The runner's output files: memory-backed where the machine has room, spilled to the disk when
it is full, each read once by the judge and removed, nothing left behind after an evaluation."""

from __future__ import annotations

import errno

import torch

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate, evaluation
from kernelwright.engine.child import wire
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.runner import Runner

from conftest import ADD_ONE, CANDIDATES


def _ours() -> set[str]:
    return {p.name for p in evaluation.SHM.glob("kw-out-*")} if evaluation.SHM.is_dir() else set()


def test_an_evaluation_leaves_no_output_directory_behind(cpu_config):
    before = _ours()
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert _ours() == before


def test_a_full_memory_directory_spills_the_output_to_the_disk(tmp_path, monkeypatch):
    fast, disk = tmp_path / "fast", tmp_path / "disk"
    fast.mkdir()
    disk.mkdir()
    real = wire.write_tree

    def full(path, obj):
        if str(path).startswith(str(fast)):
            open(path, "wb").close()  # a partial file, as a full tmpfs leaves
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj)

    monkeypatch.setattr(wire, "write_tree", full)
    runner = Runner({"config": EvalConfig(device="cpu").to_dict(), "out_dir": str(fast), "spill_dir": str(disk)},
                    Channel(None))
    name = runner.write("trial0", torch.ones(3))
    assert not (fast / name).exists() and (disk / name).is_file()
    assert torch.equal(wire.read_tree(str(disk / name)), torch.ones(3))
