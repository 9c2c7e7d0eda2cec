"""CI's gate (tests/conftest.py): a plain run leaves out the tests marked slow, and still holds one
control of each kind, the honest control against forged speed-ups first among them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import _gate, longest_first, read_durations, spread_gpu

TESTS = Path(__file__).resolve().parent

# one end-to-end control of each kind that the gate must keep (README: "Run the tests")
CONTROLS = [
    ("test_clock_attacks.py", "test_honest_control_passes_and_is_never_trusted_with_a_forged_speedup"),
    ("test_footholds.py", "test_a_candidate_that_impersonates_the_server_gets_no_honest_job"),
    ("test_footholds.py", "test_an_eval_below_a_planted_settings_file_keeps_its_verdict"),
    ("test_runner_fork.py", "test_a_forked_runner_sees_nothing_of_the_other_evaluations"),
    ("test_isolation.py", "test_no_process_outlives_the_evaluation"),
    ("test_isolation.py", "test_the_evaluators_environment_cannot_be_read"),
    ("test_illconditioned_verdicts.py", "test_partial_bug_on_an_ill_conditioned_problem_is_incorrect"),
    ("test_degenerate_reference.py", "test_constant_candidate_passes_with_the_flag_and_its_sentence"),
    ("test_identical_candidate.py", "test_the_reference_against_itself_is_never_a_trusted_speedup_outside_the_band"),
    ("test_timing_stability.py", "test_the_thread_count_is_fixed_and_recorded"),  # the CPU example's C++ build
    ("test_cli.py", "test_a_run_that_finished_exits_0_and_numbers_rounds_from_0_everywhere"),
]


def _marks(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            out.add(node.attr)
    return out


@pytest.mark.parametrize("file, name", CONTROLS, ids=[n for _, n in CONTROLS])
def test_each_control_is_in_the_gate(file, name):
    tree = ast.parse((TESTS / file).read_text())
    module_marks = [n for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n)]
    assert not any("slow" in ast.unparse(n) for n in module_marks), f"{file} is slow as a whole"
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert "slow" not in _marks(fn), f"{file}::{name} is a control of CI's gate: it must not be marked slow"


def _config(args=("tests",), whole=False, markexpr="", keyword=""):
    return SimpleNamespace(
        args=list(args),
        option=SimpleNamespace(markexpr=markexpr, keyword=keyword),
        getoption=lambda name: {"whole": whole}[name],
    )


def test_a_plain_run_is_the_gate_and_any_naming_of_tests_is_not():
    assert _gate(_config())
    assert _gate(_config(args=["tests/test_cli.py"]))  # a file: its tests in the gate
    assert not _gate(_config(whole=True))
    assert not _gate(_config(markexpr="gpu"))
    assert not _gate(_config(keyword="poison"))
    assert not _gate(_config(args=["tests/test_cli.py::test_optimize_json_and_quiet"]))


def test_spread_workers_take_the_gpus_in_turn():
    # KW_SPREAD_GPUS: pytest -n's workers over every GPU, each driving one (its CUDA_VISIBLE_DEVICES)
    assert [spread_gpu("0,1", f"gw{i}") for i in range(5)] == ["0", "1", "0", "1", "0"]
    assert spread_gpu("2, 3", "gw1") == "3" and spread_gpu("GPU-aa", "gw7") == "GPU-aa"
    assert spread_gpu("", "gw0") is None  # not asked for: the worker sees what the caller gave it
    assert spread_gpu("0,1", "") is None and spread_gpu("0,1", "master") is None  # not a pytest -n worker


def _item(nodeid: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid)


def test_longest_first_puts_unknown_tests_first_then_the_known_by_duration():
    items = [_item(n) for n in ("a::quick", "b::new", "c::long", "d::mid", "e::also_new")]
    durations = {"a::quick": 1.5, "c::long": 212.0, "d::mid": 40.0, "gone::test": 900.0}

    order = [i.nodeid for i in longest_first(items, durations)]

    # never timed (new, or stopped unfinished last time: likely long) first, in collection order
    assert order == ["b::new", "e::also_new", "c::long", "d::mid", "a::quick"]


def test_a_durations_log_is_read_with_its_longest_figure_and_its_bad_lines_passed_over(tmp_path):
    log = tmp_path / "durations.jsonl"
    rows = [
        {"test": "t::a", "s": 3.0},
        {"test": "t::a", "s": 9.5},
        {"test": "t::b"},
        {"s": 2},
        {"test": "t::c", "s": "x"},
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n" + '{"test": "t::d", "s": 1}\n')

    assert read_durations(str(log)) == {"t::a": 9.5, "t::d": 1.0}
    assert read_durations(str(tmp_path / "missing.jsonl")) == {}


@pytest.mark.slow  # two pytest runs of its own (~25 s): the whole suite's, not the gate's
def test_a_run_under_pytest_n_logs_each_tests_seconds_and_a_later_run_takes_the_longest_first(tmp_path):
    root = Path(__file__).resolve().parent.parent
    log = tmp_path / "durations.jsonl"
    env = {**os.environ, "KW_DURATIONS_LOG": str(log)}
    env.pop("KW_LONGEST_FIRST", None)
    cmd = [sys.executable, "-m", "pytest", "tests/test_gate.py", "-k", "spread or plain_run", "-n", "2"]
    p = subprocess.run([*cmd, "-p", "no:cacheprovider", "-q"], cwd=root, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:]
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    # one row a test, written by the controller alone (two workers ran them), setup to teardown
    assert sorted(r["test"].split("::")[1] for r in rows) == [
        "test_a_plain_run_is_the_gate_and_any_naming_of_tests_is_not",
        "test_spread_workers_take_the_gpus_in_turn",
    ]
    assert all(r["outcome"] == "passed" and r["s"] >= 0 for r in rows)

    # the next run, told the spread test took longest, collects it first
    spread = next(r["test"] for r in rows if "spread" in r["test"])
    log.write_text(json.dumps({"test": spread, "s": 500.0}) + "\n" + log.read_text())
    env = {**os.environ, "KW_LONGEST_FIRST": str(log)}
    env.pop("KW_DURATIONS_LOG", None)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_gate.py", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    collected = [x for x in p.stdout.splitlines() if "::" in x]
    logged = {r["test"] for r in rows}
    # the tests it never timed first, then the two timed ones, longest first
    assert [x for x in collected if x in logged] == [spread, next(t for t in logged if t != spread)]
    assert all(x not in logged for x in collected[: len(collected) - 2])
