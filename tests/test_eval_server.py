"""`kernelwright serve` (executors/eval_server.py): `kernelwright eval` hands its job to a running
server for its device and gets the same record; no server, a dead one's socket, another
installation's server or another user's process: the client evaluates by itself, or is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES, ROOT, make_cpu_config
from kernelwright.core.record import Status
from kernelwright.executors import eval_server


def _env(cache: Path, autostart: str = "never") -> dict[str, str]:
    # a cache of the test's own: the server's socket lies in it, so no other test's eval finds it
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT / "src"),
        KERNELWRIGHT_CACHE=str(cache),
        COLUMNS="400",
        KERNELWRIGHT_SERVE_AUTOSTART=autostart,
    )


def _kw(*args: str, cache: Path, timeout: float = 300, autostart: str = "never") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *map(str, args)],
        env=_env(cache, autostart),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _socket_for(cache: Path, device: str = "cpu") -> Path:
    old = os.environ.get("KERNELWRIGHT_CACHE")
    os.environ["KERNELWRIGHT_CACHE"] = str(cache)
    try:
        return eval_server.socket_path(device)
    finally:
        if old is None:
            os.environ.pop("KERNELWRIGHT_CACHE")
        else:
            os.environ["KERNELWRIGHT_CACHE"] = old


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < end, "the server never listened"
        time.sleep(0.1)


def _record(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_eval_is_served_by_a_running_server_and_the_server_stops_cleanly(tmp_path):
    cache = tmp_path / "cache"
    path = _socket_for(cache)
    server = subprocess.Popen(
        [sys.executable, "-m", "kernelwright.cli.main", "serve", "--device", "cpu", "--spares", "1"],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(path, server)
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
        args = ("eval", ADD_ONE, CANDIDATES / "py_correct.py", "--device", "cpu", "--trials", "2", "--json")
        served = _record(_kw(*args, cache=cache))
        assert served["status"] == Status.PASSED.value
        assert served["metadata"]["served"]["server_pid"] == server.pid
        assert served["metadata"]["prestarted"]  # its children had started before the job came
        wrong = _record(_kw("eval", ADD_ONE, CANDIDATES / "py_wrong.py", "--device", "cpu", "--json", cache=cache))
        assert wrong["status"] == Status.INCORRECT.value and wrong["metadata"]["served"]["job"] == 2
        here = _record(_kw(*args, "--no-server", cache=cache))
        assert here["status"] == Status.PASSED.value and "served" not in here["metadata"]
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert "stopped after 2 evaluation(s)" in err
    assert not path.exists()  # its socket removed: the next eval evaluates by itself at once


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (its parent, the first CLI process, is gone) is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_an_eval_that_found_no_server_starts_one_the_next_eval_is_served_and_stop_ends_it(tmp_path):
    """serve.autostart: the first eval evaluates by itself and then starts a server in the background
    (a session of its own, outliving the CLI process); the next fresh eval is served by it, on a spare
    started before it came; `serve --stop` ends it."""
    cache = tmp_path / "cache"
    path = _socket_for(cache)
    settings = tmp_path / "kernelwright.toml"
    settings.write_text('[serve]\nautostart = "always"\nspares = 1\nidle_minutes = 5\n')
    args = ("eval", ADD_ONE, CANDIDATES / "py_correct.py", "--device", "cpu", "--trials", "2", "--config", settings)
    first = _kw(*args, cache=cache)  # the environment says never; the settings file, always
    assert first.returncode == 0, first.stderr
    assert "started `kernelwright serve` for cpu in the background" in first.stderr
    assert "stops after 5 idle minutes" in first.stderr
    assert "kernelwright serve --stop" in first.stderr
    end = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < end, list(path.parent.glob(path.name.replace(".sock", "*")))
        time.sleep(0.1)
    second = _record(_kw(*args, "--json", cache=cache))
    assert second["status"] == Status.PASSED.value
    pid = second["metadata"]["served"]["server_pid"]
    assert second["metadata"]["prestarted"] and _alive(pid)
    assert os.getsid(pid) == pid  # a session of its own: the terminal's Ctrl-C does not reach it
    stopped = _kw("serve", "--stop", "--device", "cpu", cache=cache)
    assert stopped.returncode == 0 and f"stopped the server for cpu (pid {pid})" in stopped.stderr, stopped.stderr
    end = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < end, "the server did not end after --stop"
        time.sleep(0.1)
    assert not path.exists()
    log = path.with_name(path.name.replace(".sock", ".log")).read_text()
    assert f"pid {pid} stopped after 1 evaluation(s)" in log
    again = _kw("serve", "--stop", "--device", "cpu", cache=cache)
    assert again.returncode == 0 and "no server for cpu answered" in again.stderr


@pytest.mark.parametrize(
    ("autostart", "device", "starts"),
    [("cuda", "cuda", True), ("cuda", "cpu", False), ("always", "cpu", True), ("never", "cuda", False)],
)
def test_which_evals_start_a_server(monkeypatch, cpu_config, autostart, device, starts):
    """serve.autostart: `cuda` (the default) starts one after a GPU eval only; `always`, `never`."""
    from dataclasses import replace

    from kernelwright.cli import main as cli
    from kernelwright.core.config import ServeConfig

    started = []
    monkeypatch.setattr(eval_server, "start_detached", lambda cfg, spares, idle_s: started.append(cfg) or Path("log"))
    monkeypatch.delenv("CI", raising=False)
    cli._start_server(replace(cpu_config, device=device), ServeConfig(autostart=autostart), quiet=True)
    assert bool(started) is starts
    monkeypatch.setenv("CI", "true")  # a CI job's step: only `always` starts one
    started.clear()
    cli._start_server(replace(cpu_config, device=device), ServeConfig(autostart=autostart), quiet=True)
    assert bool(started) is (starts and autostart == "always")


def test_a_second_server_for_the_same_socket_is_refused_and_the_first_keeps_it(tmp_path, cpu_config):
    """Two evals that end together each start a server: the second ends at once (a lock held for the
    first one's life), instead of taking the socket's path over between the first's bind and listen."""
    path = _socket_for(tmp_path / "cache")
    first = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=60)
    try:
        inode = path.stat().st_ino
        with pytest.raises(OSError, match="a server already runs"):
            eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=60)
        assert path.stat().st_ino == inode  # the first one's socket, untouched
    finally:
        first.close()
    eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=60).close()  # free again once it closed


def test_a_socket_left_by_a_dead_server_is_passed_over_and_replaced(tmp_path, cpu_config):
    cache = tmp_path / "cache"
    path = _socket_for(cache)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens (a server killed with SIGKILL)
    cpu_config.cache_dir = str(cache)
    assert eval_server.submit(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config, path=path) is None
    server = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=5)
    try:
        assert path.exists() and server.path == path
        with pytest.raises(OSError, match="a server already runs"):
            eval_server.EvalServer(cpu_config, path=path, spares=0)
    finally:
        server.close()
    assert not path.exists()


def test_a_server_of_other_code_refuses_the_job_and_the_client_says_so(tmp_path, cpu_config):
    path = tmp_path / "s.sock"
    server = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=30)
    server.stamp = "another installation"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(eval_server.ServerRefused, match="other kernelwright code"):
            eval_server.submit(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config, path=path)
    finally:
        server.stop()
        thread.join(30)
    assert server.served == 0 and not path.exists()


def _old_server(tmp_path: Path, cache: Path) -> subprocess.Popen:
    """A real server left from before an upgrade: `kernelwright serve` of a copy of the package
    (other files' times: another code stamp), as `start_detached` starts one."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "src" / "kernelwright", old / "kernelwright", copy_function=shutil.copy)
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"config": make_cpu_config(str(cache)).to_dict(), "spares": 0, "idle_s": 60}))
    env = dict(_env(cache), PYTHONPATH=str(old))
    cmd = [sys.executable, "-m", "kernelwright.executors.eval_server", str(start)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_server_of_other_code_is_stopped_evaluated_past_and_replaced(tmp_path):
    """A server left from before an upgrade (another code stamp) refuses the job: the CLI asks it to
    stop, evaluates by itself, and (serve.autostart) starts one of its own code after."""
    cache = tmp_path / "cache"
    path = _socket_for(cache)
    server = _old_server(tmp_path, cache)
    try:
        _wait_for(path, server)
        args = ("eval", ADD_ONE, CANDIDATES / "py_correct.py", "--device", "cpu", "--trials", "1", "--json")
        res = _kw(*args, cache=cache, autostart="always")
        assert server.wait(30) == 0  # the old one stopped when asked
        rec = _record(res)
        assert rec["status"] == Status.PASSED.value and "served" not in rec["metadata"]
        assert "stopped the server (it ran other kernelwright code); evaluating here" in res.stderr
        assert "started `kernelwright serve` for cpu" in res.stderr
        log = path.with_name(path.name.replace(".sock", ".log"))
        end = time.monotonic() + 60
        while not (log.exists() and " serving cpu on " in log.read_text()):  # the new one, of this code
            assert time.monotonic() < end, log.exists() and log.read_text()
            time.sleep(0.1)
    finally:
        server.kill()
        server.wait()
        _kw("serve", "--stop", "--device", "cpu", cache=cache)


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None, reason="needs root to act as another user")
def _open_to_others(folder: Path) -> bool:
    """Whether another uid can reach `folder` (every folder above it lets others through)."""
    return all(os.stat(p).st_mode & 0o001 for p in [folder, *folder.parents])


def test_another_users_process_is_refused_even_where_it_can_reach_the_socket(tmp_path, cpu_config):
    import tempfile

    # /tmp may be 0700 (it is on CI): the socket goes where another uid can reach it, or the test skips
    base = next((Path(d) for d in ("/dev/shm", "/var/tmp", tempfile.gettempdir()) if _open_to_others(Path(d))), None)
    if base is None:
        pytest.skip("no folder here lets another uid reach a socket in it")
    path = Path(tempfile.mkdtemp(prefix="kw-serve-test-", dir=base)) / "open" / "s.sock"
    server = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=30)
    for d in (path.parent.parent, path.parent):
        os.chmod(d, 0o755)
    os.chmod(path, 0o777)  # as if the directory's mode had been loosened: the peer's uid still counts
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = (
        f"import socket, json; s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r}); "
        "s.sendall(json.dumps({'stamp': 'x'}).encode() + b'\\n'); print(s.recv(4096).decode())"
    )
    try:
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", client],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.stop()
        thread.join(30)
    shutil.rmtree(path.parent.parent, ignore_errors=True)
    assert "its own user only" in out.stdout, out.stderr
    assert server.served == 0


@pytest.mark.slow
def test_an_idle_server_stops_by_itself(tmp_path):
    cache = tmp_path / "cache"
    path = _socket_for(cache)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelwright.cli.main",
            "serve",
            "--device",
            "cpu",
            "--spares",
            "1",
            "--idle-minutes",
            "0.03",
        ],
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "stopped after 0 evaluation(s)" in res.stderr and not path.exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_client_in_other_namespaces_is_told_apart_from_one_in_the_servers(tmp_path):
    """The server refuses a job from a process of another mount/PID/network/user namespace (a
    sandboxed candidate of the same uid): `_other_namespace` names the first that differs."""
    assert eval_server._other_namespace(os.getpid()) == ""
    assert eval_server._other_namespace(0) != ""  # no peer pid: refused
    proc = subprocess.Popen(["unshare", "--user", "--map-root-user", "--mount", "sleep", "30"])
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and eval_server._other_namespace(proc.pid) == "":
            time.sleep(0.05)  # unshare enters its namespaces before it execs sleep
        assert eval_server._other_namespace(proc.pid) in ("mnt", "user")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("spares", [1, 0])
def test_a_client_that_goes_away_takes_its_evaluation_with_it(tmp_path, cpu_config, spares):
    """Ctrl-C on a served `kernelwright eval`: the client closes its socket, and the server stops the
    evaluation (a candidate that never returns, here) at once instead of at its stage limit, then
    serves the next job; on a spare, or on children started for the job where no spare was ready
    (those ran to the candidate's call limit, 10 s, before: a CI run once saw it)."""
    cpu_config.cache_dir = str(tmp_path / "cache")
    cpu_config.timeouts.correctness = 60  # the limit the hung candidate would otherwise run to
    server = eval_server.EvalServer(cpu_config, path=tmp_path / "s.sock", spares=spares, idle_s=120)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 60
        while server.pool.spares() < spares and time.monotonic() < end:
            time.sleep(0.1)  # a spare ready: a cancel stops the children the evaluation took from it
        job = {
            "stamp": server.stamp,
            "config": cpu_config.to_dict(),
            "problem": str(ADD_ONE),
            "candidate": str(CANDIDATES / "py_infinite_loop.py"),
        }
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(tmp_path / "s.sock"))
        client.sendall(json.dumps(job).encode() + b"\n")
        seen = b""
        while b'"correctness"' not in seen:  # the candidate is in its endless forward now
            chunk = client.recv(4096)
            assert chunk, seen
            seen += chunk
        closed = time.monotonic()
        client.close()
        while server.cancelled == 0 and time.monotonic() < closed + 30:
            time.sleep(0.05)
        # 0.1-0.25 s alone or beside other tests; under the candidate's 10 s call limit (call_floor)
        # and the 60 s stage limit it would otherwise run to
        assert server.cancelled == 1 and time.monotonic() - closed < 8
        res = eval_server.submit(ADD_ONE, CANDIDATES / "py_correct.py", cpu_config, path=tmp_path / "s.sock")
        assert res is not None and res.status is Status.PASSED, res
    finally:
        server.stop()
        thread.join(30)


def test_a_job_read_back_from_json_fits_the_servers_spares(cpu_config):
    """A served job's configuration comes from JSON (its 120 read back as 120.0): a spare started
    for the server's own configuration must still serve it."""
    from kernelwright.core.config import EvalConfig
    from kernelwright.engine.evaluation import _spawn_key

    cpu_config.timeouts.startup = 120
    assert _spawn_key(EvalConfig.from_dict(json.loads(json.dumps(cpu_config.to_dict())))) == _spawn_key(cpu_config)


def test_a_server_removes_only_the_socket_it_made(tmp_path, cpu_config):
    """A stale socket is removed by the server that made it, at its end: a socket bound at the path
    after it (the next server's) is left where it is."""
    path = tmp_path / "s.sock"
    server = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=5)
    path.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    try:
        server.close()
        assert path.exists()
    finally:
        other.close()
        path.unlink()
    again = eval_server.EvalServer(cpu_config, path=path, spares=0, idle_s=5)
    again.close()
    assert not path.exists()
