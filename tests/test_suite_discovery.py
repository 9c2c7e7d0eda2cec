"""Which problems a suite runs and which candidate goes with each: KernelBench levels as they are,
globs, --only/--skip, candidates by file name, KernelBench's runs/ layout, mapping files and
JSON/JSONL records; bad input gets one line naming the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES
from kernelwright.suites.discovery import SuiteError, discover, load_candidates, match

SUITE = FIXTURES / "suite"
LEVEL1 = SUITE / "level1"


def keys(problems) -> list[str]:
    return [p.key for p in problems]


@pytest.fixture
def kernelbench(tmp_path) -> Path:
    """A KernelBench-like checkout: KernelBench/level1 (the fixtures) and KernelBench/level2 (two more)."""
    root = tmp_path / "KernelBench"
    shutil.copytree(LEVEL1, root / "level1")
    (root / "level2").mkdir()
    shutil.copy(LEVEL1 / "2_swish.py", root / "level2" / "10_Swish_again.py")
    shutil.copy(LEVEL1 / "1_add_one.py", root / "level2" / "2_AddOne_again.py")
    return root


def test_a_level_folder_as_it_is_in_kernelbench_id_order(kernelbench):
    probs = discover([str(kernelbench / "level1")])
    assert keys(probs) == [
        "level1/1_add_one",
        "level1/2_swish",
        "level1/3_scale_shift",
        "level1/4_row_softmax",
        "level1/5_small_matmul",
        "level1/6_mean_pool",
    ]
    assert probs[0].level == "level1" and probs[0].problem_id == "1" and probs[0].level_number == "1"


def test_the_checkout_root_means_all_levels_and_ids_sort_numerically(kernelbench):
    probs = discover([str(kernelbench)])
    assert keys(probs)[-2:] == ["level2/2_AddOne_again", "level2/10_Swish_again"]
    assert len(probs) == 8


def test_several_levels_globs_only_and_skip(kernelbench):
    both = discover([str(kernelbench / "level1"), str(kernelbench / "level2")])
    assert len(both) == 8
    assert keys(discover([str(kernelbench / "level*" / "*swish*.py")])) == ["level1/2_swish"]  # case-sensitive glob
    assert keys(discover([str(kernelbench)], only=["level2"])) == ["level2/2_AddOne_again", "level2/10_Swish_again"]
    assert keys(discover([str(kernelbench)], only=["2"])) == ["level1/2_swish", "level2/2_AddOne_again"]  # by id
    assert keys(discover([str(kernelbench)], only=["*_again"], skip=["10_*"])) == ["level2/2_AddOne_again"]
    assert keys(discover([str(kernelbench / "level1")], skip=["level1/3_scale_shift", "4_row_softmax", "5", "6"])) == [
        "level1/1_add_one",
        "level1/2_swish",
    ]


def test_bad_problem_arguments_get_one_line_naming_the_fix(tmp_path):
    with pytest.raises(SuiteError, match="no problem files at .*; check the path"):
        discover([str(tmp_path / "nowhere")])
    with pytest.raises(SuiteError, match="no problems left after --only/--skip"):
        discover([str(LEVEL1)], only=["level9"])
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_helper.py").write_text("X = 1\n")
    with pytest.raises(SuiteError, match=r"not a KernelBench problem: level1/1_helper .*--skip NAME"):
        discover([str(tmp_path / "level1")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SuiteError, match="holds no problem files"):
        discover([str(tmp_path / "empty")])


def test_candidates_by_file_name_with_one_problem_missing():
    pairs, missing = match(discover([str(LEVEL1)]), load_candidates(SUITE / "candidates"))
    assert [p.name for p, _ in pairs] == ["1_add_one", "2_swish", "3_scale_shift", "4_row_softmax", "5_small_matmul"]
    assert [p.name for p in missing] == ["6_mean_pool"]
    assert pairs[0][1].text == (SUITE / "candidates" / "1_add_one.py").read_text()


def test_a_candidate_never_crosses_levels_by_its_file_name(tmp_path):
    """A published corpus's layout (CUDA-L1: candidates/levelN/<id>_task.py, the same names in every
    level): level2/2_task takes level2's file; a level with no file of that name gets none, not
    another level's (a level-1 ModelNew against a level-2 problem read as `failed to construct`)."""
    root, cands = tmp_path / "problems", tmp_path / "candidates"
    for lv in ("level1", "level2"):
        (root / lv).mkdir(parents=True)
        (cands / lv).mkdir(parents=True)
    shutil.copy(LEVEL1 / "1_add_one.py", root / "level1" / "1_task.py")
    shutil.copy(LEVEL1 / "2_swish.py", root / "level1" / "2_task.py")
    shutil.copy(LEVEL1 / "2_swish.py", root / "level2" / "2_task.py")
    shutil.copy(LEVEL1 / "1_add_one.py", root / "level2" / "1_task.py")
    (cands / "level1" / "1_task.py").write_text("# level1/1\n")
    (cands / "level1" / "2_task.py").write_text("# level1/2\n")
    (cands / "level2" / "2_task.py").write_text("# level2/2\n")  # level2/1 has none
    pairs, missing = match(discover([str(root)]), load_candidates(cands))
    assert {p.key: c.text for p, c in pairs} == {
        "level1/1_task": "# level1/1\n",
        "level1/2_task": "# level1/2\n",
        "level2/2_task": "# level2/2\n",
    }
    assert keys(missing) == ["level2/1_task"]
    # a problem outside any level folder: a name two levels' files share is ambiguous, so no match
    shutil.copy(LEVEL1 / "2_swish.py", tmp_path / "2_task.py")
    pairs, missing = match(discover([str(tmp_path / "2_task.py")]), load_candidates(cands))
    assert pairs == [] and keys(missing) == ["2_task"]
    # ...while a name only one file has still matches across the layout, as before
    shutil.copy(LEVEL1 / "1_add_one.py", tmp_path / "1_task.py")
    pairs, _ = match(discover([str(tmp_path / "1_task.py")]), load_candidates(cands))
    assert [c.text for _, c in pairs] == ["# level1/1\n"]


def test_kernelbench_runs_layout_takes_the_lowest_sample():
    pairs, missing = match(discover([str(LEVEL1)]), load_candidates(SUITE / "runs_layout"))
    got = {p.name: Path(c.source).name for p, c in pairs}
    assert got == {
        "1_add_one": "level_1_problem_1_sample_0_kernel.py",
        "2_swish": "level_1_problem_2_sample_0_kernel.py",
    }
    assert len(missing) == 4


def test_mapping_file_and_json_records(tmp_path):
    mapping = tmp_path / "map.json"
    shutil.copy(SUITE / "candidates" / "2_swish.py", tmp_path / "mine.py")
    mapping.write_text(json.dumps({"level1/1_add_one": "mine.py", "3_scale_shift.py": "mine.py"}))
    pairs, _ = match(discover([str(LEVEL1)]), load_candidates(mapping))
    assert [p.name for p, _ in pairs] == ["1_add_one", "3_scale_shift"]
    assert pairs[0][1].text == (tmp_path / "mine.py").read_text()

    code = (SUITE / "candidates" / "1_add_one.py").read_text()
    records = [
        {"problem": "1_add_one", "code": code},
        {"level": 1, "problem_id": 2, "code": "class ModelNew: pass\n"},
        {"problem": "1_add_one", "code": "a later sample"},
    ]
    (tmp_path / "gen.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "gen.json").write_text(json.dumps(records))
    for path in (tmp_path / "gen.jsonl", tmp_path / "gen.json"):
        pairs, _ = match(discover([str(LEVEL1)]), load_candidates(path))
        assert {p.name: c.text for p, c in pairs} == {"1_add_one": code, "2_swish": "class ModelNew: pass\n"}
        assert pairs[0][1].source == f"{path}:1"


def test_bad_candidate_sources_get_one_line_naming_the_fix(tmp_path):
    with pytest.raises(SuiteError, match="candidates not found"):
        load_candidates(tmp_path / "nothing")
    (tmp_path / "bad.jsonl").write_text('{"problem": "a", "code": "x"}\nnot json\n')
    with pytest.raises(SuiteError, match="line 2 is not JSON; fix that line"):
        load_candidates(tmp_path / "bad.jsonl")
    (tmp_path / "nocode.json").write_text(json.dumps([{"problem": "a"}]))
    with pytest.raises(SuiteError, match=r"record 1 is not \{\"problem\": ..., \"code\": ...\}"):
        load_candidates(tmp_path / "nocode.json")
    (tmp_path / "map.json").write_text(json.dumps({"a": "missing.py"}))
    with pytest.raises(SuiteError, match="maps a to missing.py, which is not a file"):
        load_candidates(tmp_path / "map.json")
