"""Lines a person reads: the roofline without FLOPs, a candidate that cannot run on its device, the
live progress (one round numbering, elapsed time, estimate), model specs with unknown prefixes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kernelwright.cli.console import NORMAL, QUIET, LoopProgress, device_problem, result_line
from kernelwright.core import roofline
from kernelwright.core.config import ModelConfig
from kernelwright.core.record import EvalResult, Stage, Status
from kernelwright.loop.history import Progress
from kernelwright.models import ModelSetupError, resolve_model


def test_a_problem_without_counted_flops_is_memory_bound_in_bytes_not_0_flop():
    r = roofline.compute(
        flops=0, min_bytes=8e6, time_ms=0.016, peak_bytes_per_s=1e12, peak_flops_per_s=1e14, peak_source="measured"
    )
    text = roofline.line(r)
    assert "FLOP" not in text.replace("no matmul/conv/attention FLOPs counted", "")
    assert text.startswith("Roofline: memory-bound: 8 MB minimal traffic")
    assert "candidate 0.016 ms = 500 GB/s -> 50% of peak bandwidth [peak 1 TB/s, measured]" in text
    # with FLOPs the line is the full roofline, as before
    full = roofline.line(roofline.compute(2e9, 1e6, 1.0, 1e12, 1e13))
    assert "2 GFLOP" in full and "compute-bound" in full


CUDA_HOME_LOG = (
    "The candidate raised while being imported:\nTraceback (most recent call last):\n  ...\n"
    "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root."
)


@pytest.mark.parametrize(
    "log",
    [
        CUDA_HOME_LOG,
        "RuntimeError: Torch not compiled with CUDA enabled",
        "RuntimeError: Found no NVIDIA driver on your system.",
        "RuntimeError: x must be a CUDA float32 tensor",
    ],
)
def test_a_cuda_candidate_on_the_cpu_gets_one_line(log):
    r = EvalResult(
        status=Status.RUNTIME_ERROR,
        error_log=log,
        error_stage=Stage.BUILD,
        device="cpu (x86_64, 2 threads)",
        device_type="cpu",
    )
    why = device_problem(r)
    assert why.startswith("this candidate needs CUDA, which cpu (x86_64, 2 threads) does not have (")
    assert "\n" not in why and result_line(r) == f"runtime_error [build]: {why}"


def test_other_failures_are_not_blamed_on_the_device():
    assert (
        device_problem(
            EvalResult(status=Status.RUNTIME_ERROR, error_log="ValueError: shapes differ", device_type="cpu")
        )
        is None
    )
    on_gpu = EvalResult(
        status=Status.RUNTIME_ERROR, error_log="CUDA_HOME environment variable is not set", device_type="cuda"
    )
    assert device_problem(on_gpu) is None  # on a GPU the toolkit is missing, not the device
    assert device_problem(EvalResult(status=Status.PASSED, device_type="cpu")) is None


def test_live_progress_numbers_rounds_from_0_and_estimates_the_time_left():
    buf = io.StringIO()
    progress = LoopProgress(Console(file=buf, width=200), rounds=3, verbosity=NORMAL)
    with progress:
        progress.update(Progress(round=0, stage="coder"))
        assert progress.eta() == ""  # nothing to go on before a round has ended
        progress.update(Progress(round=0, stage="done", verdict="passed", speedup=1.5, best_speedup=1.5))
        assert progress.eta().startswith("~") and progress.eta().endswith("left at most")
        progress.update(Progress(round=1, stage="done", verdict="incorrect", best_speedup=1.5))
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("round 0 (1 of 3): passed 1.500x  best 1.500x  ")
    assert lines[1].startswith("round 1 (2 of 3): incorrect  best 1.500x  ")
    unstable = io.StringIO()
    flagged = EvalResult(status=Status.PASSED, speedup=8.1, metadata={"guards": {"flags": {"timing_unstable": "x"}}})
    with LoopProgress(Console(file=unstable, width=200), rounds=1, verbosity=NORMAL) as p:
        p.update(Progress(round=0, stage="done", verdict="passed", speedup=8.1, best_speedup=8.1, result=flagged))
    assert unstable.getvalue().startswith("round 0 (1 of 1): passed 8.100x (not trusted: timing_unstable)  best ")
    quiet = io.StringIO()
    with LoopProgress(Console(file=quiet), rounds=3, verbosity=QUIET) as p:
        p.update(Progress(round=0, stage="done", verdict="passed", speedup=1.5, best_speedup=1.5))
    assert quiet.getvalue() == ""


def test_a_stage_that_names_a_candidates_extension_is_text_not_markup():
    """The build stage names the extension the candidate's code asked for: a name such as
    "[/x]" (closing markup nothing opened) is printed as it is, not a console crash."""
    from kernelwright.cli.console import VERBOSE, EvalProgress

    stage = "build: compiling [/x][bold]ext (1 of 1; not built on this machine before)"
    buf = io.StringIO()
    with LoopProgress(Console(file=buf, width=200), rounds=1, verbosity=VERBOSE) as progress:
        progress.update(Progress(round=0, stage=stage))
    assert f"round 0 (1 of 1): {stage}…" in buf.getvalue()
    buf = io.StringIO()
    with EvalProgress(Console(file=buf, width=200), VERBOSE) as progress:
        progress.stage(stage)
    assert f"{stage}…" in buf.getvalue()


def test_unknown_provider_prefixes_and_empty_replay():
    with pytest.raises(
        ModelSetupError, match=r"unknown provider 'foo'; known prefixes: openai:, anthropic:, litellm:, replay:"
    ):
        resolve_model("foo:bar", "coder", ModelConfig())
    with pytest.raises(ModelSetupError, match=r"pass a run directory: replay:RUN_DIR"):
        resolve_model("replay:", "judge", ModelConfig())
    # with a server of its own, any name goes to it (ollama's names hold a colon)
    pytest.importorskip("openai")
    model = resolve_model("qwen2.5:7b", "coder", ModelConfig(base_url="http://127.0.0.1:9/v1"))
    assert model.name == "qwen2.5:7b" and model.model == "qwen2.5:7b"
