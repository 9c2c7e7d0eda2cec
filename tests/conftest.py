"""Shared fixtures, and the two tiers of the suite.

Tests marked `gpu` are skipped where no CUDA GPU is visible (CI). Tests marked `slow` (each costs
about 8 s of a core or more: a C++ build, a CLI, server or executor process, a whole loop, an
evaluation repeated in both sandbox modes) are left out of a plain `python3 -m pytest`, the gate CI
runs; `--whole` runs them too, before a change lands (20-25 min on two cores). Naming a
test (`file.py::test`) or giving `-m` or `-k` runs what was asked for, slow or not."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest


def spread_gpu(spread: str, worker: str) -> str | None:
    """`KW_SPREAD_GPUS=0,1`: the GPU a pytest -n worker (`gw5`) drives alone, its entries in turn
    (gw0 on 0, gw1 on 1, gw2 on 0, ...). One run over every GPU then deals its files to whichever
    worker is free, where a run per GPU with half of the files each ended 230 s apart
    (scripts/device_checks.sh `suitespread`)."""
    gpus = [g.strip() for g in spread.split(",") if g.strip()]
    if not gpus or not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    return gpus[int(worker[2:]) % len(gpus)]


# set before anything can start CUDA in this worker (CUDA reads the variable once)
_SPREAD = spread_gpu(os.environ.get("KW_SPREAD_GPUS", ""), os.environ.get("PYTEST_XDIST_WORKER", ""))
if _SPREAD is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = _SPREAD

from kernelwright.core.config import EvalConfig, StageTimeouts, TimingConfig  # noqa: E402
from kernelwright.engine.config_resolution import resolve_config  # noqa: E402

# a test's `kernelwright eval` on a GPU would otherwise leave a server of warm evaluations behind it
# (ServeConfig.autostart); the tests of that server set it themselves
os.environ["KERNELWRIGHT_SERVE_AUTOSTART"] = "never"

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = ROOT / "examples"
ADD_ONE = FIXTURES / "problems" / "add_one.py"  # y = relu(x) + 1: the problem most tests evaluate against
CANDIDATES = FIXTURES / "candidates"  # candidates for ADD_ONE, one file per behaviour


def block(code: str, prose: str = "Here you go.") -> str:
    """A model's answer: a line of prose, then `code` in one fenced python block."""
    return f"{prose}\n```python\n{code}```\n"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_addoption(parser):
    parser.addoption(
        "--whole", action="store_true", help="the whole suite: the tests marked slow too (a plain run is CI's gate)"
    )


def _gate(config) -> bool:
    """A plain run, CI's: no `--whole`, no `-m` or `-k`, no test named by its id."""
    named = config.option.markexpr or config.option.keyword or any("::" in a for a in config.args)
    return not (config.getoption("whole") or named)


def pytest_report_header(config):
    if _gate(config):
        return "CI's gate: tests marked slow are left out (--whole runs them)"
    return None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KW_LONGEST_FIRST"):  # an earlier run's KW_DURATIONS_LOG
        items[:] = longest_first(items, read_durations(os.environ["KW_LONGEST_FIRST"]))
    if _gate(config):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
    if not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# ---- under pytest -n: the shared build cache's precompiled header, made once as the run starts ------

# the default flags' header, then the header of the example's flags (examples/cpu_swish/candidate.py,
# read as a build reads them): several tests build the example and tests/fixtures/candidates/cpp_wrong.py
# with those flags in the shared cache, and the second such build would make it inside some test
_HEADER_MAKER = """
import os
import sys
from pathlib import Path
from kernelwright.engine.child import flag_pch
from kernelwright.engine.extensions import static_builds
root = Path(sys.argv[1]) / "builds" / flag_pch.SUBDIR
try:
    (example,) = static_builds.scan(Path(sys.argv[2]).read_text()).calls
    for flags in ([], flag_pch.accepted(example.kwargs, with_cuda=False)):
        for _ in range(2):  # a flag set is made at its second build: the first records it
            flag_pch.header_dir(flags, flag_pch.DEFAULT_KEEP, root)
finally:
    Path(sys.argv[1], sys.argv[3]).unlink(missing_ok=True)
"""
# in the shared cache while the controller's header maker runs (its process id): `seed_headers` waits for it
_MAKING = ".kw-test-headers-making"


def pytest_sessionstart(session):
    """Under pytest -n, where tests marked slow run (not in CI's gate: it builds two extensions, and
    the headers would cost more than they save), the controller makes the headers of torch's default
    flags and of the example's (`_HEADER_MAKER`) in the workers' shared build cache (engine/child/flag_pch.py) while
    the first tests run: every C++ build of the run with those flags then uses them (8 s a build on
    CI's machine, against 20 s), where otherwise the run's second build with a flag set would make
    its header inside some test (about 40 s there, under load)."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) or _gate(config):
        return  # CI's gate builds too little C++ for the headers to pay (two headers: about 160 s of a core)
    import subprocess
    import sys

    base = config._tmp_path_factory.getbasetemp()  # the workers' base directories are inside it
    shared = os.environ.get("KW_TEST_CACHE") or str(base / "kw-cache-shared")
    os.makedirs(shared, exist_ok=True)
    marker = Path(shared, _MAKING)
    marker.write_text("")
    config._kw_header_maker = subprocess.Popen(
        [sys.executable, "-c", _HEADER_MAKER, shared, str(EXAMPLES / "cpu_swish" / "candidate.py"), _MAKING],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its group is its own: the compiler it runs goes with it
    )
    marker.write_text(str(config._kw_header_maker.pid))


_FAILURES_LOG: list[str] = []  # KW_FAILURES_LOG's path, in the controller (pytest_runtest_logreport)
_DURATIONS_LOG: list[str] = []  # KW_DURATIONS_LOG's path, likewise
_SPENT: dict[str, float] = {}  # a test's seconds so far (setup, call), until its teardown's report


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        _FAILURES_LOG[:] = [os.environ["KW_FAILURES_LOG"]] if os.environ.get("KW_FAILURES_LOG") else []
        _DURATIONS_LOG[:] = [os.environ["KW_DURATIONS_LOG"]] if os.environ.get("KW_DURATIONS_LOG") else []


def pytest_runtest_logreport(report):
    """`KW_FAILURES_LOG=PATH`: each failure's report appended to PATH as it comes (by the controller
    alone under pytest -n). A device run stopped at its time limit prints no summary, and with it
    went the only traceback of a failure (scripts/device_checks.sh sets it).
    `KW_DURATIONS_LOG=PATH`: a JSON line per test as it ends (its id, seconds of setup, call and
    teardown, outcome), for `KW_LONGEST_FIRST` in a later run."""
    if _FAILURES_LOG and report.failed:
        with open(_FAILURES_LOG[0], "a") as f:
            f.write(f"===== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n")
    if _DURATIONS_LOG:
        spent = _SPENT.pop(report.nodeid, 0.0) + report.duration
        if report.when != "teardown":
            _SPENT[report.nodeid] = spent
            return
        row = {"test": report.nodeid, "s": round(spent, 2), "outcome": report.outcome}
        with open(_DURATIONS_LOG[0], "a") as f:
            f.write(json.dumps(row) + "\n")


def longest_first(items: list, durations: dict[str, float]) -> list:
    """`items` reordered so that the longest tests by an earlier run's `durations` go first, and those it
    lacks (new, or unfinished when that run was stopped: likely long) before them all; ties keep their
    order. Under pytest -n with --dist load the workers take tests in this order as they come free, so a
    long test no longer starts last and holds the run's end (the project's --dist loadfile deals whole
    files instead: scripts/device_checks.sh suitespread passes --dist load)."""
    known = [i for i in items if i.nodeid in durations]
    known.sort(key=lambda i: -durations[i.nodeid])
    return [i for i in items if i.nodeid not in durations] + known


def read_durations(path: str) -> dict[str, float]:
    """A KW_DURATIONS_LOG's tests and seconds (the longest where a test is there twice); {} where the
    file is missing or a line is not such a row."""
    out: dict[str, float] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            row = json.loads(line)
            out[row["test"]] = max(out.get(row["test"], 0.0), float(row["s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def pytest_unconfigure(config):
    """The header maker and the compiler it runs end with the run (a run that collects only, or
    stops early, would otherwise leave gcc at work on a header for a minute or more)."""
    import signal

    maker = getattr(config, "_kw_header_maker", None)
    if maker is not None and maker.poll() is None:
        try:
            os.killpg(maker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        maker.wait()


@pytest.fixture(autouse=True)
def _private_store(tmp_path_factory, monkeypatch):
    """Every test's default run store is its own file, never the user's real one in their home."""
    monkeypatch.setenv("KERNELWRIGHT_STORE", str(tmp_path_factory.mktemp("store") / "kernelwright.db"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """One build cache for the whole session: a C++ extension is built once, then reused.

    `KW_TEST_CACHE` names a directory shared by several pytest workers (pytest -n): builds are
    keyed by content and locked, so workers share them safely.
    """
    shared = os.environ.get("KW_TEST_CACHE")
    if shared:
        os.makedirs(shared, exist_ok=True)
        return shared
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: the workers' base directories share a parent
        d = tmp_path_factory.getbasetemp().parent / "kw-cache-shared"
        d.mkdir(exist_ok=True)
        return str(d)
    return str(tmp_path_factory.mktemp("kw-cache"))


def seed_headers(own_cache: str | Path, shared_cache: str) -> None:
    """Gives a test's own build cache the precompiled headers already finished in the shared one
    (engine/child/flag_pch.py): its builds are still its own, cold, but they parse torch's headers
    in about 8 s, not 25 s. For tests about what is built and cached, not about the headers
    (tests/test_flag_pch.py makes its own). Each header is linked, never copied: the cache replaces
    a header whole (os.replace) and never writes one in place; the small files beside it are copied.
    While the controller's header maker is at work on the default flags' header (the run's first
    minute) it is waited for: a cache seeded without it would make its own at its second build
    with those flags (a duplicate header, 35 s of a core), or build without one (22 s against 7 s).
    A header not finished otherwise is skipped."""
    from kernelwright.engine.child import flag_pch

    src = Path(shared_cache) / "builds" / flag_pch.SUBDIR
    dst = Path(own_cache) / "builds" / flag_pch.SUBDIR
    if src.resolve() == dst.resolve():
        return
    _wait_for_header_maker(Path(shared_cache), src / flag_pch._key([]) / "torch" / "extension.h.gch")
    if not src.is_dir():
        return
    for gch in src.glob("*/torch/extension.h.gch"):
        here = gch.parent.parent
        to = dst / here.name / "torch"
        if to.exists():
            continue  # seeded already
        try:
            to.mkdir(parents=True)
            os.link(gch, to / "extension.h.gch")
            (to / "extension.h").write_text((gch.parent / "extension.h").read_text())
            (to.parent / flag_pch.SEEN).write_text((here / flag_pch.SEEN).read_text())
        except OSError:  # removed meanwhile (the least recently used go): none, rather than half of one
            shutil.rmtree(to.parent, ignore_errors=True)


def _wait_for_header_maker(shared_cache: Path, header: Path, limit_s: float = 300.0) -> None:
    """Until the controller's header maker (`pytest_sessionstart`) has made `header` (the default
    flags', its first) or ended, `limit_s` at most."""
    import time

    marker = shared_cache / _MAKING
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not header.exists():
        try:
            pid = int(marker.read_text() or 0)
        except (OSError, ValueError):
            return  # no maker (not under pytest -n, or done)
        if pid and not Path(f"/proc/{pid}").exists():
            return  # ended without its last word (killed)
        time.sleep(1.0)


@pytest.fixture(scope="session")
def small_swish(tmp_path_factory) -> Path:
    """examples/cpu_swish/problem.py at batch 16 instead of 1024: the same features, so the example's
    candidate and its build (one entry in the cache) are the same. For tests about builds, caches and
    records, not about that size: an evaluation of the full size costs ~6 s more on a 2-core machine."""
    text = (EXAMPLES / "cpu_swish" / "problem.py").read_text()
    assert "\nbatch = 1024\n" in text, "the example's batch changed: update this fixture"
    path = tmp_path_factory.mktemp("small-swish") / "problem.py"
    path.write_text(text.replace("\nbatch = 1024\n", "\nbatch = 16\n"))
    return path


@pytest.fixture
def cpu_config(cache_dir) -> EvalConfig:
    """CPU evaluation with short stage limits, so a hung candidate costs seconds, not minutes."""
    return make_cpu_config(cache_dir)


# tests judge verdicts, not speed: the timing stage's cheaper settings (`cpu_config`; as a settings
# file's table for the CLI's tests: `fast_timing_toml`)
FAST_TIMING = {"windows": 3, "max_window_calls": 64}


def fast_timing_toml() -> str:
    return "[eval.timing]\n" + "".join(f"{k} = {v}\n" for k, v in FAST_TIMING.items())


def make_cpu_config(cache_dir: str) -> EvalConfig:
    """`cpu_config`'s settings, for a fixture of a wider scope (one evaluation several tests read),
    resolved as an entry point resolves them (the sandbox: bwrap where it runs)."""
    return resolve_config(
        EvalConfig(
            device="cpu",
            trials=3,
            cache_dir=cache_dir,
            # correctness includes the judge's reference and float64 oracle: seconds on a busy 2-core machine
            timeouts=StageTimeouts(startup=120, build=300, init=30, correctness=20, timing=30, profile=60),
            # tests judge verdicts, not speed: three windows of at most 64 sets (the default: five of up
            # to 256). The defaults are timed by the benchmarks and by the tests that set their own
            # (test_clock_attacks, test_timing_stability).
            timing=TimingConfig(**FAST_TIMING),
        )
    )


@pytest.fixture
def cuda_config(cache_dir) -> EvalConfig:
    return resolve_config(
        EvalConfig(
            device="cuda",
            trials=3,
            cache_dir=cache_dir,
            timeouts=StageTimeouts(startup=120, build=600, init=60, correctness=30, timing=120, profile=300),
            # the gpu suite runs 4-6 workers a GPU: one evaluation drives it at a time (gpu_turn.py), and a
            # worker may wait behind five others' checks and windows
            timing=TimingConfig(gpu_turn_wait_s=600.0),
        )
    )
