"""Several candidates per round (`--candidates K`): K Coder answers, all evaluated across the
(fake) GPUs of a local executor, the Judge reviews the best correct one or the failure that got
furthest, and the run directory records all K. Real CLI, engine, `openai` client and HTTP server."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from conftest import ADD_ONE, CANDIDATES
from helpers.chat_server import ChatServer, Reply
from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult, Status
from kernelwright.loop.forge import choose_candidate
from kernelwright.loop.history import Candidate
from kernelwright.store.rundir import read_summary

needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client")


def answer(name: str) -> str:
    return f"Here it is.\n\n```python\n{(CANDIDATES / f'{name}.py').read_text()}```\n"


PERF = (
    '```json\n{"bottleneck": "two passes over memory", "optimisation": "fuse relu and add", "expected_speedup": 1.5}'
    "\n```"
)


def _cand(i: int, status: Status | None, speedup: float | None = None) -> Candidate:
    return Candidate(index=i, result=None if status is None else EvalResult(status=status, speedup=speedup))


def test_the_judge_reviews_the_fastest_correct_or_the_failure_that_got_furthest():
    chosen, why = choose_candidate(
        [
            _cand(0, Status.PASSED, 1.1),
            _cand(1, Status.INCORRECT),
            _cand(2, Status.PASSED, 1.4),
            _cand(3, Status.PASSED, None),
        ]
    )
    assert chosen.index == 2 and "fastest of 3 correct" in why
    chosen, why = choose_candidate(
        [
            _cand(0, Status.COMPILE_ERROR),
            _cand(1, Status.CRASHED),
            _cand(2, Status.INCORRECT),
            _cand(3, Status.FORMAT_ERROR),
        ]
    )
    assert chosen.index == 2 and "incorrect got furthest" in why
    chosen, _ = choose_candidate([_cand(0, Status.COMPILE_ERROR), _cand(1, Status.RUNTIME_ERROR)])
    assert chosen.index == 1
    chosen, why = choose_candidate([_cand(0, None), _cand(1, None)])  # every Coder call failed
    assert chosen.index == 0 and why == "no candidate was evaluated"
    # a figure the record withholds loses to one that stands; faster_than_hardware to an unstable one
    unstable, physics = _cand(0, Status.PASSED, 22.0), _cand(2, Status.PASSED, 50.0)
    assert unstable.result is not None and physics.result is not None
    unstable.result.metadata = {"guards": {"flags": {"timing_unstable": "a loaded machine"}}}
    physics.result.metadata = {"guards": {"flags": {"faster_than_hardware": "under the floor"}}}
    assert choose_candidate([unstable, _cand(1, Status.PASSED, 1.2), physics])[0].index == 1
    assert choose_candidate([physics, unstable])[0].index == 0


@pytest.mark.slow
@needs_openai
def test_three_candidates_per_round_on_two_fake_gpus(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    out = tmp_path / "run"
    script = {
        # round 0: wrong, correct, no code; round 1: raises, segfaults, wrong
        "coder-model": [
            Reply(answer("py_wrong")),
            Reply(answer("py_correct")),
            Reply("I would fuse it."),
            Reply(answer("py_raises")),
            Reply(answer("py_segfault")),
            Reply(answer("py_wrong")),
        ],
        "judge-model": [Reply(PERF)],
    }
    with ChatServer(script) as server:
        result = CliRunner().invoke(
            app,
            [
                "optimize",
                str(ADD_ONE),
                "--coder",
                "coder-model",
                "--judge",
                "judge-model",
                "--base-url",
                server.base_url,
                "--rounds",
                "2",
                "--backend",
                "cpp",
                "--device",
                "cpu",
                "--trials",
                "2",
                "--no-profile",
                "--candidates",
                "3",
                "--executor",
                "local",
                "--gpus",
                "0,1",
                "--out",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    assert len(server.served("coder-model")) == 6 and server.served("judge-model") == ["Reply"]
    summary = read_summary(out)
    r0, r1 = summary["rounds"]
    assert sorted(r0["candidate_verdicts"]) == ["format_error", "incorrect", "passed"]
    assert sorted(r1["candidate_verdicts"]) == ["crashed", "incorrect", "runtime_error"]
    assert r0["verdict"] == "passed" and r1["verdict"] == "incorrect"  # what each round's Judge would review
    assert summary["best"]["round"] == 0 and (out / "best.py").read_text() == (CANDIDATES / "py_correct.py").read_text()
    # the run directory: one folder per round, and in it one per candidate
    d0, d1 = out / r0["dir"], out / r1["dir"]
    rec0 = json.loads((d0 / "round.json").read_text())
    assert len(rec0["candidates"]) == 3 and rec0["chosen_why"] == "the fastest of 1 correct candidates"
    assert {c["coder"] for c in rec0["candidates"]} == {
        "coder-model@temperature=0.2",
        "coder-model@temperature=0.6",
        "coder-model@temperature=1",
    }
    for c in rec0["candidates"]:
        folder = d0 / c["dir"]
        assert (folder / "coder_response.md").is_file()
        assert (folder / "eval.json").is_file() == (c["verdict"] != "model_error")
        assert json.loads((folder / "eval.json").read_text())["status"] == c["verdict"]
    evaluated = [
        c
        for c in rec0["candidates"] + json.loads((d1 / "round.json").read_text())["candidates"]
        if c["verdict"] != "format_error"
    ]
    assert len(evaluated) == 5 and {c["gpu"] for c in evaluated} == {"0", "1"}  # spread over both GPUs
    # the Judge reviewed the correct one, with its code; the round's own files are the chosen candidate's
    assert (d0 / "candidate.py").read_text() == (CANDIDATES / "py_correct.py").read_text()
    assert "clamp_min" in (d0 / "judge_prompt.md").read_text()
    assert (d1 / "candidate.py").read_text() == (CANDIDATES / "py_wrong.py").read_text()
    assert (
        rec0["tokens"]
        == sum(c["call"]["prompt_tokens"] + c["call"]["completion_tokens"] for c in rec0["candidates"])
        + rec0["judge"]["prompt_tokens"]
        + rec0["judge"]["completion_tokens"]
    )
    # round 1's Coder prompt is the optimisation prompt built on the best (round 0's correct candidate)
    assert r1["kind"] == "optimise"
