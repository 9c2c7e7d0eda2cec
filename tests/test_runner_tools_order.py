"""The engine's own tools wait for the candidate's first call: a spare's start-up makes no exportable
allocation and opens no profiler session before the candidate's weights, inputs and first call are
in place (a process that did either first ran CUDA-L1's level1/77 at 1.41 ms a call against a plain
process's 1.30: runner.py `warm_up`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from kernelwright.engine.child import device_handoff, protocol
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.runner import Runner


class _Reports(Channel):
    """The runner's reports, kept in order beside the calls (no pipe)."""

    def __init__(self, events: list[str]):
        super().__init__(None)
        self.events = events

    def send(self, kind: str, **payload: Any) -> None:
        if kind != "stage":
            self.events.append(f"report:{kind}")


class _OnAGpu:
    """What the runner asks of its device after start-up, as a GPU answers (no GPU here)."""

    type = "cuda"


def _runner(cpu_config, events: list[str], monkeypatch) -> Runner:
    job = {"config": cpu_config.to_dict(), "candidate_path": "candidate.py", "handoff_fd": 7}
    runner = Runner(job, _Reports(events))
    runner.device = torch.device("cpu")

    @contextlib.contextmanager
    def profile(*args: Any, **kwargs: Any):
        events.append("profiler")
        yield

    monkeypatch.setattr(torch.autograd.profiler, "profile", profile)
    monkeypatch.setattr(device_handoff, "probe", lambda device: events.append("hand-off probe") or "")
    monkeypatch.setattr(runner, "read_inputs", lambda name: [torch.ones(3)])
    monkeypatch.setattr(runner, "write", lambda label, out: f"{label}.kwt")
    monkeypatch.setattr(runner, "patches", lambda when: None)
    monkeypatch.setattr(runner, "sync", lambda: None)
    monkeypatch.setattr(runner, "build_failure_after_import", lambda exc, stage: None)
    runner.cand_model = lambda x: events.append("call") or x + 1
    return runner


def test_a_spare_probes_the_hand_off_after_the_candidates_first_call_and_once(cpu_config, monkeypatch):
    events: list[str] = []
    runner = _runner(cpu_config, events, monkeypatch)
    runner.warm_up()
    assert events == [], "the spare's start-up used the engine's tools before any candidate code ran"
    runner.device = _OnAGpu()  # type: ignore[assignment]  (from here on as on a GPU)
    runner.call_cmd(protocol.Call(label="trial0", inputs="in0.kwt"))
    first = ["call", "hand-off probe", "call", "report:output"]  # the settling call, the probe, the checked call
    assert events == first, events
    runner.call_cmd(protocol.Call(label="trial1", inputs="in1.kwt"))
    assert events == [*first, "call", "report:output"], events


def test_a_runner_that_was_not_a_spare_probes_nothing_before_its_outputs(cpu_config, monkeypatch):
    events: list[str] = []
    runner = _runner(cpu_config, events, monkeypatch)
    runner.device = _OnAGpu()  # type: ignore[assignment]
    runner.call_cmd(protocol.Call(label="trial0", inputs="in0.kwt"))
    # (its first export is its first output's; its tracer's first session comes with the guards)
    assert events == ["call", "call", "report:output"], events
