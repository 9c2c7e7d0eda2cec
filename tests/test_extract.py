"""Reading the models' answers: the code block of a Coder's answer (and the output rules it must
keep), the Judge's JSON, and its expected speedup as a factor."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, block
from kernelwright.models.extract import (
    FailureCritique,
    JudgeParseError,
    OutputRuleError,
    PerformanceCritique,
    extract_code,
    parse_judge,
    parse_speedup,
)

CUDA_CANDIDATE = (EXAMPLES / "cuda_swish" / "candidate.py").read_text()
CPP_CANDIDATE = (EXAMPLES / "cpu_swish" / "candidate.py").read_text()


def test_code_is_extracted_from_prose_and_checked():
    assert extract_code(block(CUDA_CANDIDATE), "cuda") == CUDA_CANDIDATE
    assert extract_code(block(CPP_CANDIDATE), "cpp") == CPP_CANDIDATE


@pytest.mark.parametrize(
    "answer, backend, message",
    [
        ("I would fuse the kernels.", "cuda", "no code block"),
        (block(CUDA_CANDIDATE + '\nif __name__ == "__main__":\n    print(ModelNew(4))\n'), "cuda", "__main__"),
        (block(CUDA_CANDIDATE + "\nprint(ModelNew(4)(torch.randn(2, 4)))\n"), "cuda", "testing code"),
        (block(CUDA_CANDIDATE + "\ndef get_inputs():\n    return []\n"), "cuda", "testing code: def get_inputs"),
        (
            block(CUDA_CANDIDATE.replace("cpp_src = ", "cpp_header = ") + "\ncpp_src = cpp_header\n"),
            "cuda",
            "sections out of order: load_inline",
        ),
        (block(CPP_CANDIDATE + "\nimport math\n"), "cpp", "an import at line"),
        (block("import torch\nclass ModelNew(:\n  pass\n"), "cuda", "not valid Python"),
        (block("import torch\nx = 1\n"), "cuda", "no class ModelNew"),
        (block(CPP_CANDIDATE) + block(CPP_CANDIDATE), "cpp", "2 code blocks define ModelNew"),
    ],
)
def test_answers_that_break_the_output_rules_are_format_errors(answer, backend, message):
    with pytest.raises(OutputRuleError, match=message.replace("(", r"\(")):
        extract_code(answer, backend)


def test_judge_json_is_read_robustly():
    fenced = 'Sure.\n```json\n{"critical_issue": "a", "why_it_matters": "b", "minimal_fix_hint": "c"}\n```'
    assert parse_judge(fenced, FailureCritique) == FailureCritique("a", "b", "c")
    loose = 'Analysis {not json} then {"bottleneck": "mem", "optimization": "fuse", "expected_speedup": 2} done'
    assert parse_judge(loose, PerformanceCritique) == PerformanceCritique("mem", "fuse", 2.0, "")
    worded = '{"bottleneck": "b", "optimisation": "o", "expected_speedup": "1.1x to 1.3x", "why": "fewer loads"}'
    assert parse_judge(worded, PerformanceCritique) == PerformanceCritique(
        "b", "o", pytest.approx(1.2), "1.1x to 1.3x; fewer loads"
    )
    vague = '{"bottleneck": "b", "optimisation": "o", "expected_speedup": "several x"}'
    assert parse_judge(vague, PerformanceCritique).expected_speedup is None
    with pytest.raises(JudgeParseError, match="critical_issue"):
        parse_judge('{"critical_issue": "only one field"}', FailureCritique)


@pytest.mark.parametrize(
    "value, factor",
    [
        (1.5, 1.5),
        (2, 2.0),
        ("1.5x", 1.5),
        ("~2x over this candidate", 2.0),
        ("1.5×", 1.5),
        ("1.4 x faster", 1.4),
        ("1.1x to 1.3x over this candidate: the same bytes", 1.2),
        ("1.1-1.3x", 1.2),
        ("30% faster", 1.3),
        ("2", 2.0),
        ("several x", None),
        ("unknown", None),
        (0, None),
        (-1.5, None),
        (True, None),
        (None, None),
        ("0x", None),
    ],
)
def test_expected_speedup_is_read_as_a_factor(value, factor):
    assert parse_speedup(value) == (pytest.approx(factor) if factor is not None else None)
