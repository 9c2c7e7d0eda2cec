"""`kernelwright optimize --resume`: a run interrupted and resumed is the run never interrupted,
round by round (the same answers in the same rounds, so the same folder hashes), with a replay
Coder and Judge (the answers already used are not used again), the same best, and the wall time
of every session summed. The CLI runs in-process (typer's CliRunner); the engine is replaced by an
evaluator that reads the speed-up off the code, so the test takes seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_runs import FakeEngine, optimize, recorded_answers

from kernelwright.store.rundir import read_summary


def rounds(run: Path) -> list[tuple]:
    out = []
    for d in sorted(run.glob("0*_*")):
        rec = json.loads((d / "round.json").read_text())
        out.append(
            (
                d.name,
                rec["kind"],
                rec["verdict"],
                rec["speedup"],
                rec["became_best"],
                rec["best_decision"],
                (d / "coder_prompt.md").read_text(),
                (d / "judge_prompt.md").read_text() if (d / "judge_prompt.md").exists() else None,
            )
        )
    return out


def test_interrupted_then_resumed_equals_uninterrupted_round_by_round(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    straight = optimize(monkeypatch, FakeEngine(), answers, "--rounds", "4", "--out", str(tmp_path / "straight"))
    assert straight.exit_code == 0, straight.output

    cut = optimize(monkeypatch, FakeEngine(interrupt_at=2), answers, "--rounds", "4", "--out", str(tmp_path / "cut"))
    assert cut.exit_code == 130, cut.output
    first_session = read_summary(tmp_path / "cut")
    assert first_session["rounds"][0]["verdict"] == "incorrect" and first_session["wall_s"] > 0
    resumed = optimize(monkeypatch, FakeEngine(), answers, "--rounds", "4", "--resume", str(tmp_path / "cut"))
    assert resumed.exit_code == 0, resumed.output
    assert "resuming after round 0 (best so far none yet)" in resumed.output
    assert "None" not in resumed.output

    # every round: the same answer (the folder's hash), verdict, speed-up, decision and prompts
    assert rounds(tmp_path / "cut") == rounds(tmp_path / "straight")
    assert [r[0] for r in rounds(tmp_path / "cut")] == [r[0] for r in rounds(tmp_path / "straight")]
    assert len({r[0].split("_")[1] for r in rounds(tmp_path / "cut")}) == 4  # no answer played twice
    a, b = read_summary(tmp_path / "straight"), read_summary(tmp_path / "cut")
    for key in ("best", "rounds_run", "stop_reason", "state"):
        assert a[key] == b[key], key
    assert b["best"]["speedup"] == pytest.approx(1.6)
    # the wall time of both sessions: the first session's, plus at least the rounds run after it
    assert b["wall_s"] >= first_session["wall_s"] + sum(r["wall_s"] for r in b["rounds"][1:])
    assert b["wall_s"] >= sum(r["wall_s"] for r in b["rounds"])


def test_resume_says_the_best_so_far_when_there_is_one(tmp_path, monkeypatch):
    answers = recorded_answers(tmp_path / "answers")
    cut = optimize(monkeypatch, FakeEngine(interrupt_at=3), answers, "--rounds", "4", "--out", str(tmp_path / "cut"))
    assert cut.exit_code == 130, cut.output
    resumed = optimize(monkeypatch, FakeEngine(), answers, "--rounds", "4", "--resume", str(tmp_path / "cut"))
    assert resumed.exit_code == 0, resumed.output
    assert "resuming after round 1 (best so far 1.000x)" in resumed.output
