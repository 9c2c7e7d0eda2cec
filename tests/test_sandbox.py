"""With bubblewrap, a candidate cannot write outside its directory, reach the network or the host's
Unix sockets, outlive its evaluation or exceed the memory limit."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES, FIXTURES
from kernelwright.core.record import Stage, Status
from kernelwright.engine import EngineError, evaluate
from kernelwright.engine.config_resolution import resolve_config
from kernelwright.engine.isolation import environment, leftovers, sandbox


def _bwrap_reason() -> str:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    try:
        sandbox.resolve("bwrap")
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return ""


needs_bwrap = pytest.mark.skipif(bool(_bwrap_reason()), reason=_bwrap_reason() or "bwrap available")

CANDIDATE = """import torch
import torch.nn as nn

{attempt}


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0
"""


def _eval(cfg, attempt: str, mode: str):
    cfg.sandbox = mode
    cfg.time_candidate = False
    return evaluate(ADD_ONE, None, cfg, candidate_text=CANDIDATE.format(attempt=attempt))


@needs_bwrap
def test_auto_picks_bwrap_and_records_it(cpu_config):
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config)
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
        assert "Read-only file system" in r.error_log or "No such file or directory" in r.error_log, r.error_log
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
    cpu_config.timeouts.correctness = 6  # the judge's own work on this tiny problem takes well under a second
    r = evaluate(ADD_ONE, CANDIDATES / "py_infinite_loop.py", cpu_config)
    assert r.status is Status.TIMEOUT and r.sandbox == "bwrap"


def test_bwrap_mode_without_bwrap_is_an_engine_error(cpu_config, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    cpu_config.sandbox = "bwrap"
    with pytest.raises(EngineError, match="bubblewrap"):
        resolve_config(cpu_config)  # at the entry point, before any child starts
    assert sandbox.resolve("auto") == "none"


def _attack(name: str, **fill: object) -> str:
    text = (FIXTURES / "host_attacks" / f"{name}.py").read_text()
    for key, value in fill.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    return text


def _socket_dir(parent: str):
    """A fresh directory under `parent` (outside /tmp, /var/tmp and $HOME), or None when not writable here."""
    if not os.access(parent, os.W_OK):
        return None
    d = os.path.join(parent, f"kw-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(d)
    return d


@needs_bwrap
@pytest.mark.parametrize("parent", ["/run", "/var/lib"])
def test_host_unix_sockets_are_unreachable_in_the_sandbox(cpu_config, parent):
    d = _socket_dir(parent)
    if d is None:
        pytest.skip(f"{parent} is not writable by this user")
    path = os.path.join(d, "daemon.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    got: list[bytes] = []

    def serve():
        server.settimeout(120)
        try:
            while True:
                conn, _ = server.accept()
                got.append(conn.recv(16))
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    cpu_config.time_candidate = False
    try:
        cpu_config.sandbox = "bwrap"
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("unix_socket", socket=path))
        assert r.status is Status.RUNTIME_ERROR and r.error_stage is Stage.BUILD, r.error_log
        assert "ConnectionRefusedError" in r.error_log or "FileNotFoundError" in r.error_log, r.error_log
        assert not got
        cpu_config.sandbox = "none"  # the control: the socket is reachable without the sandbox
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("unix_socket", socket=path))
        assert r.status is Status.PASSED and got == [b"pwned"], r.error_log
    finally:
        server.close()
        shutil.rmtree(d, ignore_errors=True)


@needs_bwrap
def test_no_process_outlives_a_sandboxed_evaluation(cpu_config, tmp_path):
    marker, token = tmp_path / "escaped", f"kw-escape-{uuid.uuid4().hex}"
    cpu_config.sandbox, cpu_config.time_candidate = "bwrap", False
    # the marker lies under /tmp, hidden in the sandbox: the grandchild writes to the sandbox's own
    # (empty, read-only) /tmp and fails; what matters is that it is gone when the evaluation ends
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("setsid_grandchild", marker=marker, token=token))
    assert r.status is Status.PASSED, r.error_log
    import glob

    left = [p for p in glob.glob("/proc/[0-9]*/cmdline") if _reads(p) and token.encode() in _reads(p)]
    assert not left, left


def _reads(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.slow
@needs_bwrap
def test_the_memory_limit_holds_in_the_sandbox(cpu_config):
    cpu_config.sandbox, cpu_config.time_candidate, cpu_config.memory_limit_mb = "bwrap", False, 2048
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("memory_hog", gib=4))
    assert r.status is Status.RUNTIME_ERROR, r.error_log
    assert r.error_log.startswith("The evaluation's memory limit is 2048 MiB"), r.error_log
    assert r.metadata["isolation"]["sandbox"] == "bwrap" and r.metadata["isolation"]["pid_namespace"]


@pytest.mark.slow
@needs_bwrap
def test_the_judges_compiler_caches_are_out_of_the_runners_reach(cpu_config, tmp_path):
    """The runner's Triton/CUDA caches lie in its own directory; the judge's (its compiler caches,
    where torch.compile of the reference would find its kernels, and the JSON it reads back: device
    peaks, the reference's FLOP count) lie in the user's cache, which the runner's sandbox does not
    write."""
    cpu_config.cache_dir, cpu_config.sandbox = str(tmp_path / "cache"), "bwrap"
    judge = tmp_path / "cache" / environment.JUDGE_CACHE_SUBDIR
    # an honest evaluation first: the judge caches its device peaks and the reference's FLOP count
    assert evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config).status is Status.PASSED
    cached = {p: p.read_text() for p in judge.rglob("*.json")}
    # (the measured peaks are dropped again where the reference beat their floor: a loaded machine)
    assert "reference_work" in {p.parent.name for p in cached}, cached
    assert {p.parent.name for p in cached} <= {"device_peaks", "reference_work"}, cached
    cpu_config.time_candidate = False
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("plant_judge_cache", cache=tmp_path / "cache"))
    assert r.status is Status.PASSED, r.error_log
    assert not list(judge.rglob("planted*"))
    assert {p: p.read_text() for p in cached} == cached  # what the judge wrote, as it wrote it
    assert {p.parent.name for p in judge.rglob("*.json")} <= {"device_peaks", "reference_work"}
    assert not (tmp_path / "cache" / "triton").exists()  # (its own took the plant: else it raised)
    env = environment.judge_env(environment.child_env(cpu_config, tmp_path / "t"), cpu_config, tmp_path / "j")
    for var in ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[var].startswith(str(judge) + os.sep), (var, env[var])
    assert env["TMPDIR"] == str(tmp_path / "j")


@needs_bwrap
def test_the_users_evaluation_server_takes_no_job_from_inside_the_sandbox(cpu_config, tmp_path):
    """A job from inside the sandbox (a candidate of the attacker's, with `sandbox: none`) would run
    outside every sandbox. Here the server listens in the user's cache directory (by default it
    does not); the server takes jobs only from its own namespaces, and the sandbox covers the
    sockets it finds in the directories it binds."""
    import threading

    from kernelwright.executors import eval_server

    marker = tmp_path / "escaped"
    cpu_config.cache_dir, cpu_config.sandbox, cpu_config.time_candidate = str(tmp_path / "cache"), "bwrap", False
    server = eval_server.EvalServer(cpu_config, path=tmp_path / "cache" / "serve" / "eval-cpu.sock", spares=0)
    served: list = []
    thread = threading.Thread(target=server.serve_forever, args=(served.append,), daemon=True)
    thread.start()
    try:
        attack = _attack("reach_the_eval_server", marker=marker, socket=server.path, cache=tmp_path / "cache")
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=attack)
    finally:
        server.stop()
        thread.join(30)
    assert r.status is Status.PASSED, r.error_log
    assert not marker.exists() and served == []


@pytest.mark.slow
def test_links_left_by_the_candidate_do_not_turn_the_copies_on_the_user(cpu_config, tmp_path, monkeypatch):
    """The parent copies the judge's first inputs into the runner's directory for the profiler: it
    neither follows a link the candidate left there (a clobber of the user's file) nor reads the
    user's file through a link that replaced the judge's input (handed to candidate code next)."""
    victim, secret = tmp_path / "victim", tmp_path / "secret"
    victim.write_text("the user's file")
    secret.write_text("TOKEN-4f2a")
    # the parent's copy is the same in either mode: the machine's sandbox (no other process in it)
    cpu_config.sandbox, cpu_config.keep_workdir = ("none" if _bwrap_reason() else "bwrap"), True
    cpu_config.profile.enabled = True  # the copy is made for the profiler's child
    cpu_config.cache_dir = str(tmp_path / "cache")
    made: list[Path] = []
    make_dir = leftovers.make_dir
    monkeypatch.setattr(leftovers, "make_dir", lambda *a, **k: made.append(make_dir(*a, **k)) or made[-1])
    try:
        text = _attack("clobber_through_links", victim=victim, secret=secret)
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
        assert r.status is Status.PASSED, r.error_log
        assert victim.read_bytes() == b"the user's file"
        # (a forked runner's directory lies in its zygote's base, itself a kw-eval- folder)
        (workdir,) = [d for d in made if d.name.startswith("kw-eval-") and (d / "candidate.py").exists()]
        copied = [f for f in workdir.glob("in_*.kwt") if not f.is_symlink()]
        assert all(b"TOKEN-4f2a" not in f.read_bytes() for f in copied), copied
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def test_the_profilers_log_is_read_through_its_descriptor_never_through_a_link(tmp_path):
    """ncu's and compute-sanitizer's log lies where the candidate under them can write: a link left
    there is not followed (the user's file kept), and a link that replaced the log while the child
    ran reads back as the log, not as the file it names."""
    from kernelwright.engine import nsight

    victim, secret, log = tmp_path / "victim", tmp_path / "secret", tmp_path / "ncu.log"
    victim.write_text("the user's file")
    secret.write_text("TOKEN-9c1d")
    log.symlink_to(victim)
    swap = f"echo profiled; rm -f {log}; ln -s {secret} {log}"
    rc, out, timed_out = nsight._run(["sh", "-c", swap], dict(os.environ), tmp_path, 30, log)
    assert rc == 0 and not timed_out
    assert victim.read_text() == "the user's file"
    assert "profiled" in out and "TOKEN-9c1d" not in out


def test_the_profiler_reads_only_build_directories_the_runner_could_have_built(tmp_path, cpu_config):
    """The kernel names for ncu come from the reported builds' files, read by the parent: a `dir`
    the runner's report names outside the build cache and the evaluation's directory (the user's
    file, or a link to it) is not read."""
    from kernelwright.engine import nsight

    cpu_config.cache_dir = str(tmp_path / "cache")
    own = tmp_path / "cache" / "builds" / "kw_ext-0123"
    private = tmp_path / "work" / "private-builds" / "kw_ext-4567"
    for d in (own, private):
        d.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("TOKEN")
    (tmp_path / "work" / "link").symlink_to(tmp_path)
    reported = [{"dir": str(d)} for d in (own, private, secret, tmp_path, tmp_path / "work" / "link", "/etc")]
    reported += [{"dir": 7}, "garbage", {}]
    got = nsight._own_build_dirs(reported, cpu_config, tmp_path / "work")
    assert got == [os.path.realpath(own), os.path.realpath(private)]


@pytest.mark.slow
@needs_bwrap
def test_a_caller_with_tmp_or_home_on_its_path_unhides_neither(cpu_config, monkeypatch):
    """A script run from /tmp or $HOME puts that directory on the caller's sys.path, which the sandbox
    binds for the child's Python: bound whole, it unhid /tmp (other evaluations' GPU turns, which a
    candidate could then hold with flock on a read-only descriptor, and their directories) and $HOME
    (the caller's secrets). Neither may show; the candidate still imports (what it needs is bound alone)."""
    marks = [
        f"/tmp/kw-hidden-{uuid.uuid4().hex}",
        os.path.join(os.path.expanduser("~"), f".kw-hidden-{uuid.uuid4().hex}"),
    ]
    for m in marks:
        Path(m).write_text("secret")
    monkeypatch.setattr(sys, "path", ["/tmp", os.path.expanduser("~"), *sys.path])
    attempt = (
        "import os\n"
        f"_seen = [m for m in {marks!r} if os.path.exists(m)]\n"
        "if _seen:\n"
        "    raise RuntimeError(f'SEEN {_seen}')"
    )
    try:
        r = _eval(cpu_config, attempt, "bwrap")
        assert r.status is Status.PASSED and r.sandbox == "bwrap", r.error_log
        r = _eval(cpu_config, attempt, "none")  # the control: without the sandbox both show
        assert r.status is Status.RUNTIME_ERROR and "SEEN" in r.error_log
    finally:
        for m in marks:
            os.remove(m)
