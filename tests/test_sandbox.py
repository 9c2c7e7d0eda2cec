"""With bubblewrap, a candidate cannot write outside its directory or reach the network."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import uuid

import pytest

from kernelwright.engine import EngineError, evaluate, sandbox
from kernelwright.core.record import Stage, Status

from conftest import FIXTURES

ADD_ONE = FIXTURES / "problems" / "add_one.py"


def _bwrap_reason() -> str:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    try:
        sandbox.resolve("bwrap")
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return ""


needs_bwrap = pytest.mark.skipif(bool(_bwrap_reason()), reason=_bwrap_reason() or "bwrap available")

CANDIDATE = '''import torch
import torch.nn as nn

{attempt}


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0
'''


def _eval(cfg, attempt: str, mode: str):
    cfg.sandbox = mode
    cfg.time_candidate = False
    return evaluate(ADD_ONE, None, cfg, candidate_text=CANDIDATE.format(attempt=attempt))


@needs_bwrap
def test_auto_picks_bwrap_and_records_it(cpu_config):
    r = evaluate(ADD_ONE, FIXTURES / "candidates" / "py_correct.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.sandbox == "bwrap"


@needs_bwrap
@pytest.mark.parametrize("where", ["tmp", "home"])
def test_write_outside_the_workdir_fails_in_the_sandbox(cpu_config, tmp_path, where):
    if where == "tmp":
        target = tmp_path / f"escaped-{uuid.uuid4().hex}"  # a directory of the caller under /tmp
    else:
        target = os.path.join(os.path.expanduser("~"), f".kw-escaped-{uuid.uuid4().hex}")
    attempt = f"open({str(target)!r}, 'w').write('pwned')"
    try:
        r = _eval(cpu_config, attempt, "bwrap")
        assert not os.path.exists(target)
        assert r.status is Status.RUNTIME_ERROR and r.error_stage is Stage.BUILD
        assert ("Read-only file system" in r.error_log or "No such file or directory" in r.error_log), r.error_log
        assert r.sandbox == "bwrap"
        # the control: without the sandbox the same write lands
        r = _eval(cpu_config, attempt, "none")
        assert r.status is Status.PASSED and os.path.exists(target)
    finally:
        if os.path.exists(target):
            os.remove(target)


@needs_bwrap
def test_network_is_unreachable_in_the_sandbox(cpu_config):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        server.settimeout(60)
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(1)
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    attempt = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
    try:
        r = _eval(cpu_config, attempt, "bwrap")
        assert r.status is Status.RUNTIME_ERROR and "ConnectionRefusedError" in r.error_log, r.error_log
        assert not accepted
        r = _eval(cpu_config, attempt, "none")  # the control: the host's loopback is reachable without it
        assert r.status is Status.PASSED and accepted
    finally:
        server.close()


@needs_bwrap
def test_timeout_still_kills_the_sandboxed_child(cpu_config):
    cpu_config.sandbox = "bwrap"
    r = evaluate(ADD_ONE, FIXTURES / "candidates" / "py_infinite_loop.py", cpu_config)
    assert r.status is Status.TIMEOUT and r.sandbox == "bwrap"


def test_bwrap_mode_without_bwrap_is_an_engine_error(cpu_config, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    cpu_config.sandbox = "bwrap"
    with pytest.raises(EngineError, match="bubblewrap"):
        evaluate(ADD_ONE, FIXTURES / "candidates" / "py_correct.py", cpu_config)
    assert sandbox.resolve("auto") == "none"
