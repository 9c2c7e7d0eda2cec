"""The calibrated verdict against a float64 oracle, and the where/how lines of a failing output."""

from __future__ import annotations

import pytest
import torch

from conftest import ADD_ONE, FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import localize, numerics

MAMBA_SMALL = FIXTURES / "problems" / "mamba2_ssd_small.py"
MAMBA = FIXTURES / "problems" / "mamba2_ssd.py"
M2 = FIXTURES / "mamba2"


# ---- the rule itself (no child process) ---------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "cand,ref,passes",
    [
        ([1.0, NAN, 3.0], [1.0, NAN, 3.0], True),  # NaN where the reference has NaN
        ([1.0, INF, -INF], [1.0, INF, -INF], True),  # the same infinities
        ([1.0, NAN, 3.0], [1.0, 2.0, 3.0], False),  # NaN where the reference is finite
        ([1.0, 2.0, 3.0], [1.0, NAN, 3.0], False),  # finite where the reference is NaN
        ([1.0, -INF, 3.0], [1.0, INF, 3.0], False),  # the wrong infinity
        ([1.0, INF, 3.0], [1.0, 2.0, 3.0], False),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0 + 1e-9], True),  # all finite: the fast path
        ([1.0, 2.0, 3.5], [1.0, 2.0, 3.0], False),
    ],
)
def test_strict_comparison_places_non_finite_values(cand, ref, passes):
    from kernelwright.engine.child.compare import compare_tensors

    rep = compare_tensors("out", torch.tensor(cand), torch.tensor(ref), 1e-5, 1e-5)
    assert rep.passed is passes
    if not passes and any(v != v or abs(v) == INF for v in cand) and all(v == v and abs(v) != INF for v in ref):
        assert "NaN" in rep.message and "where the reference is finite" in rep.message


def test_deviation_counts_non_finite_values_where_the_oracle_is_finite():
    o = torch.tensor([1.0, 2.0, NAN, 4.0], dtype=torch.float64)
    same = numerics.deviation(torch.tensor([1.0, 2.0, NAN, 4.0]), o, 1e-5, 1e-5)
    assert same.nonfinite == 0 and same.frac_out_of_tol == 0.0 and same.max_abs == 0.0
    bad = numerics.deviation(torch.tensor([1.0, INF, NAN, 4.0]), o, 1e-5, 1e-5)
    assert bad.nonfinite == 1 and bad.frac_out_of_tol == 0.25 and bad.max_abs == float("inf")
    finite = numerics.deviation(
        torch.tensor([1.0, 2.0, 3.0, 4.5]), torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), 1e-5, 1e-5
    )
    assert finite.nonfinite == 0 and finite.max_abs == 0.5 and finite.frac_out_of_tol == 0.25
    assert finite.norm_rel == pytest.approx(0.5 / (1 + 4 + 9 + 16) ** 0.5)


def test_calibrated_rule_passes_within_a_factor_of_the_references_error():
    o = torch.randn(1000, dtype=torch.float64) * 1e6
    ref = o + torch.randn_like(o) * 1e3  # an inaccurate reference: fails atol/rtol against the oracle
    good = o + torch.randn_like(o) * 2e3  # twice the reference's error
    bad = o + torch.randn_like(o) * 1e5  # a hundred times
    rep = numerics.judge(good.float(), ref.float(), o, 1e-3, 1e-3, 8.0)
    assert rep.passed and rep.ill_conditioned
    rep = numerics.judge(bad.float(), ref.float(), o, 1e-3, 1e-3, 8.0)
    assert not rep.passed and rep.message.startswith("Outputs are not close (atol=0.001, rtol=0.001). max_abs_err=")


def test_calibrated_rule_is_the_tolerance_when_the_reference_is_exact():
    o = torch.randn(100, dtype=torch.float64)
    rep = numerics.judge((o + 5e-4).float(), o.float(), o, 1e-3, 1e-3, 8.0)
    assert rep.passed  # within atol
    rep = numerics.judge((o + 5e-3).float(), o.float(), o, 1e-3, 1e-3, 8.0)
    assert not rep.passed


# ---- Mamba-2 SSD at a small shape on the CPU: the phenomenon of the issue ---------------------------


@pytest.fixture
def mamba_cfg(cpu_config):
    cpu_config.trials = 2
    cpu_config.time_candidate = False
    return cpu_config


def _leaf(r):
    return r.trials[0].extra["numerics"]["leaves"][0]


@pytest.mark.slow
def test_mamba2_small_strict_rejects_a_correct_candidate_calibrated_accepts_it(mamba_cfg):
    mamba_cfg.verdict = "strict"
    strict = evaluate(MAMBA_SMALL, M2 / "mamba2_f64.py", mamba_cfg)
    mamba_cfg.verdict = "calibrated"
    cal = evaluate(MAMBA_SMALL, M2 / "mamba2_f64.py", mamba_cfg)
    assert strict.status is Status.INCORRECT  # a fixed tolerance against the float32 reference
    assert cal.status is Status.PASSED, cal.error_log
    assert cal.metadata["numerics"]["ill_conditioned"] is True
    leaf = _leaf(cal)
    assert leaf["reference"]["frac_out_of_tol"] > 0  # the float32 reference fails against the oracle
    assert leaf["candidate"]["norm_rel"] < leaf["reference"]["norm_rel"]


@pytest.mark.slow
def test_mamba2_small_off_by_one_and_bf16_fail_calibrated(mamba_cfg):
    for name in ("mamba2_off_by_one.py", "mamba2_bf16.py"):
        r = evaluate(MAMBA_SMALL, M2 / name, mamba_cfg)
        assert r.status is Status.INCORRECT, name
        assert "calibrated check" in r.error_log
        leaf = _leaf(r)
        assert leaf["candidate"]["norm_rel"] > 8 * leaf["reference"]["norm_rel"]


# ---- localisation -----------------------------------------------------------------------------------


def _write(tmp_path, body: str):
    p = tmp_path / "cand.py"
    p.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" + body
    )
    return p


def test_wrong_permutation_names_the_swapped_order(
    cpu_config,
    tmp_path,
):
    # (l c) where (c l) was meant: the 128 features flattened from 2 x 64 in the wrong order
    cand = _write(
        tmp_path,
        "        y = torch.relu(x) + 1.0\n        return y.reshape(64, 2, 64).transpose(1, 2).reshape(64, 128)\n",
    )
    r = evaluate(ADD_ONE, cand, cpu_config)
    assert r.status is Status.INCORRECT
    assert "along dim 1 (size 128 = 2 x 64)" in r.error_log and "factors swapped" in r.error_log, r.error_log


def test_shifted_by_one_names_the_axis(cpu_config, tmp_path):
    cand = _write(tmp_path, "        y = torch.relu(x) + 1.0\n        return torch.cat([y[:, :1], y[:, :-1]], dim=1)\n")
    r = evaluate(ADD_ONE, cand, cpu_config)
    assert r.status is Status.INCORRECT
    assert "shifted by +1 along dim 1" in r.error_log, r.error_log


def test_partly_unwritten_output_is_located(cpu_config, tmp_path):
    cand = _write(
        tmp_path,
        "        y = torch.empty_like(x)\n        y[:, :100] = torch.relu(x[:, :100]) + 1.0\n        return y\n",
    )
    r = evaluate(ADD_ONE, cand, cpu_config)
    assert r.status is Status.INCORRECT
    assert "never written" in r.error_log
    assert "errors only at positions >= 100 along dim 1" in r.error_log
    assert "unwritten_output" in r.metadata["guards"]["flags"]


def test_localize_unit_cases():
    t = torch.randn(6, 8, 8, dtype=torch.float64)
    assert any("axes 1 and 2 swapped" in ln for ln in localize.localize(t.transpose(1, 2), t, 1e-3, 1e-3))
    assert any("times 0.5" in ln for ln in localize.localize(t * 0.5, t, 1e-3, 1e-3))
    shifted = torch.roll(t, shifts=-1, dims=0)
    assert any("shifted by -1 along dim 0" in ln for ln in localize.localize(shifted, t, 1e-3, 1e-3))
    zeros = t.clone()
    zeros[3:] = 0
    lines = localize.localize(zeros, t, 1e-3, 1e-3)
    assert any("exactly 0" in ln for ln in lines) and any("positions >= 3 along dim 0" in ln for ln in lines)


# ---- Mamba-2 SSD at the KernelBench shape on a GPU: the figures of the issue -------------------------


@pytest.mark.gpu
def test_mamba2_figures_on_gpu(cuda_config):
    cuda_config.time_candidate = False
    cuda_config.verdict = "strict"
    strict_ok = evaluate(MAMBA, M2 / "mamba2_f64.py", cuda_config)
    strict_compiled = evaluate(MAMBA, M2 / "mamba2_compiled.py", cuda_config)
    cuda_config.verdict = "calibrated"
    ok = evaluate(MAMBA, M2 / "mamba2_f64.py", cuda_config)
    reordered = evaluate(MAMBA, M2 / "mamba2_reordered.py", cuda_config)
    compiled = evaluate(MAMBA, M2 / "mamba2_compiled.py", cuda_config)
    off = evaluate(MAMBA, M2 / "mamba2_off_by_one.py", cuda_config)
    bf16 = evaluate(MAMBA, M2 / "mamba2_bf16.py", cuda_config)
    figures = {
        n: _leaf(r)
        for n, r in [("f64", ok), ("reordered", reordered), ("compiled", compiled), ("off_by_one", off), ("bf16", bf16)]
    }
    print(
        {
            n: (
                f["reference"]["max_abs"],
                f["reference"]["norm_rel"],
                f["candidate"]["max_abs"],
                f["candidate"]["norm_rel"],
            )
            for n, f in figures.items()
        }
    )
    ref = figures["f64"]["reference"]
    # the figures: float32 reference off its float64 self by ~5.8e10 (normwise ~2.2e-6)
    assert 1e9 < ref["max_abs"] < 1e12 and 1e-7 < ref["norm_rel"] < 1e-4
    assert ok.metadata["numerics"]["ill_conditioned"] is True
    assert strict_ok.status is Status.INCORRECT  # strict rejects a correct candidate ...
    assert strict_compiled.status is Status.INCORRECT  # ... and the reference's own torch.compile
    # computed in float64, rounded once to float32: about float32's unit roundoff (6e-8), no more
    assert figures["f64"]["candidate"]["norm_rel"] < 1e-7
    assert ok.status is Status.PASSED, ok.error_log
    assert reordered.status is Status.PASSED, reordered.error_log
    assert compiled.status is Status.PASSED, compiled.error_log
    assert off.status is Status.INCORRECT and bf16.status is Status.INCORRECT


def test_lower_precision_is_suspected_only_for_a_rounding_like_error():
    """bf16 arithmetic: every element within a few bf16 ulps. A dropped column, or one element off by
    0.7, has a normwise error in bf16's range too, but not its shape: no bf16/fp16 hint for them."""
    g = torch.Generator().manual_seed(0)
    oracle = torch.randn(256, 64, generator=g, dtype=torch.float64)

    def suspected(cand):
        dev = numerics.deviation(cand, oracle, 1e-3, 1e-3)
        return numerics.lower_precision_suspected(oracle, dev, torch.float32)

    in_bf16 = (oracle.float().bfloat16() @ torch.eye(64).bfloat16()).float()  # computed in bf16
    assert suspected(in_bf16)
    dropped = oracle.clone()
    dropped[:, 3] = 0.0  # one column of 64 never written (normwise 0.125: out of bf16's range anyway)
    assert not suspected(dropped.float())
    small_drop = oracle.clone()
    small_drop[:4, 3] = 0.0  # a few elements of a column: normwise in bf16's range, max error not
    assert 0.3e-2 < numerics.deviation(small_drop, oracle, 1e-3, 1e-3).norm_rel < 5e-2
    assert not suspected(small_drop.float())
    one_off = oracle.clone()
    one_off[7, 7] += 0.7  # one element off by 0.7
    assert not suspected(one_off.float())


def test_the_headers_max_abs_err_is_the_error_logs(cpu_config, tmp_path):
    """One record, one figure: the console's max_abs_err row leads with the figure the error log states
    (the first failing trial, against the reference), then the largest over the trials."""
    import io
    import re

    from rich.console import Console

    from kernelwright.cli.console import render_result

    cand = _write(tmp_path, "        y = torch.relu(x) + 1.0\n        y[:, 3] += x[:, 3].abs()\n        return y\n")
    r = evaluate(ADD_ONE, cand, cpu_config)
    assert r.status is Status.INCORRECT
    logged = re.search(r"max_abs_err=(\S+),", r.error_log).group(1)
    first = next(t for t in r.trials if not t.passed)
    assert logged == f"{first.max_abs_err:.3e}"  # the log states the candidate against the reference
    assert "lower_precision_suspected" not in r.flags() and "bf16/fp16" not in r.error_log  # a wrong column
    buf = io.StringIO()
    render_result(r, Console(file=buf, width=400))
    row = next(ln for ln in buf.getvalue().splitlines() if "max_abs_err" in ln and "trial" in ln)
    assert re.search(rf"max_abs_err +{re.escape(logged)} ", row), row
    assert f"the largest of {len(r.trials)} trials {r.max_abs_err:.3e}" in row
