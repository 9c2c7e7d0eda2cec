"""Several draws of one evaluation (`--draws`, engine/draws.py): whole evaluations of a passed candidate,
each in processes of its own, one record. A side's time is steady within a process and moves between
processes (2 x H200, 2026-11-30: level2/68's reference 14.5 us in every window of two suite runs and
15.3 us in every window of a third), so only other processes can average it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import EvalResult, Status
from kernelwright.engine import draws
from kernelwright.engine.errors import EngineError
from kernelwright.engine.evaluation import evaluate
from tests.conftest import ADD_ONE, CANDIDATES, ROOT, fast_timing_toml


def _passed(speedup: float | None, flags: dict[str, str] | None = None, total_s: float = 4.0) -> EvalResult:
    r = EvalResult(status=Status.PASSED, speedup=speedup, reference_ms=1.0)
    r.candidate_ms = 1.0 / speedup if speedup else None
    r.stage_times.total_s = total_s
    r.metadata["guards"] = {"checked": ["mutates_inputs"], "flags": dict(flags or {})}
    return r


def test_three_draws_give_the_median_draws_record_and_keep_each_ones_figures():
    # a launch-bound pair's three processes: 1.133x, 1.261x and 1.168x (level2/68 in three suite runs)
    runs = [_passed(1.133, total_s=4.1), _passed(1.261, total_s=3.9), _passed(1.168, total_s=4.0)]
    record = draws.combine(runs, 3)
    assert record.speedup == 1.168 and record.candidate_ms == runs[2].candidate_ms
    d = record.metadata["draws"]
    assert d["asked"] == 3 and d["ran"] == 3 and d["chosen"] == 3
    assert [e["speedup"] for e in d["each"]] == [1.133, 1.261, 1.168]
    assert [e["total_s"] for e in d["each"]] == [4.1, 3.9, 4.0]
    assert abs(d["spread"] - (1.261 / 1.133 - 1)) < 1e-4
    assert runs[2].metadata.get("draws") is None  # the draws themselves stay as they ran


def test_an_even_count_of_draws_gives_the_lower_middle_never_the_optimistic_one():
    record = draws.combine([_passed(2.0), _passed(1.5), _passed(1.8), _passed(3.0)], 4)
    assert record.speedup == 1.8 and record.metadata["draws"]["chosen"] == 3


def test_a_draw_that_fails_is_the_record_and_no_more_draws_are_made():
    bad = EvalResult(status=Status.INCORRECT, error_log="trial 1: max_abs_err 0.5")
    runs = [_passed(1.4), bad]
    assert not draws.wanted(runs, 3)
    record = draws.combine(runs, 3)
    assert record.status is Status.INCORRECT and record.speedup is None
    assert record.metadata["draws"]["chosen"] == 2 and record.metadata["draws"]["ran"] == 2
    assert [e["status"] for e in record.metadata["draws"]["each"]] == ["passed", "incorrect"]


def test_a_passed_draw_without_a_speedup_settles_the_record():
    runs = [_passed(1.2), _passed(None)]
    assert draws.settled(runs) and not draws.wanted(runs, 5)
    assert draws.combine(runs, 5).speedup is None


def test_a_flag_of_any_draw_stands_in_the_record_and_withholds_as_it_would_alone():
    unstable = {"timing_unstable": "the reference's windows spread 1.4x"}
    runs = [_passed(1.10), _passed(1.50, unstable), _passed(1.20)]
    record = draws.combine(runs, 3)
    assert record.speedup == 1.20  # the median draw: the third
    assert record.flags()["timing_unstable"] == "(draw 2) the reference's windows spread 1.4x"
    assert not record.speedup_trusted and record.speedup_withheld_by == ["timing_unstable"]
    assert record.metadata["guards"]["checked"] == ["mutates_inputs"]
    # the chosen draw's own words where it raised the same flag
    both = draws.combine([_passed(1.0, {"autotuned": "a"}), _passed(1.1, {"autotuned": "b"}), _passed(1.2)], 3)
    assert both.flags()["autotuned"] == "b"


def test_one_draw_asked_is_the_evaluation_as_it_came():
    first = _passed(1.3)
    assert not draws.wanted([first], 1)
    assert draws.combine([first], 1).metadata["draws"]["ran"] == 1


def test_draws_below_one_are_refused_in_one_line(cpu_config):
    cfg = dataclasses.replace(cpu_config, timing=dataclasses.replace(cpu_config.timing, draws=0))
    with pytest.raises(EngineError, match=r"^--draws \(timing.draws\) must be at least 1 \(got 0\)$"):
        evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cfg)
    assert EvalConfig().timing.draws == 1


def test_a_candidate_evaluated_in_three_draws_runs_three_whole_evaluations(cpu_config):
    cfg = dataclasses.replace(cpu_config, timing=dataclasses.replace(cpu_config.timing, draws=3))
    stages: list[str] = []
    result = evaluate(ADD_ONE, CANDIDATES / "py_correct.py", cfg, on_stage=stages.append)
    assert result.status is Status.PASSED, result.error_log
    d = result.metadata["draws"]
    assert d["ran"] == 3 and [e["status"] for e in d["each"]] == ["passed"] * 3
    assert "draw 2 of 3" in stages and "draw 3 of 3" in stages
    assert stages.count("correctness") == 3  # every draw checks again
    assert result.speedup == sorted(e["speedup"] for e in d["each"])[1]


def _two_draws_of(cpu_config, trick: str, kept: str) -> EvalResult:
    """py_correct.py with `trick` appended, in two draws with no sandbox (the machine's /tmp lasts
    from one process to the next); `kept`, the file the trick keeps there, removed after."""
    text = (CANDIDATES / "py_correct.py").read_text() + "\n\nimport os as _os\n" + f"_KEPT = {kept!r}\n" + trick
    cfg = dataclasses.replace(cpu_config, sandbox="none", timing=dataclasses.replace(cpu_config.timing, draws=2))
    try:
        return evaluate(ADD_ONE, None, cfg, candidate_text=text)
    finally:
        if os.path.exists(kept):
            os.unlink(kept)


def test_a_candidate_that_cheats_only_in_a_later_process_fails_the_evaluation(cpu_config):
    # It keeps a mark and, once marked, answers with zeros: a later draw that only timed would never see it
    result = _two_draws_of(
        cpu_config,
        "_later = _os.path.exists(_KEPT)\n"
        "open(_KEPT, 'w').close()\n"
        "_honest = ModelNew.forward\n"
        "def _forward(self, *args):\n"
        "    out = _honest(self, *args)\n"
        "    return out * 0 if _later else out\n"
        "ModelNew.forward = _forward\n",
        f"/tmp/kw-draw-mark-{uuid.uuid4().hex}",
    )
    assert result.status is Status.INCORRECT, result.summary_line()
    assert [e["status"] for e in result.metadata["draws"]["each"]] == ["passed", "incorrect"]


def test_outputs_kept_from_an_earlier_draw_do_not_answer_a_later_one(cpu_config):
    # Each draw's judge draws its inputs from a secret of its own: what a candidate saved of one
    # process's outputs is the wrong answer in the next
    result = _two_draws_of(
        cpu_config,
        "_old = torch.load(_KEPT) if _os.path.exists(_KEPT) else []\n"
        "_new = []\n"
        "_honest = ModelNew.forward\n"
        "def _forward(self, x):\n"
        "    for xo, yo in _old:\n"
        "        if xo.shape == x.shape:\n"
        "            return yo.clone()\n"
        "    y = _honest(self, x)\n"
        "    _new.append((x.detach().clone(), y.detach().clone()))\n"
        "    torch.save(_new[:4], _KEPT)\n"
        "    return y\n"
        "ModelNew.forward = _forward\n",
        f"/tmp/kw-draw-outputs-{uuid.uuid4().hex}.pt",
    )
    assert result.status is Status.INCORRECT, result.summary_line()
    assert [e["status"] for e in result.metadata["draws"]["each"]] == ["passed", "incorrect"]


def _cli(*args, cwd, cache_dir) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), KERNELWRIGHT_CACHE=cache_dir, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "kernelwright.cli.main", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_with_draws_shows_each_draws_speedup_and_refuses_none_in_one_line(tmp_path, cache_dir):
    (tmp_path / "kernelwright.toml").write_text(fast_timing_toml())
    common = ("eval", ADD_ONE, CANDIDATES / "py_correct.py", "--device", "cpu", "--no-server", "--trials", "2")
    res = _cli(*common, "--draws", "2", "--json", cwd=tmp_path, cache_dir=cache_dir)
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    assert record["status"] == "passed" and record["metadata"]["draws"]["ran"] == 2
    shown = _cli(*common, "--draws", "2", cwd=tmp_path, cache_dir=cache_dir)
    assert shown.returncode == 0 and re.search(r"draws\s+2 of 2, each in processes of its own: \S+x \S+x", shown.stdout)
    refused = _cli(*common, "--draws", "0", cwd=tmp_path, cache_dir=cache_dir)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.startswith("error: --draws (timing.draws) must be at least 1 (got 0)")


def test_the_other_draws_children_start_together_after_the_first_and_a_failed_draw_discards_the_rest(
    monkeypatch, tmp_path, cpu_config
):
    from kernelwright.engine import evaluation

    events: list[str] = []

    class FakeSpare:
        def __init__(self, n: int):
            self.n, self.workdir = n, tmp_path / f"spare{n}"
            self.workdir.mkdir()

        def wait_ready(self, timeout: float) -> bool:
            events.append(f"ready {self.n}")
            return True

        def discard(self, remove_workdir: bool = True) -> None:
            events.append(f"discard {self.n}")

    made = iter(range(2, 10))
    monkeypatch.setattr(evaluation, "prestart", lambda cfg: (events.append("start"), FakeSpare(next(made)))[1])
    outcomes = iter([EvalResult(status=Status.INCORRECT, error_log="draw 2 wrong")])

    def fake_run(problem_path, cand_path, config, workdir, on_stage, spare, on_children):
        events.append(f"run {spare.n}")
        assert not config.profile.enabled and not config.sanitize  # those ran with the first draw
        assert cand_path.read_text() == "candidate text" and cand_path.parent == spare.workdir
        return next(outcomes)

    monkeypatch.setattr(evaluation, "_run", fake_run)
    cfg = dataclasses.replace(cpu_config, timing=dataclasses.replace(cpu_config.timing, draws=4))
    record = evaluation._more_draws(_passed(1.2), ADD_ONE, "candidate text", cfg, None, None)
    # three spares started, all ready before the second draw; the failure ends it; the two unused go
    assert events == ["start", "start", "start", "ready 2", "ready 3", "ready 4", "run 2", "discard 3", "discard 4"]
    assert record.status is Status.INCORRECT and record.metadata["draws"]["ran"] == 2
    assert not (tmp_path / "spare2").exists()  # a used draw's directory is removed


def test_the_first_draws_profile_and_sanitizer_run_stay_when_another_draw_is_the_median():
    first = _passed(1.5)
    first.metadata["profile"] = {"source": "ncu", "kernels": [{"name": "swish_kernel"}]}
    first.metadata["sanitize"] = {"tool": "memcheck", "errors": 0}
    first.stage_times.profile_s = 7.5
    record = draws.combine([first, _passed(1.2), _passed(1.3)], 3)
    assert record.speedup == 1.3 and record.metadata["draws"]["chosen"] == 3
    assert record.metadata["profile"]["kernels"][0]["name"] == "swish_kernel"
    assert record.metadata["sanitize"]["errors"] == 0 and record.stage_times.profile_s == 7.5


def test_a_draw_whose_children_cannot_start_stops_those_that_did_and_says_why(monkeypatch, tmp_path, cpu_config):
    from kernelwright.engine import evaluation

    discarded: list[int] = []

    class FakeSpare:
        def __init__(self, n: int):
            self.n, self.workdir = n, tmp_path / f"spare{n}"

        def discard(self, remove_workdir: bool = True) -> None:
            discarded.append(self.n)

    made = iter([FakeSpare(2)])

    def prestart(cfg):
        spare = next(made, None)
        if spare is None:
            raise EngineError("bubblewrap cannot start here; pass --sandbox none")
        return spare

    monkeypatch.setattr(evaluation, "prestart", prestart)
    cfg = dataclasses.replace(cpu_config, timing=dataclasses.replace(cpu_config.timing, draws=3))
    with pytest.raises(EngineError, match="pass --sandbox none"):
        evaluation._more_draws(_passed(1.2), ADD_ONE, "candidate text", cfg, None, None)
    assert discarded == [2]


def _pool_of(size: int, monkeypatch, cpu_config):
    """A warm pool of `size` spares for three draws, once they are there, and the names of the threads
    that started children (the pool's starter is "kw-warm-pool"; a draw's own start, the caller's)."""
    import threading

    from kernelwright.engine import evaluation
    from kernelwright.executors.warm_pool import WarmPool

    real = evaluation.prestart
    started_by: list[str] = []

    def prestart(config):
        started_by.append(threading.current_thread().name)
        return real(config)

    monkeypatch.setattr(evaluation, "prestart", prestart)
    cfg = dataclasses.replace(cpu_config, timing=dataclasses.replace(cpu_config.timing, draws=3))
    pool = WarmPool(cfg, size=size)
    pool.prestart()
    end = time.monotonic() + 120
    while pool.spares() < size and time.monotonic() < end:
        time.sleep(0.1)
    return pool, started_by


def test_in_a_pool_the_later_draws_take_the_pools_ready_spares_and_start_none_of_their_own(monkeypatch, cpu_config):
    """A suite's worker keeps a pool (executors/warm_pool.py) whose spares start up while nothing is
    timed: the later draws take those rather than start their own after the first draw, where the
    start-up (a CUDA context on a GPU: docs/PERFORMANCE.md) would sit on the problem's path."""
    pool, started_by = _pool_of(3, monkeypatch, cpu_config)
    taken: list[object] = []
    take = pool._take

    def recorded(wait_s: float = 30.0):
        spare = take(wait_s)
        taken.append(spare)
        return spare

    monkeypatch.setattr(pool, "_take", recorded)
    try:
        result = pool.evaluate(ADD_ONE, CANDIDATES / "py_correct.py")
    finally:
        pool.close()
    assert result.status is Status.PASSED, result.error_log
    assert result.metadata["draws"]["ran"] == 3
    assert len(taken) == 3 and all(s is not None for s in taken)  # the first draw's and the two later ones'
    assert set(started_by) == {"kw-warm-pool"}, started_by  # every child came from the pool's starter


def test_a_later_draw_that_finds_the_pool_empty_starts_its_own_children_at_once(monkeypatch, cpu_config):
    """A pool of one spare (fewer than the draws): the later draws take what is there and start the
    rest themselves, with no wait on the pool's starter, which starts nothing until the first
    draw's timing is followed by another stage (a wait there could only time out: 30 s)."""
    import threading

    pool, started_by = _pool_of(1, monkeypatch, cpu_config)
    try:
        t0 = time.monotonic()
        result = pool.evaluate(ADD_ONE, CANDIDATES / "py_correct.py")
        took = time.monotonic() - t0
    finally:
        pool.close()
    assert result.status is Status.PASSED and result.metadata["draws"]["ran"] == 3, result.error_log
    assert threading.current_thread().name in started_by  # a later draw's own children
    assert took < 30, took  # never the pool's 30 s wait for a spare
