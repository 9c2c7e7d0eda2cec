"""The runner's output files: memory-backed where the machine has room, spilled to the disk when
it is full, each read once by the judge and removed, nothing left behind after an evaluation."""

from __future__ import annotations

import errno
import os

import torch

from conftest import ADD_ONE, CANDIDATES
from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate, evaluation, runner_fork
from kernelwright.engine.child import wire
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.runner import Runner


def _ours() -> set[str]:
    """This process's evaluations' output directories (named for its pid): other evaluators on the
    machine may create and remove theirs meanwhile. The forked runners' base folder is not one: it
    lives as long as the process, and their evaluations' directories lie inside it (engine/runner_fork.py)."""
    if not evaluation.SHM.is_dir():
        return set()
    bases = {s.out_base for s in runner_fork._SETS.values() if s.out_base is not None}
    top = set(evaluation.SHM.glob(f"kw-out-{os.getpid()}-*")) - bases
    return {str(p) for p in top} | {str(p) for base in bases for p in base.glob("kw-out-*")}


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

    def full(path, obj, ship=None):
        if str(path).startswith(str(fast)):
            open(path, "wb").close()  # a partial file, as a full tmpfs leaves
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj, ship=ship)

    monkeypatch.setattr(wire, "write_tree", full)
    runner = Runner(
        {"config": EvalConfig(device="cpu").to_dict(), "out_dir": str(fast), "spill_dir": str(disk)}, Channel(None)
    )
    name = runner.write("trial0", torch.ones(3))
    assert not (fast / name).exists() and (disk / name).is_file()
    assert torch.equal(wire.read_tree(str(disk / name)), torch.ones(3))


# ---- bytes sent beside the file (the device hand-off's format; the transport is tested on the GPU) ----


class _Beside:
    """Stands in for the device hand-off: keeps what the writer ships, hands it to the reader."""

    def __init__(self, accept=lambda i, t: True):
        self.sent: dict[int, torch.Tensor] = {}
        self.accept = accept

    def ship(self, i, t):
        if not self.accept(i, t):
            return False
        self.sent[i] = t.detach().contiguous().reshape(-1).view(torch.uint8).clone()
        return True

    def fetch(self, i, n):
        got = self.sent.pop(i)
        if got.numel() != n:
            raise wire.WireError("size differs")
        return got


def test_leaves_sent_beside_the_file_are_not_in_it_and_come_back_exact(tmp_path):
    out = (torch.arange(12, dtype=torch.float32).reshape(3, 4), {"mask": torch.tensor([True, False])}, 7)
    side = _Beside()
    path = str(tmp_path / "o.kwt")
    n = wire.write_tree(path, out, ship=side.ship)
    header = open(path, "rb").readline()
    assert n == len(header)  # every tensor went beside the file: the file holds the header only
    back = wire.read_tree(path, fetch=side.fetch)
    assert torch.equal(back[0], out[0]) and torch.equal(back[1]["mask"], out[1]["mask"]) and back[2] == 7


def test_a_file_that_names_leaves_beside_it_is_refused_by_a_reader_that_expects_none(tmp_path):
    side = _Beside()
    path = str(tmp_path / "o.kwt")
    wire.write_tree(path, torch.ones(4), ship=side.ship)
    try:
        wire.read_tree(path)
    except wire.WireError as exc:
        assert "beside" in str(exc)
    else:
        raise AssertionError("a hand-off the reader did not ask for was accepted")


def test_a_leaf_the_writer_keeps_goes_into_the_file(tmp_path):
    side = _Beside(accept=lambda i, t: i == 1)  # the hand-off refused the first leaf (say: no driver)
    path = str(tmp_path / "o.kwt")
    a, b = torch.full((1000,), 2.0), torch.full((5,), 3.0)
    wire.write_tree(path, (a, b), ship=side.ship)
    back = wire.read_tree(path, fetch=side.fetch)
    assert torch.equal(back[0], a) and torch.equal(back[1], b)


def test_announced_bytes_beside_the_file_count_against_the_cap(tmp_path):
    import json

    path = tmp_path / "o.kwt"
    tree = {"tensor": 0, "class": "Tensor", "dtype": "uint8", "shape": [1 << 30], "device": "cuda"}
    path.write_bytes(json.dumps({"tree": tree, "sizes": [1 << 30], "handoff": [0]}).encode() + b"\n")
    asked = []
    try:
        wire.read_tree(str(path), max_bytes=1 << 20, fetch=lambda i, n: asked.append(n))
    except wire.WireError as exc:
        assert "limit" in str(exc)
    else:
        raise AssertionError("a gigabyte announced beside the file was accepted")
    assert not asked  # refused before anything was received


def test_a_hand_off_list_that_names_no_leaf_is_refused(tmp_path):
    import json

    path = tmp_path / "o.kwt"
    tree = {"tensor": 0, "class": "Tensor", "dtype": "uint8", "shape": [0], "device": "cpu"}
    for bad in ([5], ["0"], {"0": 1}):
        path.write_bytes(json.dumps({"tree": tree, "sizes": [0], "handoff": bad}).encode() + b"\n")
        try:
            wire.read_tree(str(path), fetch=lambda i, n: torch.empty(n, dtype=torch.uint8))
        except wire.WireError:
            continue
        raise AssertionError(f"hand-off list {bad!r} accepted")


def test_an_input_file_changed_in_the_runners_directory_is_the_candidates_fault(tmp_path):
    """The judge's input files lie where the candidate may write: one that no longer reads as the
    judge wrote it (grown, cut) is a runtime error of the candidate, never an engine error."""
    import pytest

    from kernelwright.engine.child.runner import Stop

    sent: list[tuple[str, dict]] = []

    class _Chan(Channel):
        def send(self, kind, **fields):
            sent.append((kind, fields))

    runner = Runner({"config": EvalConfig(device="cpu").to_dict(), "out_dir": str(tmp_path)}, _Chan(None))
    runner.device = torch.device("cpu")
    wire.write_tree(str(tmp_path / "in_000.kwt"), [torch.ones(1000)])
    with open(tmp_path / "in_000.kwt", "ab") as f:
        f.write(b"\0" * 4096)  # grown after the judge wrote it
    with pytest.raises(Stop):
        runner.read_inputs("in_000.kwt")
    (kind, fields), *_ = sent
    assert kind == "failure" and fields["status"] == "runtime_error"
    assert "in_000.kwt was changed" in fields["log"]
