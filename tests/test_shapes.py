"""Other sizes of the problem (issue 33): sizes derived from the problem's constants, a passed
candidate judged there, `shape_specific` for one that holds only at the problem's own sizes.

The derivation is tested on problems written here (no engine); the verdicts on the fixtures in
tests/fixtures/shapes/, written the way LLM kernels come back (CPU here, CUDA and Triton `gpu`)."""

from __future__ import annotations

import json
import types

import pytest
import torch
from typer.testing import CliRunner

from conftest import FIXTURES
from kernelwright.cli.main import app
from kernelwright.core.config import REPORT_ONLY_FLAGS, EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import protocol, shapes

SHAPES = FIXTURES / "shapes"
PROBLEM = SHAPES / "problem.py"


def module(source: str) -> types.ModuleType:
    mod = types.ModuleType("kw_test_problem")
    exec(compile(source, "problem.py", "exec"), mod.__dict__)
    return mod


def plan_for(mod: types.ModuleType) -> shapes.Plan:
    """shapes.derive on the CPU, drawing and constructing as the judge does."""

    def init():
        torch.manual_seed(0)
        return mod.get_init_inputs()

    def draw(seed):
        torch.manual_seed(seed)
        return mod.get_inputs()

    def construct(init_inputs):
        torch.manual_seed(0)
        return mod.Model(*init_inputs).eval()

    def forward(model, inputs):
        with torch.no_grad():
            return model(*inputs)

    base_init = init()
    base = construct(base_init)
    return shapes.derive(
        mod,
        base_model=base,
        base_init=base_init,
        base_inputs=draw(1),
        seeds=[2, 3],
        draw=draw,
        init=init,
        construct=construct,
        forward=forward,
        oracle=lambda m, x: None,
    )


HEADER = "import torch\nimport torch.nn as nn\n"


def test_the_sizes_are_the_integers_the_input_functions_read_and_one_changes_at_a_time():
    mod = module(
        HEADER
        + """
batch_size = 16
seq_len = 128
features = 64
eps = 1e-5          # a float: never a size
reduce_dim = 1      # read by get_init_inputs only: a parameter of the model
unused = 999        # read by neither
def _draw():
    return torch.randn(batch_size, seq_len, features)
def get_inputs():
    return [_draw()]
def get_init_inputs():
    return [reduce_dim, features, eps]
"""
    )
    constants, in_inputs = shapes.size_constants(mod)
    assert constants == {"batch_size": 16, "seq_len": 128, "features": 64, "reduce_dim": 1}
    assert in_inputs == {"batch_size", "seq_len", "features"}  # through the helper _draw
    assert shapes.batch_constant(constants, in_inputs, mod.get_inputs()) == "batch_size"
    assert shapes.candidates({"batch_size": 16, "dim": 1024, "heads": 3, "k": 7}, "batch_size") == [
        ({"batch_size": 8}, "half the batch"),
        ({"batch_size": 32}, "double the batch"),
        ({"dim": 1023}, "odd size"),
        ({"k": 9}, "odd size"),
        ({"batch_size": 1}, "batch 1"),
    ]
    # no constant named like a batch: the one equal to the first input's leading size
    assert shapes.batch_constant({"n": 8, "m": 32}, {"n", "m"}, [torch.zeros(32, 8)]) == "m"


def test_kept_are_the_sizes_the_reference_takes_within_budget(monkeypatch):
    mod = module(
        HEADER
        + """
batch_size = 16
dim = 1024
axis = 4            # read by get_inputs but shapes no tensor: a parameter, not a size
class Model(nn.Module):
    def forward(self, x, axis):
        return x.view(batch_size, 4, 256).sum(dim=1)   # the reference itself holds only for dim = 1024
def get_inputs():
    return [torch.randn(batch_size, dim), axis]
def get_init_inputs():
    return []
"""
    )
    plan = plan_for(mod)
    assert plan.batch == "batch_size" and mod.dim == 1024 and mod.batch_size == 16  # constants restored
    assert [v.name for v in plan.variants] == ["batch_size=8", "batch_size=32", "batch_size=1"]
    assert all(not v.init_changed and tuple(v.ref_out.shape) == (v.sizes["batch_size"], 256) for v in plan.variants)
    dropped = {d["sizes"]: d["why"] for d in plan.dropped}
    assert "reference rejects it" in dropped["dim=1023"]
    assert "not a size" in dropped["axis=3"]
    # a budget that double the batch exceeds
    monkeypatch.setattr(shapes, "MIN_BUDGET_BYTES", 0)
    monkeypatch.setattr(shapes, "BYTES_FACTOR", 1.5)
    plan = plan_for(mod)
    assert "batch_size=32" not in [v.name for v in plan.variants]
    assert "over the budget" in {d["sizes"]: d["why"] for d in plan.dropped}["batch_size=32"]


def test_init_sizes_construct_a_new_model_and_fixed_sizes_say_so():
    mod = module((SHAPES / "problem.py").read_text())
    plan = plan_for(mod)
    by_name = {v.name: v for v in plan.variants}
    assert list(by_name) == ["batch_size=8", "batch_size=32", "dim=1023", "batch_size=1"]
    assert by_name["dim=1023"].init_changed and by_name["dim=1023"].init_inputs == [1023]
    assert by_name["dim=1023"].ref_model.scale.shape == (1023,)
    assert not by_name["batch_size=8"].init_changed
    fixed = plan_for(
        module(
            HEADER
            + """
class Model(nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn(16, 1024)]
def get_init_inputs():
    return []
"""
        )
    )
    assert not fixed.variants and "cannot be varied" in fixed.note


def test_the_protocol_carries_model_labels_typed():
    c = protocol.parse_command(protocol.to_line(protocol.Construct(init="in_shape2_init.kwt", seed=42, label="shape2")))
    assert c == protocol.Construct(init="in_shape2_init.kwt", seed=42, label="shape2")
    call = protocol.parse_command(
        protocol.to_line(protocol.Call(label="shape2", inputs="in_shape2.kwt", model="shape2", probe=True))
    )
    assert call == protocol.Call(label="shape2", inputs="in_shape2.kwt", model="shape2", probe=True)
    assert protocol.parse_command('{"cmd": "call", "label": "t", "inputs": "i", "probe": "yes"}') is None
    assert "shape_specific" in REPORT_ONLY_FLAGS
    with pytest.raises(ValueError, match="--shapes must be check, strict or off"):
        EvalConfig(shapes="sometimes").validate()  # type: ignore[arg-type]


def _config(cpu_config: EvalConfig, shapes_mode: str = "check") -> EvalConfig:
    cpu_config.shapes = shapes_mode  # type: ignore[assignment]
    cpu_config.time_candidate = False  # the other sizes do not need the clock
    return cpu_config


@pytest.mark.slow
def test_a_cpp_kernel_assuming_a_multiple_of_8_passes_and_is_flagged_shape_specific(cpu_config):
    r = evaluate(PROBLEM, SHAPES / "cpp_multiple_of_8.py", _config(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    shp = r.metadata["shapes"]
    assert shp["constants"] == {"batch_size": 16, "dim": 1024} and shp["batch"] == "batch_size"
    assert shp["passed"] == ["batch_size=8", "batch_size=32", "batch_size=1"] and shp["failed"] == ["dim=1023"]
    (bad,) = [t for t in shp["tried"] if t["passed"] is False]
    assert bad["failure"] == "wrong_values" and bad["new_model"] is True
    assert "never written" in bad["message"] and "positions >= 1016 along dim 1" in bad["message"]
    flag = r.metadata["guards"]["flags"]["shape_specific"]
    assert "dim=1023" in flag and "batch_size=16, dim=1024" in flag
    assert "unwritten_output" not in r.metadata["guards"]["flags"]  # a finding at another size, not at its own


def test_shapes_strict_makes_it_a_failure(cpu_config):
    r = evaluate(PROBLEM, SHAPES / "cpp_multiple_of_8.py", _config(cpu_config, "strict"))
    assert r.status is Status.INCORRECT and not r.correct
    assert "--shapes strict" in r.error_log and "dim=1023" in r.error_log
    assert r.error_stage is not None and r.error_stage.value == "correctness"


@pytest.mark.slow
def test_an_honest_cpp_kernel_holds_at_every_size(cpu_config):
    r = evaluate(PROBLEM, SHAPES / "cpp_honest.py", _config(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    assert "shape_specific" not in r.metadata["guards"]["flags"]
    assert r.metadata["shapes"]["failed"] == [] and len(r.metadata["shapes"]["passed"]) == 4


CRASHES_ELSEWHERE = """
import ctypes
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))

    def forward(self, x):
        if x.shape[0] != 16:
            ctypes.string_at(0)  # a segfault, as an out-of-bounds kernel gives
        return x * torch.sigmoid(x) * self.scale
"""


def test_a_crash_at_another_size_is_that_sizes_failure_not_the_verdict(cpu_config, tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(CRASHES_ELSEWHERE)
    r = evaluate(PROBLEM, cand, _config(cpu_config))
    assert r.status is Status.PASSED, r.error_log
    tried = {t["name"]: t for t in r.metadata["shapes"]["tried"]}
    assert tried["batch_size=8"]["failure"] == "crash" and "SIGSEGV" in tried["batch_size=8"]["message"]
    assert tried["batch_size=32"]["failure"] == "not_run"
    assert "batch_size=8 (a crash" in r.metadata["guards"]["flags"]["shape_specific"]


FIXED_VIEW = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))

    def forward(self, x):
        x = x.view(16, 1024)  # the problem's sizes, copied in
        return x * torch.sigmoid(x) * self.scale
"""


def test_eval_shapes_option(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_CACHE", cache_dir)
    cand = tmp_path / "cand.py"
    cand.write_text(FIXED_VIEW)
    bad = CliRunner().invoke(app, ["eval", str(PROBLEM), str(cand), "--device", "cpu", "--shapes", "sometimes"])
    assert bad.exit_code == 2 and "--shapes must be check, strict or off" in bad.output
    assert "Traceback" not in bad.output
    settings = tmp_path / "kernelwright.toml"
    settings.write_text("[eval]\ntime_candidate = false\n")  # the other sizes do not need the clock
    res = CliRunner().invoke(
        app,
        [
            "eval",
            str(PROBLEM),
            str(cand),
            "--device",
            "cpu",
            "--trials",
            "2",
            "--json",
            "--shapes",
            "strict",
            "--fail-on",
            "incorrect",
            "--config",
            str(settings),
        ],
    )
    assert res.exit_code == 3, res.output  # ExitCode.VERDICT: strict made it incorrect
    rec = json.loads(res.output)
    assert rec["status"] == "incorrect" and "--shapes strict" in rec["error_log"]
    errors = {t["name"]: t for t in rec["metadata"]["shapes"]["tried"] if t["passed"] is False}
    assert errors["batch_size=8"]["failure"] == "error" and "RuntimeError" in errors["batch_size=8"]["message"]


# ---- on a GPU: a #define'd size in CUDA, a Triton kernel without a tail mask, and honest twins ------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fixture,failed",
    [
        ("cuda_define.py", ["dim=1023"]),
        ("triton_no_mask.py", ["dim=1023"]),
        ("cuda_honest.py", []),
        ("triton_honest.py", []),
    ],
)
def test_gpu_kernels_at_other_sizes(cuda_config, fixture, failed):
    if fixture.startswith("triton"):
        pytest.importorskip("triton")
    cuda_config.time_candidate = False
    r = evaluate(PROBLEM, SHAPES / fixture, cuda_config)
    assert r.status is Status.PASSED, r.error_log
    shp = r.metadata["shapes"]
    assert shp["failed"] == failed, shp
    assert ("shape_specific" in r.metadata["guards"]["flags"]) == bool(failed)
    assert len(shp["passed"]) == 4 - len(failed), shp["tried"]
