"""The device hand-off's socket protocol, on the CPU: the judge takes only the descriptor whose tag
it expects, closes every other one the runner's side sent, and never waits forever. (The driver's
part, exporting and importing device memory, is in test_device_handoff_gpu.py.)"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from kernelwright.engine.child import device_handoff


def _send(sock: socket.socket, tag: bytes, path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        sock.sendmsg([tag], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
    finally:
        os.close(fd)


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_only_the_expected_tag_is_imported_and_every_other_descriptor_is_closed(tmp_path, monkeypatch):
    judge_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    files = {}
    for name in ("forged", "stale", "right"):
        files[name] = tmp_path / name
        files[name].write_bytes(name.encode())
    imported = []

    def fake_import(fd, nbytes, device):
        imported.append(os.read(fd, 100))
        return torch.zeros(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(device_handoff, "_import", fake_import)
    before = _open_fds()
    _send(runner_end, b"out_001_trial0.kwt#0#16", files["stale"])  # an output the judge never read
    _send(runner_end, b"out_002_trial1.kwt#0#16\x00junk", files["forged"])  # near miss: not the tag
    runner_end.sendmsg([b"no descriptor at all"])
    _send(runner_end, b"out_002_trial1.kwt#0#16", files["right"])
    got = device_handoff.receive(judge_end, "out_002_trial1.kwt#0#16", 16, torch.device("cpu"))
    assert imported == [b"right"] and got.numel() == 16
    assert _open_fds() == before  # the skipped descriptors (and the imported one) are closed


def test_a_message_with_many_descriptors_keeps_none_of_the_extras(tmp_path, monkeypatch):
    judge_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    f = tmp_path / "x"
    f.write_bytes(b"x")
    fds = [os.open(f, os.O_RDONLY) for _ in range(8)]
    runner_end.sendmsg(
        [b"t#0#1"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(x.to_bytes(4, "little") for x in fds))]
    )
    for x in fds:
        os.close(x)
    monkeypatch.setattr(device_handoff, "_import", lambda fd, n, d: torch.zeros(n, dtype=torch.uint8))
    before = _open_fds()
    device_handoff.receive(judge_end, "t#0#1", 1, torch.device("cpu"))
    assert _open_fds() == before


def test_an_output_that_never_comes_is_an_error_within_the_time_limit(monkeypatch):
    monkeypatch.setattr(device_handoff, "RECV_TIMEOUT_S", 0.3)
    judge_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with pytest.raises(device_handoff.HandoffError, match="sent none"):
        device_handoff.receive(judge_end, "t#0#4", 4, torch.device("cpu"))
    runner_end.close()
    with pytest.raises(device_handoff.HandoffError, match="closed"):
        device_handoff.receive(judge_end, "t#0#4", 4, torch.device("cpu"))


def test_a_flood_of_wrong_tags_ends_the_search(tmp_path, monkeypatch):
    monkeypatch.setattr(device_handoff, "MAX_SKIPPED", 5)
    judge_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for i in range(6):
        runner_end.sendmsg([f"other#{i}".encode()])
    with pytest.raises(device_handoff.HandoffError, match="no device output tagged"):
        device_handoff.receive(judge_end, "t#0#4", 4, torch.device("cpu"))


def test_without_a_gpu_driver_the_runner_is_told_why_and_writes_files():
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU driver")
    device_handoff._DRIVER.clear()
    why = device_handoff.probe(torch.device("cpu"))
    assert "libcuda" in why


def test_a_lost_device_output_is_the_candidates_fault_unless_the_judges_own_import_failed(monkeypatch):
    """The runner's side is untrusted: an output that cannot be received is the candidate's (its trial
    unreadable), unless the judge's own export-and-import self-test failed at start-up: then the
    machine cannot do it, and the judge stops with an engine error, never blaming the candidate."""
    from kernelwright.engine.child.channel import Channel
    from kernelwright.engine.child.judge import HandoffUnavailable, Judge
    from kernelwright.engine.child.wire import WireError

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    judge = Judge({"config": {"device": "cpu"}}, Channel(os.open(os.devnull, os.O_WRONLY)), theirs.detach())
    judge.device = torch.device("cuda")  # (receive is faked: nothing touches a GPU)

    def lost(*_args, **_kw):
        raise device_handoff.HandoffError("the runner announced an output on the device but sent none")

    monkeypatch.setattr(device_handoff, "receive", lost)
    fetch = judge.fetcher("trial0")
    with pytest.raises(WireError, match="sent none"):
        fetch(0, 16)
    judge.handoff_self_test = "Unavailable: cuMemImportFromShareableHandle failed: CUDA_ERROR_NOT_SUPPORTED (801)"
    with pytest.raises(HandoffUnavailable, match="judge cannot import device outputs on this machine"):
        fetch(0, 16)
    ours.close()
