"""Shared fixtures. Tests marked `gpu` are skipped where no CUDA GPU is visible (CI)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from kernelwright.core.config import EvalConfig, StageTimeouts, TimingConfig
from kernelwright.engine.config_resolution import resolve_config

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


def pytest_collection_modifyitems(config, items):
    if not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if hasattr(config, "workerinput"):  # pytest -n: the controller hands these out as one unit, first
        _write_alone_ids(config, [item.nodeid for item in items if _alone(item)])


# ---- under pytest -n: the shared build cache's precompiled header, made once as the run starts ------

_HEADER_MAKER = """
import fcntl, sys
from pathlib import Path
# in the room as a running test is (`_turn`): a test marked `alone` waits until the header is made,
# first outside the turnstile (`header`, held until this process ends, and taken before anything
# else it does: before any worker has collected), so that other tests run meanwhile
lock_dir = Path(sys.argv[2])
lock_dir.mkdir(parents=True, exist_ok=True)
header = open(lock_dir / "header", "a")
fcntl.flock(header, fcntl.LOCK_EX)
from kernelwright.engine.child import flag_pch
with open(lock_dir / "turnstile", "a") as turnstile, open(lock_dir / "room", "a") as room:
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    fcntl.flock(room, fcntl.LOCK_SH)
    fcntl.flock(turnstile, fcntl.LOCK_UN)
    root = Path(sys.argv[1]) / "builds" / flag_pch.SUBDIR
    for _ in range(2):  # a flag set is made at its second build: the first records it
        flag_pch.header_dir([], flag_pch.DEFAULT_KEEP, root)
"""


def pytest_sessionstart(session):
    """Under pytest -n, the controller makes the header of torch's default flags in the workers'
    shared build cache (engine/child/flag_pch.py) while the first tests run: every C++ build of the
    run with default flags then uses it (8 s a build on CI's machine, against 20 s), where otherwise
    the run's second such build would make it inside some test (about 40 s there, under load)."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    import subprocess
    import sys

    base = config._tmp_path_factory.getbasetemp()  # the workers' base directories are inside it
    shared = os.environ.get("KW_TEST_CACHE") or str(base / "kw-cache-shared")
    os.makedirs(shared, exist_ok=True)
    lock_dir = str(base / "kw-alone-lock")
    config._kw_header_maker = subprocess.Popen(
        [sys.executable, "-c", _HEADER_MAKER, shared, lock_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_unconfigure(config):
    maker = getattr(config, "_kw_header_maker", None)
    if maker is not None and maker.poll() is None:
        maker.kill()
        maker.wait()


# ---- under pytest -n: a test marked `alone` runs with no other test at the same time -------------


@contextlib.contextmanager
def _turn(lock_dir: Path, alone: bool):
    """A readers-writer lock over flock, fair to the writer: every test passes the turnstile, an
    `alone` test keeps it (no new test starts) until the tests already running have ended."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    if alone:  # the controller's header first (`_HEADER_MAKER`), while the other workers' tests go on
        with open(lock_dir / "header", "a") as header:
            fcntl.flock(header, fcntl.LOCK_SH)
    with open(lock_dir / "turnstile", "a") as turnstile, open(lock_dir / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


def _alone(item) -> bool:
    if item.get_closest_marker("skip") is not None:  # skipped before it starts (a gpu test here)
        return False
    # marked: what it asserts depends on timing. (gpu tests run side by side on the device, -n 4:
    # the windows halve when another evaluation took the memory, and their timings are not asserted)
    return item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of a test marked `alone` (it times, or asserts what timing decides)
    while no other pytest worker runs a test: a second worker's load is not what it measures.

    A worker whose next test is `alone` too keeps its turn for it: the other workers' tests drain
    once for a run of `alone` tests (test_clock_attacks has a dozen in a row), not before each one,
    which left a core idle while the longest test beside it finished, a dozen times."""
    if not hasattr(item.config, "workerinput"):  # not under pytest -n: one test at a time anyway
        return (yield)
    config = item.config
    alone = _alone(item)
    held = getattr(config, "_kw_alone_turn", None)  # kept by the previous test, `alone` as this one
    if held is None:
        # the workers' base directories share a parent (as the build cache in `cache_dir`)
        lock_dir = config._tmp_path_factory.getbasetemp().parent / "kw-alone-lock"
        held = contextlib.ExitStack()
        held.enter_context(_turn(lock_dir, alone=alone))
    config._kw_alone_turn = None
    try:
        result = yield
    except BaseException:
        held.close()
        raise
    if alone and nextitem is not None and _alone(nextitem):
        config._kw_alone_turn = held  # the next test runs in this turn: nothing else has started
    else:
        held.close()
    return result


# ---- under pytest -n: the tests marked `alone` are one unit of work, handed out first ---------------------

_ALONE_UNIT = "tests marked alone"  # the unit's name, where the other units are files
_ALONE_IDS = "kw-alone-tests.json"


def _alone_ids_path(config) -> Path:
    base = config._tmp_path_factory.getbasetemp()
    # a worker's base directory is inside the controller's (as the build cache in `cache_dir`)
    return (base.parent if hasattr(config, "workerinput") else base) / _ALONE_IDS


def _write_alone_ids(config, ids: list[str]) -> None:
    """Each worker writes the same list as it collects, whole (os.replace); the controller reads it
    once every worker has collected, before it hands out the first unit."""
    path = _alone_ids_path(config)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(ids))
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with every test marked `alone` taken out of its file into one unit of its
    own, handed out first: its worker waits for the controller's header (`_HEADER_MAKER`) while
    the other workers take the files as before. A test marked `alone` waits for the tests running
    beside it to end, and no other test starts until it has ended: as one unit they drain the other
    workers once, not once for each file that holds one (up to 40 s each), and no worker is held at
    the turnstile while the header is made. Their files' other tests are spread as before (a module
    fixture of theirs is set up where it is used: the `alone` tests of test_forge_loop.py are the
    only users of `recorded_run`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class AloneUnitScheduling(LoadFileScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self._alone_ids: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._alone_ids is None:  # first asked once every worker has collected (and written it)
                try:
                    self._alone_ids = frozenset(json.loads(_alone_ids_path(self.config).read_text()))
                except (OSError, ValueError):
                    self._alone_ids = frozenset()  # plain loadfile
            return _ALONE_UNIT if nodeid in self._alone_ids else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if _ALONE_UNIT in self.workqueue:
                self.workqueue.move_to_end(_ALONE_UNIT, last=False)
            super()._assign_work_unit(node)

    return AloneUnitScheduling(config, log)


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
    A header not finished yet (the controller makes the default flags' as the run starts) is skipped."""
    from kernelwright.engine.child import flag_pch

    src = Path(shared_cache) / "builds" / flag_pch.SUBDIR
    dst = Path(own_cache) / "builds" / flag_pch.SUBDIR
    if not src.is_dir() or src.resolve() == dst.resolve():
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
FAST_TIMING = {"windows": 3, "max_window_calls": 64, "stability_retries": 0}


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
            # tests judge verdicts, not speed: three windows of at most 64 sets, no repeats on a noisy
            # machine (a third of the timing stage's default cost). The defaults are timed by the
            # benchmarks and by the tests that set their own (test_clock_attacks, test_timing_stability).
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
        )
    )
