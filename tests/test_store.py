"""The run store: schema and version, transactions, a writer killed with SIGKILL (the file stays
sound and keeps every committed transaction), indexing a run directory, and resume: a run read
back from its files and continued gives the run that was never stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from kernelwright.core.config import LoopConfig
from kernelwright.core.record import EvalResult, RoundVerdict, Status, TimingStats
from kernelwright.loop.forge import Forge
from kernelwright.models.chat import Completion, Usage
from kernelwright.store import open_store
from kernelwright.store.db import SCHEMA_VERSION, Store, StoreError
from kernelwright.store.indexer import index_run
from kernelwright.store.queries import result_of
from kernelwright.store.rundir import RunDir, RunDirError, load_rounds, read_summary

PROBLEM = FIXTURES / "suite" / "level1" / "1_add_one.py"


def test_schema_version_wal_and_reopen(tmp_path):
    path = tmp_path / "kw.db"
    with Store.open(path) as db:
        assert db.query("PRAGMA journal_mode")[0][0] == "wal"
        assert db.query("SELECT version FROM schema_version")[0][0] == SCHEMA_VERSION
        tables = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"suites", "runs", "rounds", "candidates", "evaluations", "profiles", "model_calls"} <= tables
    with Store.open(path) as db:  # reopened: the same single version row
        assert db.query("SELECT count(*) FROM schema_version")[0][0] == 1
        db.conn.execute("UPDATE schema_version SET version=99")
    with pytest.raises(StoreError, match="schema version 99.*use a new --store"):
        Store.open(path)
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable run store .*move it aside"):
        Store.open(tmp_path / "junk.db")
    with pytest.raises(StoreError, match="no run store at"):
        Store.open(tmp_path / "absent.db", readonly=True)


def test_a_failed_transaction_leaves_nothing(tmp_path):
    with Store.open(tmp_path / "kw.db") as db:
        with pytest.raises(RuntimeError):
            with db.transaction() as tx:
                tx.execute("INSERT INTO candidates (hash, code) VALUES ('h1', 'x')")
                raise RuntimeError("interrupted half-way")
        assert db.query("SELECT count(*) FROM candidates")[0][0] == 0


WRITER = r"""
import sys
from kernelwright.store.db import Store
db = Store.open(sys.argv[1])
i = int(sys.argv[2])
while True:
    with db.transaction() as tx:   # several statements, one transaction
        tx.execute("INSERT INTO candidates (hash, code) VALUES (?, ?)", (f"h{i}", "x" * 5000))
        tx.execute(
            "INSERT INTO suites (id, kind, problems, out_dir, created) VALUES (?, 'eval', '[]', '/', 0)", (f"s{i}",)
        )
    print(i, flush=True)            # acknowledged only after COMMIT returned
    i += 1
"""


def test_sigkill_never_leaves_the_store_unreadable_nor_loses_a_commit(tmp_path):
    path, start = tmp_path / "kw.db", 0
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for kill_after in (0.05, 0.3, 0.15, 0.6, 0.02):  # a kill at several points, in a loop
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(start)], stdout=subprocess.PIPE, text=True, env=env
        )
        first = proc.stdout.readline()  # at least one commit, then let it run a while
        assert first.strip(), "the writer did not start"
        time.sleep(kill_after)
        proc.send_signal(signal.SIGKILL)
        acked = [int(first)] + [int(line) for line in proc.stdout.read().split()]
        proc.wait()
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        hashes = {r[0] for r in conn.execute("SELECT hash FROM candidates")}
        suites = {r[0] for r in conn.execute("SELECT id FROM suites")}
        conn.close()
        assert {f"h{i}" for i in acked} <= hashes  # no acknowledged commit lost
        assert {h[1:] for h in hashes} == {s[1:] for s in suites}  # no transaction half-applied
        start = max(int(h[1:]) for h in hashes) + 1


# ---- the run directory ---------------------------------------------------------------------------


def test_a_used_run_directory_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    with pytest.raises(RunDirError, match="pass a new --out"):
        RunDir(tmp_path / "run", PROBLEM, {})


# ---- resume: a run read back from its files ----------------------------------------------------


class Scripted:
    """A Coder or Judge whose answer depends on the prompt (as a deterministic model would)."""

    def __init__(self, name: str):
        self.name = name

    def complete(self, messages):
        prompt = messages[-1]["content"]
        if self.name == "judge":
            if "failed its evaluation" in prompt:
                body = {"critical_issue": "wrong", "why_it_matters": "all of it", "minimal_fix_hint": "fix it"}
            else:
                body = {"bottleneck": "b", "optimisation": "o", "expected_speedup": 1.5}
            text = "```json\n" + json.dumps(body) + "\n```"
        else:
            n = len(re.findall(r"SPEED", prompt))  # the code it was shown
            speed = {0: "WRONG", 1: "SPEED=1.0", 2: "SPEED=1.6"}.get(n, "SPEED=1.61")
            if "Your job is to FIX" in prompt:
                speed = "SPEED=1.0"
            elif "FASTER" in prompt:
                m = re.search(r"SPEED=([\d.]+)", prompt)
                speed = f"SPEED={float(m.group(1)) * 1.3:.2f}" if m else "SPEED=1.0"
            text = f"```python\nimport torch.nn as nn\n\n# {speed}\nclass ModelNew(nn.Module):\n    pass\n```"
        return Completion(text=text, usage=Usage(len(prompt.split()), len(text.split())), model=self.name)


def fake_evaluate(problem, code, on_stage, report_dir) -> EvalResult:
    m = re.search(r"SPEED=([\d.]+)", code)
    if not m:
        return EvalResult(status=Status.INCORRECT, error_log="Outputs are not close")
    s = float(m.group(1))
    t = TimingStats(
        median_ms=1 / s,
        mean_ms=1 / s,
        std_ms=0,
        min_ms=1 / s,
        max_ms=1 / s,
        p10_ms=1 / s,
        p90_ms=1 / s,
        iterations=10,
        warmup=3,
        clock="perf_counter",
        l2_flush=False,
    )
    return EvalResult(
        status=Status.PASSED,
        correct=True,
        speedup=s,
        candidate_ms=1 / s,
        reference_ms=1.0,
        candidate_timing=t,
        speedup_basis="device",
        speedup_as_launched=0.9 * s,
    )


def forge(run_dir: RunDir, rounds: int) -> Forge:
    return Forge(
        PROBLEM,
        Scripted("coder"),
        Scripted("judge"),
        fake_evaluate,
        LoopConfig(rounds=rounds, backend="cpp"),
        device="cpu",
        recorder=run_dir,
    )


def rounds_of(path: Path) -> list[dict]:
    drop = ("wall_s", "coder", "judge")
    return [
        {k: v for k, v in json.loads((d / "round.json").read_text()).items() if k not in drop}
        for d in sorted(path.glob("0*_*"))
    ]


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it is written."""


class KilledAt:
    """A recorder and an evaluator that die at the `at`-th evaluation: the round's folder exists (the
    loop made it for the profiler), nothing of the round is written, and no summary after it."""

    def __init__(self, run_dir: RunDir, at: int):
        self.run_dir, self.at, self.calls, self.dead = run_dir, at, 0, False

    def evaluate(self, *args):
        self.calls += 1
        if self.calls == self.at:
            self.dead = True
            raise Killed()
        return fake_evaluate(*args)

    def round_dir(self, rnd):
        return self.run_dir.round_dir(rnd)

    def record_round(self, rnd, state):
        if not self.dead:
            self.run_dir.record_round(rnd, state)

    def finish(self, state):
        if not self.dead:
            self.run_dir.finish(state)


def test_resume_continues_with_the_same_best_as_a_run_never_stopped(tmp_path):
    straight = RunDir(tmp_path / "straight", PROBLEM, {})
    forge(straight, 5).run()

    killer = KilledAt(RunDir(tmp_path / "cut", PROBLEM, {}), at=4)
    f = Forge(
        PROBLEM,
        Scripted("coder"),
        Scripted("judge"),
        killer.evaluate,
        LoopConfig(rounds=5, backend="cpp"),
        device="cpu",
        recorder=killer,
    )
    with pytest.raises(Killed):
        f.run()  # killed in round 3, after its Coder answered
    (stray,) = (tmp_path / "cut").glob("003_*")
    assert not (stray / "round.json").exists()
    reopened, done = RunDir.reopen(tmp_path / "cut")
    assert [r.index for r in done] == [0, 1, 2] and not stray.exists()
    assert list((tmp_path / "cut").glob(f".cut-{stray.name}-*"))  # kept aside for a person, invisible to replay
    f = forge(reopened, 5)
    f.restore(done, wall_s=read_summary(tmp_path / "cut")["wall_s"])
    assert f.state.best is done[2] and f.state.best.speedup == pytest.approx(1.3)  # 1.0, then 1.3x of it
    assert f.pending is not None and f.pending.judged_round == 2  # the Judge's expectation is still to be measured
    assert f.state.usage.total_tokens == read_summary(tmp_path / "cut")["tokens"]["total"]
    state = f.run()

    assert rounds_of(tmp_path / "cut") == rounds_of(tmp_path / "straight")
    a, b = read_summary(tmp_path / "straight"), read_summary(tmp_path / "cut")
    for key in ("best", "rounds_run", "tokens", "stop_reason", "state"):
        assert a[key] == b[key], key
    assert state.best.index == a["best"]["round"]
    assert [r.verdict for r in load_rounds(tmp_path / "cut")] == [r["verdict"] for r in a["rounds"]]
    assert [r["expectation_outcome"] for r in a["rounds"]] == [r["expectation_outcome"] for r in b["rounds"]]
    for name in ("judge_prompt.md", "coder_prompt.md"):  # every model saw the same prompts
        pairs = zip(
            sorted((tmp_path / "straight").glob(f"0*_*/{name}")),
            sorted((tmp_path / "cut").glob(f"0*_*/{name}")),
            strict=True,
        )
        assert all(x.read_text() == y.read_text() for x, y in pairs), name


def test_a_run_stopped_at_its_round_limit_continues_like_a_longer_run(tmp_path):
    """Its last round was not judged (the run stopped there): the resumed run asks the Judge first."""
    straight = RunDir(tmp_path / "straight", PROBLEM, {})
    forge(straight, 4).run()
    forge(RunDir(tmp_path / "short", PROBLEM, {}), 2).run()
    assert not list((tmp_path / "short").glob("001_*/judge_prompt.md"))
    reopened, done = RunDir.reopen(tmp_path / "short")
    f = forge(reopened, 4)
    f.restore(done)
    assert f.unjudged is done[1]
    f.run()
    assert rounds_of(tmp_path / "short") == rounds_of(tmp_path / "straight")
    for name in ("judge_prompt.md", "coder_prompt.md"):
        for a, b in zip(
            sorted((tmp_path / "straight").glob(f"0*_*/{name}")),
            sorted((tmp_path / "short").glob(f"0*_*/{name}")),
            strict=True,
        ):
            assert a.read_text() == b.read_text(), (a, b)


def test_a_run_stopped_by_a_failed_coder_call_redoes_that_round_on_resume(tmp_path):
    from kernelwright.models.chat import ModelError

    class Down(Scripted):
        def __init__(self, name, fail_at):
            super().__init__(name)
            self.calls, self.fail_at = 0, fail_at

        def complete(self, messages):
            self.calls += 1
            if self.calls == self.fail_at:
                raise ModelError("503 the provider is down (retries spent)")
            return super().complete(messages)

    forge(RunDir(tmp_path / "straight", PROBLEM, {}), 4).run()
    rd = RunDir(tmp_path / "down", PROBLEM, {})
    state = Forge(
        PROBLEM,
        Down("coder", fail_at=3),
        Scripted("judge"),
        fake_evaluate,
        LoopConfig(rounds=4, backend="cpp"),
        device="cpu",
        recorder=rd,
    ).run()
    assert state.stop_reason.startswith("coder failed") and state.rounds[-1].verdict == "model_error"
    reopened, done = RunDir.reopen(tmp_path / "down")
    assert len(done) == 2  # the failed round is done again
    f = forge(reopened, 4)
    f.restore(done)
    f.run()
    assert rounds_of(tmp_path / "down") == rounds_of(tmp_path / "straight")


def test_resume_of_a_finished_run_runs_nothing_more(tmp_path):
    rd = RunDir(tmp_path / "r", PROBLEM, {})
    forge(rd, 2).run()
    reopened, done = RunDir.reopen(tmp_path / "r")
    f = forge(reopened, 2)
    f.restore(done)
    assert f.state.stop_reason == "round limit (2) reached"
    assert len(f.run().rounds) == 2


def test_index_a_run_directory_and_read_it_back(tmp_path):
    rd = RunDir(tmp_path / "run", PROBLEM, {"coder": "coder", "judge": "judge"})
    forge(rd, 3).run()
    with Store.open(tmp_path / "kw.db") as db:
        run_id = index_run(db, tmp_path / "run")
        assert index_run(db, tmp_path / "run") == run_id  # indexing twice gives the same rows
        assert db.integrity_check() == "ok"
    with open_store(tmp_path / "kw.db") as api:
        run = api.run(run_id)
        summary = read_summary(tmp_path / "run")
        assert (run["state"], run["rounds_run"], run["best_round"]) == ("finished", 3, summary["best"]["round"])
        assert run["tokens"] == summary["tokens"]["total"]
        rounds = api.rounds(run_id)
        assert [r["verdict"] for r in rounds] == ["incorrect", "passed", "passed"]
        assert rounds[0]["critique"]["critical_issue"] == "wrong" and "WRONG" in rounds[0]["code"]
        assert len(api.evaluations(run=run_id)) == 3 and api.evaluations(run=run_id)[1]["record"]["speedup"] == 1.0
        calls = api.model_calls(run_id)
        assert [(c["round_idx"], c["role"]) for c in calls] == [
            (0, "coder"),
            (0, "judge"),
            (1, "coder"),
            (1, "judge"),
            (2, "coder"),
        ]
        (problem,) = api.problems(run_id)
        assert problem["verdicts"] == ["incorrect", "passed", "passed"] and problem["correct"]
        # what the speed-up measures, and the calls as launched, come with the kept kernel's figure
        assert problem["speedup_basis"] == "device"
        assert problem["speedup_as_launched"] == pytest.approx(0.9 * problem["speedup"])
        assert all(isinstance(v, RoundVerdict) for v in [problem["verdict"], *problem["verdicts"]])
        typed = result_of(api.evaluations(run=run_id)[1])
        assert isinstance(typed, EvalResult) and typed.status is Status.PASSED and typed.speedup == 1.0


def test_round_verdicts_are_every_status_and_why_a_round_has_no_evaluation():
    """A round's verdict is its evaluation's Status, or one of three reasons it has none; the report
    has a colour for each."""
    from kernelwright.report.plots import VERDICT_COLORS

    assert [RoundVerdict.of(s).value for s in Status] == [s.value for s in Status]
    extra = {v.value for v in RoundVerdict} - {s.value for s in Status}
    assert extra == {"model_error", "not_run", "no_candidate"}
    assert set(VERDICT_COLORS) == set(RoundVerdict) and f"{RoundVerdict.NOT_RUN}" == "not_run"


def test_the_indexer_reads_records_through_eval_result(tmp_path):
    """The store's evaluation rows come from the typed record; an eval.json that does not load as an
    EvalResult is not indexed (its round still is), as an unreadable one is not."""
    rd = RunDir(tmp_path / "run", PROBLEM, {"coder": "coder", "judge": "judge"})
    forge(rd, 2).run()
    first, second = sorted(p for p in (tmp_path / "run").iterdir() if p.is_dir() and p.name[:3].isdigit())
    broken = json.loads((second / "eval.json").read_text()) | {"no_such_field": 1}
    (second / "eval.json").write_text(json.dumps(broken))
    with Store.open(tmp_path / "kw.db") as db:
        run_id = index_run(db, tmp_path / "run")
    with open_store(tmp_path / "kw.db") as api:
        assert [r["verdict"] for r in api.rounds(run_id)] == ["incorrect", "passed"]
        (row,) = api.evaluations(run=run_id)
        assert row["round_idx"] == 0 and row["status"] == "incorrect"
        assert row["record"] == EvalResult.from_json((first / "eval.json").read_text()).to_dict()


def suite_rows(tmp_path, engines: dict) -> dict[str, dict]:
    """Runs of the loop, one per problem name with its stand-in engine, indexed as one suite ("s"):
    the store's row of each problem."""
    with Store.open(tmp_path / "kw.db") as db:
        for name, evaluate in engines.items():
            rd = RunDir(tmp_path / name, PROBLEM, {})
            Forge(
                PROBLEM,
                Scripted("coder"),
                Scripted("judge"),
                evaluate,
                LoopConfig(rounds=2, backend="cpp"),
                device="cpu",
                recorder=rd,
            ).run()
            with db.transaction() as tx:
                tx.execute(
                    "INSERT OR IGNORE INTO suites (id, kind, problems, out_dir, created) "
                    "VALUES ('s', 'optimize', '[]', '/', 0)"
                )
            index_run(db, tmp_path / name, suite_id="s", problem=name)
    with open_store(tmp_path / "kw.db") as api:
        return {r["problem"]: r for r in api.problems("s")}


def test_a_problem_with_a_degenerate_reference_is_counted_apart(tmp_path):
    """Issue 13's flag, in either spelling, on an evaluation in the store: the problem leaves every
    rate and mean and is listed apart (hand-made records)."""
    from kernelwright.suites.metrics import ProblemOutcome, summarize

    def flagged(where: str):
        def evaluate(problem, code, on_stage, report_dir):
            result = fake_evaluate(problem, code, on_stage, report_dir)
            result.metadata = (
                {"guards": {"flags": {"degenerate_reference": True}}}
                if where == "guards"
                else {"degenerate_reference": {"reason": "the output is all zeros"}}
            )
            return result

        return evaluate

    rows = suite_rows(tmp_path, {"plain": fake_evaluate, "deg_guards": flagged("guards"), "deg_meta": flagged("meta")})
    assert {k: r["degenerate"] for k, r in rows.items()} == {"plain": False, "deg_guards": True, "deg_meta": True}
    m = summarize([ProblemOutcome(**r) for r in rows.values()])
    assert m.problems == 1 and m.degenerate == ["deg_guards", "deg_meta"] and m.correct == 1


def test_a_withheld_speed_up_stays_in_the_row_and_leaves_the_suites_figures(tmp_path):
    """A problem whose kept kernel's record says `timing_unstable` or `faster_than_hardware`: its row
    keeps the figure and names the flag, and the suite's fast_p and means count it as untimed."""
    from kernelwright.suites.metrics import ProblemOutcome, summarize

    def flagged(name: str | None):
        def evaluate(problem, code, on_stage, report_dir):
            result = fake_evaluate(problem, code, on_stage, report_dir)
            if name is not None:
                result.metadata = {"guards": {"flags": {name: "evidence", "launch_bound": "a fact"}}}
            return result

        return evaluate

    rows = suite_rows(
        tmp_path,
        {"plain": flagged(None), "unstable": flagged("timing_unstable"), "physics": flagged("faster_than_hardware")},
    )
    assert {k: r["speedup_withheld_by"] for k, r in rows.items()} == {
        "plain": [],
        "unstable": ["timing_unstable"],
        "physics": ["faster_than_hardware"],
    }
    assert all(r["correct"] and r["speedup"] is not None for r in rows.values())  # the figure stays in the row
    m = summarize([ProblemOutcome(**r) for r in rows.values()])
    assert m.correct == 3 and m.speedups_withheld == ["physics", "unstable"]
    assert m.mean_speedup == pytest.approx(rows["plain"]["speedup"])


def test_a_child_that_died_in_start_up_is_evaluated_once_more_a_candidate_crash_is_not():
    """A crash before the candidate was imported is the machine's, not the candidate's."""
    import concurrent.futures as cf

    from kernelwright.core.record import Stage
    from kernelwright.executors.interface import EvalTask
    from kernelwright.suites.driver import once_more_if_died_early

    class Once:
        def __init__(self):
            self.submitted = 0

        def submit(self, task, on_stage=None):
            self.submitted += 1
            fut = cf.Future()
            fut.set_result(EvalResult(status=Status.PASSED, correct=True, speedup=1.1))
            return fut

    task = EvalTask(key="k", problem=PROBLEM, candidate_text="code")
    early = EvalResult(
        status=Status.CRASHED, error_stage=Stage.STARTUP, error_log="The evaluation process exited with code 1"
    )
    ex = Once()
    again = once_more_if_died_early(ex, task, early)
    assert ex.submitted == 1 and again.status is Status.PASSED
    assert again.metadata["retried_after"] == "The evaluation process exited with code 1"
    for stage in (Stage.BUILD, Stage.CORRECTNESS):  # the candidate ran: its crash is its verdict
        ex = Once()
        late = EvalResult(status=Status.CRASHED, error_stage=stage)
        assert once_more_if_died_early(ex, task, late) is late and ex.submitted == 0
