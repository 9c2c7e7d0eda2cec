"""The Coder's and the Judge's prompts: every template renders for every backend, the repair prompt
keeps the seed's layout, and a variable left out is an error rather than a blank."""

from __future__ import annotations

import jinja2
import pytest

from kernelwright.core.record import EvalResult, Status
from kernelwright.models import prompts
from kernelwright.models.extract import FailureCritique, PerformanceCritique


@pytest.mark.parametrize("backend", ["cuda", "triton", "cpp"])
def test_every_prompt_renders_for_every_backend(backend):
    passed = EvalResult(
        status=Status.PASSED, correct=True, speedup=1.5, candidate_ms=1.0, reference_ms=1.5, device="dev"
    )
    failed = EvalResult(status=Status.COMPILE_ERROR, error_log="boom")
    crit = FailureCritique("a", "b", "c")
    perf = PerformanceCritique("x", "y", 2.0, "2x, one pass fewer")
    texts = [
        prompts.render("coder_first", backend=backend, device="the CPU", problem_code="P"),
        prompts.render(
            "coder_repair", backend=backend, error_log="E", old_code="O", critique=crit, verdict="incorrect"
        ),
        prompts.render(
            "coder_repair", backend=backend, error_log="E", old_code="O", critique=None, verdict="format_error"
        ),
        prompts.render(
            "coder_optimise",
            backend=backend,
            device="d",
            result=passed,
            old_code="O",
            critique=perf,
            last_attempt=None,
            problem_code="P",
        ),
        prompts.render(
            "llm_judge_failure", backend=backend, problem_code="P", code="C", result=failed, history=[], profile=""
        ),
        prompts.render(
            "llm_judge_performance",
            backend=backend,
            problem_code="P",
            code="C",
            result=passed,
            history=[{"round": 0, "verdict": "passed", "speedup": 1.5, "became_best": True, "expectation": None}],
            profile="dram 80%",
            target_round=0,
            last_expectation="in round 0 you expected 2.00x",
        ),
    ]
    assert all("OUTPUT RULES" in t for t in texts[:4])
    word = {"cuda": "`source`", "triton": "@triton.jit", "cpp": "CPU only"}[backend]
    assert all(word in t for t in texts[:4])
    assert '"critical_issue"' in texts[4] and '"expected_speedup"' in texts[5] and "dram 80%" in texts[5]
    assert "minimal_fix_hint: Answer with exactly one" in texts[2]
    assert "expected_speedup: 2.00x over this code (2x, one pass fewer)" in texts[3]
    assert "YOUR LAST EXPECTATION\nin round 0 you expected 2.00x." in texts[5]


def test_repair_prompt_has_the_seed_layout():
    text = prompts.render(
        "coder_repair",
        backend="cuda",
        error_log="nvcc: error X",
        old_code="OLD",
        critique=FailureCritique("ISSUE", "WHY", "HINT"),
        verdict="compile_error",
    )
    assert text.startswith(
        "You are a senior CUDA-extension developer. Your job is to FIX the compilation or "
        "runtime errors in the Python script shown below."
    )
    marks = [
        "OUTPUT RULES",
        "1. Imports: `torch`, `torch.nn`, `load_inline`",
        "2. `source`",
        "3. `cpp_src`",
        "4. ONE `load_inline` call",
        "5. `class ModelNew(nn.Module)`",
        "__main__",
        "ERROR LOG",
        "nvcc: error X",
        "OLD CODE (read-only)",
        "OLD",
        "Main Critical Problem",
        "critical_issue: ISSUE",
        "why_it_matters: WHY",
        "minimal_fix_hint: HINT",
    ]
    positions = [text.index(m) for m in marks]
    assert positions == sorted(positions)
    assert text.rstrip().endswith("```python\n\n```")


def test_a_missing_prompt_variable_is_an_error_not_a_blank():
    with pytest.raises(jinja2.UndefinedError):
        prompts.render("coder_first", backend="cuda", device="d")


def test_a_prompt_folder_with_the_llm_judges_old_template_names_is_told_the_new_ones(tmp_path):
    (tmp_path / "judge_failure.j2").write_text("x")
    with pytest.raises(prompts.PromptDirError, match=r"rename judge_failure.j2 to llm_judge_failure.j2"):
        prompts.check_prompt_dir(tmp_path)
    (tmp_path / "judge_failure.j2").rename(tmp_path / "llm_judge_failure.j2")
    assert prompts.check_prompt_dir(tmp_path) == tmp_path


def test_the_llm_judge_reads_the_engines_findings_beside_its_figures():
    """The flags the engine raised, each with its line of evidence, are in both Judge prompts: a Judge
    that names the next bottleneck of a candidate launching only PyTorch's kernels, or of one whose
    error sits at the tolerance's edge, should know it. A record without flags gets no such section."""
    passed = EvalResult(
        status=Status.PASSED, correct=True, speedup=3.37, candidate_ms=1.0, reference_ms=3.37, device="dev"
    )
    passed.metadata["guards"] = {
        "flags": {
            "self_timed": "ModelNew's source reads a clock (torch.cuda.Event.elapsed_time): ...",
            "borderline": "the error is within 2x of the tolerance's edge: " + "x" * 1000,
            "no_custom_kernel": "ModelNew launched only PyTorch's built-in operations",
        }
    }
    failed = EvalResult(status=Status.INCORRECT, error_log="not close")
    failed.metadata["guards"] = {"flags": {"calls_reference": "code of the problem file ran inside ModelNew"}}
    common = {"backend": "cuda", "problem_code": "P", "code": "C", "profile": ""}
    perf = prompts.render(
        "llm_judge_performance", result=passed, history=[], target_round=0, last_expectation="", **common
    )
    fail = prompts.render("llm_judge_failure", result=failed, history=[], **common)
    section = perf.split("the engine's findings (its flags):\n", 1)[1]
    lines = section.split("\n")[:3]
    assert [line.split(":")[0] for line in lines] == ["- borderline", "- no_custom_kernel", "- self_timed"]
    assert len(lines[0]) < 320 and "torch.cuda.Event.elapsed_time" in lines[2]  # each line kept short
    assert "- calls_reference: code of the problem file ran inside ModelNew" in fail
    plain = prompts.render("llm_judge_failure", result=EvalResult(status=Status.CRASHED), history=[], **common)
    assert "the engine's findings" not in plain
