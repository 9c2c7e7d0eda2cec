"""No foothold outside the evaluation (issue 55): nothing a candidate leaves behind changes the
verdict of another evaluation. Each attack is a file under tests/fixtures/host_attacks/, run
through `evaluate` in the default sandbox (bubblewrap) and with `--sandbox none`; the honest side
(a client, another evaluation) runs while the attack does, or after it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ADD_ONE, CANDIDATES, FIXTURES, ROOT
from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.core.settings_file import SettingsError, load_settings
from kernelwright.engine import evaluate
from kernelwright.engine.isolation import sandbox
from kernelwright.executors import eval_server, serve_trust


def _bwrap_reason() -> str:
    try:
        sandbox.resolve("bwrap")
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return ""


MODES = [pytest.param("bwrap", marks=pytest.mark.skipif(bool(_bwrap_reason()), reason=_bwrap_reason())), "none"]


def _attack(name: str, **fill: object) -> str:
    text = (FIXTURES / "host_attacks" / f"{name}.py").read_text()
    for key, value in fill.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    return text


@pytest.fixture
def serve_home(tmp_path, monkeypatch) -> Path:
    """A runtime folder and a cache of the test's own: the server's socket for them."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.setenv("KERNELWRIGHT_CACHE", str(tmp_path / "cache"))
    return eval_server.socket_path("cpu")


# ---- the impersonated server ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_candidate_that_impersonates_the_server_gets_no_honest_job(mode, cpu_config, serve_home, capfd):
    """The attack of issue 55: the candidate binds the server's socket and answers with a forged
    42x record. Under bubblewrap it cannot reach the socket's folder; with `none` it binds it (the
    control), and every honest client meanwhile refuses it (its PID namespace is an evaluation's)
    and evaluates by itself."""
    path = serve_home
    cpu_config.sandbox, cpu_config.time_candidate = mode, False
    attack = _attack("impersonate_eval_server", socket=path, hold=6)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(evaluate(ADD_ONE, None, cpu_config, candidate_text=attack)))
    thread.start()
    answers, seen = [], False
    while thread.is_alive():
        if path.exists():
            seen = True
            answers.append(eval_server.submit(ADD_ONE, CANDIDATES / "py_wrong.py", cpu_config, path=path))
        time.sleep(0.2)
    thread.join()
    (r,) = done
    assert r.status is Status.PASSED, r.error_log
    assert answers == [None] * len(answers)  # no record from it: each client evaluated by itself
    err = capfd.readouterr().err
    if mode == "bwrap":
        assert not seen  # its folder is hidden: the socket never appeared on the host
    else:
        assert seen and answers, "the impersonator never bound the socket: the test proves nothing"
        # (its PID namespace; where the host allows none, the evaluation's marker it inherited)
        assert "ignored what listens on" in err, err
        assert "namespace is not this process's" in err or "evaluation's marker" in err, err
    # a server of the user's takes the path over (a socket left by a process that is gone), and
    # removes it when it stops
    server = eval_server.EvalServer(cpu_config, spares=0, idle_s=5)
    server.close()
    assert not path.exists()


FAKE_SERVER = """
import json, os, socket, sys
path = os.environ["FAKE_SOCKET"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(4)
print("listening", flush=True)
while True:
    conn, _ = s.accept()
    try:
        conn.makefile("rb").readline()
        rec = {"status": "passed", "correct": True, "speedup": 42.0, "metadata": {"forged": True}}
        conn.sendall(json.dumps({"result": rec}).encode() + b"\\n")
    except OSError:
        pass
    conn.close()
"""


def _fake_server(tmp_path: Path, path: Path, as_module: bool, marker: bool = False) -> subprocess.Popen:
    """A process of this user, in this machine's namespaces, that answers every job with a forged
    record: a script, or a module that calls itself `kernelwright.executors.eval_server` (a package
    of its own first on PYTHONPATH), optionally with an evaluation's marker in its environment."""
    env = dict(os.environ, FAKE_SOCKET=str(path))
    env.pop(serve_trust.EVAL_MARKER.decode().rstrip("="), None)
    if marker:
        env[serve_trust.EVAL_MARKER.decode().rstrip("=")] = "0123abcd"
    if as_module:
        pkg = tmp_path / "fake" / "kernelwright" / "executors"
        pkg.mkdir(parents=True)
        (pkg.parent / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        (pkg / "eval_server.py").write_text(FAKE_SERVER)
        env["PYTHONPATH"] = str(tmp_path / "fake")
        cmd = [sys.executable, "-m", "kernelwright.executors.eval_server", "start.json"]
    else:
        (tmp_path / "fake.py").write_text(FAKE_SERVER)
        cmd = [sys.executable, str(tmp_path / "fake.py")]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def test_the_cli_ignores_a_forged_server_in_one_line_and_evaluates_by_itself(tmp_path, serve_home):
    """Any process of the user's can bind the path with `--sandbox none` (and a candidate can where
    no PID namespace is to be had): one that does not run `kernelwright serve` is not trusted. The
    wrong candidate gets its honest verdict, not the forged pass."""
    fake = _fake_server(tmp_path, serve_home, as_module=False)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), KERNELWRIGHT_SERVE_AUTOSTART="never", COLUMNS="400")
        args = ["eval", str(ADD_ONE), str(CANDIDATES / "py_wrong.py"), "--device", "cpu", "--trials", "1", "--json"]
        res = subprocess.run(
            [sys.executable, "-m", "kernelwright.cli.main", *args], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        fake.kill()
        fake.wait()
    rec = json.loads(res.stdout)
    assert rec["status"] == Status.INCORRECT.value and "forged" not in rec["metadata"], rec["status"]
    assert res.returncode == 0, res.stderr  # evaluated (no --fail-on)
    lines = [line for line in res.stderr.splitlines() if "ignored what listens on" in line]
    assert len(lines) == 1 and "command line is not kernelwright serve's" in lines[0], res.stderr


def test_a_server_with_an_evaluations_marker_among_its_ancestors_is_not_trusted(tmp_path, serve_home):
    """A process that calls itself the server (its command line is the server's, of this Python)
    but carries an evaluation's marker was started by a candidate: refused. The same process
    without the marker passes every check the client can make: `--sandbox none` without a PID
    namespace cannot tell it apart (docs/SANDBOX.md)."""
    import socket

    for marker, trusted in ((True, False), (False, True)):
        fake = _fake_server(tmp_path / str(marker), serve_home, as_module=True, marker=marker)
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(serve_home))
            why = serve_trust.verify_server(conn)
            conn.close()
        finally:
            fake.kill()
            fake.wait()
            serve_home.unlink()
        assert (why == "") is trusted, why
        if not trusted:
            assert "evaluation's marker" in why


def test_which_command_lines_are_a_servers():
    py = sys.executable
    assert serve_trust.is_serve_command([py, "-m", "kernelwright.executors.eval_server", "/x/start.json"])
    assert serve_trust.is_serve_command(["/venv/bin/python", "/venv/bin/kernelwright", "serve", "--device", "cpu"])
    assert serve_trust.is_serve_command([py, "-m", "kernelwright.cli.main", "serve"])
    assert not serve_trust.is_serve_command([py, "-m", "kernelwright.cli.main", "eval", "serve.py", "c.py"])
    assert not serve_trust.is_serve_command([py, "fake.py", "-m", "kernelwright.executors.eval_server"])
    assert not serve_trust.is_serve_command([py, "-c", "import kernelwright.executors.eval_server"])
    assert not serve_trust.is_serve_command([""])


def test_the_socket_folder_is_private_and_never_in_the_cache(tmp_path, monkeypatch):
    """$XDG_RUNTIME_DIR where it is a private folder of the user's outside the cache; else a folder
    of the user's in the temporary directory (bubblewrap hides both); another user's folder there
    is refused, not used."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("KERNELWRIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    assert serve_trust.serve_dir() == run / "kernelwright"
    os.chmod(run, 0o755)  # not private: passed over
    assert serve_trust.serve_dir().name == f"kw-serve-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "cache" / "run"))
    (tmp_path / "cache" / "run").mkdir(parents=True, mode=0o700)
    assert serve_trust.serve_dir().name == f"kw-serve-{os.getuid()}"  # inside the cache: passed over
    folder = tmp_path / "made"
    serve_trust.private_dir(folder)
    assert (os.stat(folder).st_mode & 0o777) == 0o700
    (tmp_path / "link").symlink_to(folder)
    with pytest.raises(OSError, match="not a folder of this user's"):
        serve_trust.private_dir(tmp_path / "link")
    if os.getuid() == 0:  # a folder someone else made first
        other = tmp_path / "others"
        other.mkdir()
        os.chown(other, 65534, 65534)
        with pytest.raises(OSError, match="uid 65534"):
            serve_trust.private_dir(other)


# ---- the planted settings file -------------------------------------------------------------------


def _shared_folder(tmp_path: Path) -> Path:
    """A folder anyone may write (as /tmp), with a project folder of the user's below it."""
    shared = tmp_path / "shared"
    (shared / "project").mkdir(parents=True)
    os.chmod(shared, 0o1777)
    return shared


@pytest.mark.parametrize("mode", MODES)
def test_a_planted_settings_file_is_passed_over_and_said_so(mode, cpu_config, tmp_path, capsys):
    """The candidate writes kernelwright.toml into a shared folder above the next eval's working
    directory. Under bubblewrap it cannot (the folder lies in the hidden /tmp); with `none` it
    lands (the control), and the search passes over it in one line: the defaults hold."""
    shared = _shared_folder(tmp_path)
    cpu_config.sandbox, cpu_config.time_candidate = mode, False
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("plant_settings_file", plant_dir=shared))
    assert r.status is Status.PASSED, r.error_log
    planted = shared / "kernelwright.toml"
    if mode == "bwrap":
        assert not planted.exists()
        planted.write_text('[eval]\nsandbox = "none"\natol = 1e9\n')  # as with --sandbox none: the search's turn
    assert planted.exists(), "the plant did not land: the test proves nothing"
    capsys.readouterr()
    settings = load_settings(start=shared / "project")
    err = capsys.readouterr().err
    assert settings.source is None and settings.eval.atol == EvalConfig().atol and settings.eval.sandbox == "auto"
    assert err.count("\n") == 1 and f"passed over the settings file {planted}" in err, err
    assert "may be written by others" in err


def _unsandboxed() -> list[str]:
    """What the record says the defaults lower on this machine: nothing, or, where bubblewrap cannot
    run (`sandbox = "auto"` resolves to none), the sandbox; the record says so there, truly."""
    return [] if sandbox.resolve("auto") == "bwrap" else ['sandbox = "none"']


def test_an_eval_below_a_planted_settings_file_keeps_its_verdict(tmp_path):
    """The issue's outcome, undone: a wrong model run from below the planted file failed its
    check with the defaults (it passed at 2.7x with the plant's tolerances)."""
    shared = _shared_folder(tmp_path)
    (shared / "kernelwright.toml").write_text(_attack("plant_settings_file").split('PLANT = """')[1].split('"""')[0])
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), KERNELWRIGHT_SERVE_AUTOSTART="never", COLUMNS="400")
    env["KERNELWRIGHT_CACHE"] = str(tmp_path / "cache")
    args = ["eval", str(ADD_ONE), str(CANDIDATES / "py_wrong.py"), "--device", "cpu", "--trials", "1", "--json"]
    res = subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *args],
        env=env,
        cwd=shared / "project",
        capture_output=True,
        text=True,
        timeout=300,
    )
    rec = json.loads(res.stdout)
    assert rec["status"] == Status.INCORRECT.value, res.stderr
    assert rec["metadata"]["settings"] == {"file": None, "lowers": _unsandboxed()}
    assert "passed over the settings file" in res.stderr


def test_a_settings_file_of_another_user_is_passed_over(tmp_path, capsys):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    (tmp_path / "project").mkdir()
    own = tmp_path / "kernelwright.toml"
    own.write_text("[eval]\natol = 0.5\n")
    os.chown(own, 65534, 65534)
    assert load_settings(start=tmp_path / "project").source is None
    assert "belongs to uid 65534" in capsys.readouterr().err


def test_a_settings_file_that_lowers_protection_says_so_each_time_and_the_record_names_it(tmp_path, capsys, cpu_config):
    """The user's own file is read (a private folder); what it lowers is said on every read, and
    the record names the file and what its configuration lowers."""
    (tmp_path / "project").mkdir()
    own = tmp_path / "kernelwright.toml"
    own.write_text('[eval]\natol = 0.5\n[eval.guards]\nfail_on = ["mutates_inputs"]\n')
    os.chmod(tmp_path, 0o700)
    for _ in range(2):
        settings = load_settings(start=tmp_path / "project")
        err = capsys.readouterr().err
        assert settings.source == str(own) and settings.eval.atol == 0.5
        assert err.count("\n") == 1 and f"the settings file {own} lowers the evaluation's protection" in err, err
        assert "atol = 0.5" in err and "guards.fail_on without" in err
    quiet = tmp_path / "quiet"
    (quiet / "p").mkdir(parents=True)
    (quiet / "kernelwright.toml").write_text("[eval]\natol = 0.01\n")
    assert load_settings(start=quiet / "p").eval.atol == 0.01 and capsys.readouterr().err == ""
    cfg = dataclasses.replace(cpu_config, atol=settings.eval.atol, settings_file=settings.eval.settings_file)
    cfg.time_candidate = False
    r = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cfg)
    lowers = [*_unsandboxed(), "atol = 0.5"]
    assert r.metadata["settings"] == {"file": str(own), "lowers": lowers}, r.metadata["settings"]


def test_a_settings_file_cannot_name_itself(tmp_path):
    (tmp_path / "kernelwright.toml").write_text('[eval]\nsettings_file = "/etc/trusted.toml"\n')
    with pytest.raises(SettingsError, match="unknown key 'eval.settings_file'"):
        load_settings(tmp_path / "kernelwright.toml")


# ---- other processes, /dev/shm -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_no_other_process_is_within_a_candidates_reach(mode, cpu_config):
    """From an exec'd runner and from one forked by the runner's zygote (the later evaluations of a
    configuration), the candidate reads no other process's environment and opens no other
    process's memory: not the zygote's (which forks the next candidates' runners), not the
    judge's, not the evaluator's. (The control inside: its own child, which it reaches.)"""
    cpu_config.sandbox, cpu_config.time_candidate = mode, False
    attack = _attack("reach_other_processes")
    for fork, kind in ((False, "started"), (True, "forked")):
        cpu_config.fork_runner = fork
        runners = []
        while kind not in runners and len(runners) < 10:  # (a zygote still importing torch: exec'd)
            r = evaluate(ADD_ONE, None, cpu_config, candidate_text=attack)
            assert r.status is Status.PASSED, r.error_log
            runners.append(r.metadata["runner_process"])
        assert kind in runners, runners


@pytest.mark.parametrize("mode", MODES)
def test_what_a_candidate_writes_to_dev_shm(mode, cpu_config):
    """Under bubblewrap /dev/shm is the evaluation's own: nothing reaches the host's. With `none`
    an exec'd runner writes the host's (docs/SANDBOX.md says so): this asserts the fact the page
    states."""
    import secrets

    tag = f"kw-planted-{secrets.token_hex(4)}"
    cpu_config.sandbox, cpu_config.time_candidate = mode, False
    try:
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=_attack("plant_dev_shm", tag=tag))
        assert r.status is Status.PASSED, r.error_log
        landed = Path("/dev/shm", tag).exists()
        # (a runner forked from the zygote has a /dev/shm of its own in either mode: confine.py)
        assert landed is (mode == "none" and r.metadata["runner_process"] == "started"), r.metadata["runner_process"]
    finally:
        Path("/dev/shm", tag).unlink(missing_ok=True)
        for stray in Path("/dev/shm").glob(f"kw-*/**/{tag}"):
            stray.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", MODES)
def test_no_jit_cache_is_shared_between_evaluations(mode, cpu_config, tmp_path):
    """Each evaluation's Triton, CUDA and inductor caches are its own (in its TMPDIR): a kernel
    planted by one candidate is never in the next one's caches."""
    cpu_config.sandbox, cpu_config.time_candidate = mode, False
    attack = _attack("plant_jit_cache", cache=cpu_config.cache_dir)
    for _ in range(2):
        r = evaluate(ADD_ONE, None, cpu_config, candidate_text=attack)
        assert r.status is Status.PASSED, r.error_log


# ---- the profiler's folder -----------------------------------------------------------------------


def test_the_profiled_candidate_writes_its_own_report_folder_and_no_link_it_leaves_is_followed(tmp_path, monkeypatch):
    """ncu's child runs the candidate with its report folder writable: only this profile's folder
    (no other evaluation's report), and the CSV the parent writes there afterwards replaces a link
    the candidate left (a link to a file of the user's), never follows it."""
    from kernelwright.engine import nsight

    report, victim = tmp_path / "profiles" / "this-one", tmp_path / "victim"
    victim.write_text("the user's file")
    wrapped: list = []

    def run(argv, env, workdir, left, log):  # the candidate under ncu: a link where the CSV goes
        report.mkdir(parents=True, exist_ok=True)
        (report / "profile.csv").symlink_to(victim)
        return 1, "==ERROR== stopped here", False

    monkeypatch.setattr(nsight, "known_metric_bases", lambda ncu, env: set())
    monkeypatch.setattr(nsight, "_run", run)
    with pytest.raises(nsight.NcuUnavailable):
        nsight._profile(
            "ncu", ["x"], {}, tmp_path, {}, 60, "judge", 4, set(), [], report, lambda a, *w: wrapped.append(w) or a
        )
    assert wrapped == [(report,)]
    nsight._write_fresh(report / "profile.csv", "kernel,metric\n")
    assert victim.read_text() == "the user's file"
    assert not (report / "profile.csv").is_symlink() and (report / "profile.csv").read_text() == "kernel,metric\n"


def test_a_folder_only_the_users_own_group_may_write_is_the_users(tmp_path, capsys):
    """`umask 002` gives every folder of a user group write for the user's private group: that is
    the user's alone, and the file there is read; a group with other members is not."""
    (tmp_path / "project").mkdir()
    (tmp_path / "kernelwright.toml").write_text("[eval]\natol = 0.01\n")
    os.chmod(tmp_path, 0o775)
    import grp
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    private = os.stat(tmp_path).st_gid == os.getgid() and not set(grp.getgrgid(os.getgid()).gr_mem) - {me}
    settings = load_settings(start=tmp_path / "project")
    assert (settings.source is not None) is private, capsys.readouterr().err
    if os.getuid() != 0:
        pytest.skip("needs root to give the folder to another group")
    os.chown(tmp_path, os.getuid(), 65534)
    assert load_settings(start=tmp_path / "project").source is None
    assert "its folder may be written by others" in capsys.readouterr().err
