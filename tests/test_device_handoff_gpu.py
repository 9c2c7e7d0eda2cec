"""CUDA outputs reach the judge on the device (`engine/child/device_handoff.py`): exact bytes,
across processes and PID namespaces, nothing the runner's side sends taken on trust."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import EXAMPLES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import device_handoff

pytestmark = pytest.mark.gpu

CUDA_EXAMPLE = EXAMPLES / "cuda_swish"

_SENDER = textwrap.dedent("""
    import socket, sys, torch
    from kernelwright.engine.child import device_handoff
    sock = socket.socket(fileno=int(sys.argv[1]))
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda").reshape(1024, 1024) * 0.5
    for tag, t in [("forged#0#16", torch.zeros(4, device="cuda")), ("out_001#0#4194304", x),
                   ("small#0#1024", torch.ones(256, device="cuda"))]:
        device_handoff.send(sock, tag, t)
    print("sent", flush=True)
    sys.stdin.readline()  # the receiver maps after this process could have exited: it need not stay
""")


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return a, b


def _sender(sock_end: socket.socket, prefix: list[str] | None = None) -> subprocess.Popen:
    fd = sock_end.detach()
    env = dict(os.environ)
    proc = subprocess.Popen(
        (prefix or []) + [sys.executable, "-c", _SENDER, str(fd)],
        pass_fds=(fd,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(fd)
    assert proc.stdout.readline().strip() == "sent"
    return proc


def test_a_device_output_crosses_to_another_process_exactly_and_forged_tags_are_skipped():
    dev = torch.device("cuda")
    torch.empty(1, device=dev)
    assert device_handoff.probe(dev) == ""
    mine, theirs = _pair()
    proc = _sender(theirs)
    proc.stdin.close()
    proc.wait(timeout=30)  # the sender is gone: the memory lives on in the descriptor in flight
    got = device_handoff.receive(mine, "out_001#0#4194304", 4 << 20, dev)
    want = torch.arange(1 << 20, dtype=torch.float32, device=dev).reshape(1024, 1024) * 0.5
    assert got.device.type == "cuda" and torch.equal(got.view(torch.float32).reshape(1024, 1024), want)
    # the next message is 1 KiB: announcing more than was sent is refused by the driver's mapping
    with pytest.raises(device_handoff.HandoffError, match="smaller than announced"):
        device_handoff.receive(mine, "small#0#1024", 64 << 20, dev)


def test_the_judges_self_test_imports_its_own_export_intact():
    assert device_handoff.self_test(torch.device("cuda")) == ""


def test_a_descriptor_that_is_not_device_memory_is_never_imported(tmp_path):
    dev = torch.device("cuda")
    mine, theirs = _pair()
    f = tmp_path / "plain"
    f.write_bytes(b"\0" * 4096)
    fd = os.open(f, os.O_RDONLY)
    theirs.sendmsg([b"out_002#0#4096"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
    os.close(fd)
    with pytest.raises(device_handoff.HandoffError, match="not device memory"):
        device_handoff.receive(mine, "out_002#0#4096", 4096, dev)


def test_an_announced_output_that_never_arrives_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(device_handoff, "RECV_TIMEOUT_S", 0.5)
    mine, theirs = _pair()
    with pytest.raises(device_handoff.HandoffError, match="sent none"):
        device_handoff.receive(mine, "out_003#0#16", 16, torch.device("cuda"))


def test_the_hand_off_works_from_a_fresh_pid_namespace():
    unshare = shutil.which("unshare")
    # A PID namespace with its own /proc, as bubblewrap makes one: without --mount-proc the
    # namespace sees the host's /proc, and the CUDA driver fails to start there at all (error 304,
    # seen on the H100), which says nothing about the hand-off.
    flags = ["--pid", "--fork", "--mount-proc"]
    if unshare is None or subprocess.run([unshare, *flags, "true"], capture_output=True).returncode:
        pytest.skip("no PID namespace with its own /proc can be made here")
    mine, theirs = _pair()
    proc = _sender(theirs, [unshare, *flags, "--kill-child"])
    try:
        got = device_handoff.receive(mine, "out_001#0#4194304", 4 << 20, torch.device("cuda"))
        assert float(got.view(torch.float32)[-1]) == ((1 << 20) - 1) * 0.5
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_an_evaluation_moves_its_cuda_outputs_on_the_device(cuda_config, sandbox):
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed here")
    cuda_config.sandbox = sandbox
    cuda_config.device_handoff = True
    r = evaluate(CUDA_EXAMPLE / "problem.py", CUDA_EXAMPLE / "candidate.py", cuda_config)
    assert r.status is Status.PASSED, r.error_log
    assert "device_handoff_off" not in r.metadata, r.metadata.get("device_handoff_off")
    assert r.metadata["judge_busy_s"].get("device_handoff", 0) > 0
