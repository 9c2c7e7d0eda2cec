"""The judge's check of every timed slot: the errors computed for all slots at once are the errors
computed slot by slot, and a slot that is replayed, unwritten, non-finite or of another shape is
caught whichever way it is computed."""

from __future__ import annotations

import pytest
import torch

from kernelwright.engine.child.correctness import errors, leaf_abs_errors, leaf_scales, slot_errors
from kernelwright.engine.child.timing.window_plan import Measures, ceiling


def _slots(n: int = 12) -> tuple[list, list]:
    g = torch.Generator().manual_seed(3)
    refs = [(torch.randn(4, 5, generator=g), torch.randn(7, generator=g) * 1e3) for _ in range(n)]
    cands = [(a + 1e-6 * torch.randn(4, 5, generator=g), b.clone()) for a, b in refs]
    return cands, refs


def test_all_at_once_equals_slot_by_slot():
    cands, refs = _slots()
    cands[2] = (cands[2][0], torch.zeros(7))  # unwritten
    cands[5] = (refs[4][0].clone(), refs[4][1].clone())  # another slot's answer, replayed
    nan = cands[7][0].clone()
    nan[0, 0] = float("nan")
    cands[7] = (nan, cands[7][1])  # non-finite where the reference is finite
    refs[9] = (torch.zeros(4, 5), refs[9][1])  # an all-zero reference leaf: scale 1, as errors() takes it
    inf = refs[10][0].clone()
    inf[1, 2] = float("inf")
    refs[10], cands[10] = (inf, refs[10][1]), (inf.clone(), cands[10][1])  # the same non-finite pattern: compared
    big = torch.full((7,), 3e38)  # finite, but its norm overflows float32: errors() takes its float64 path
    refs[11], cands[11] = (refs[11][0], big), (cands[11][0], big * (1 + 1e-6))
    got = slot_errors(cands, refs, stacked=True)  # stacked, in float64, against errors() in float32
    want = [errors(c, r) for c, r in zip(cands, refs, strict=True)]
    assert slot_errors(cands, refs, stacked=False) == want  # slot by slot: errors() itself
    assert got[7] is None and want[7] is None
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            assert g == pytest.approx(w, rel=1e-5, abs=1e-12)
    assert got[2][1] == pytest.approx(1.0) and got[5][0] > 0.5  # far off: the check rejects them
    assert got[0][0] < 1e-5
    assert got[10] is not None and got[10][0] < 1e-5 and got[11] is not None and got[11][0] < 1e-5


def test_slots_that_cannot_be_stacked_are_checked_one_by_one():
    cands, refs = _slots(4)
    cands[1] = (torch.randn(5, 4), cands[1][1])  # a wrong shape: no comparison at all
    refs = [(a, b, 3) for a, b in refs]  # a non-tensor leaf
    cands = [(a, b, 3) for a, b in cands]
    cands[3] = (cands[3][0], cands[3][1], 4)
    got = slot_errors(cands, refs, stacked=True)
    assert got[1] is None and got[3] is None
    assert got[0] is not None and got[0] == pytest.approx(errors(cands[0], refs[0]))


def test_integer_outputs_are_compared_exactly():
    refs = [torch.arange(6) + i for i in range(3)]
    cands = [r.clone() for r in refs]
    cands[1][0] += 1
    assert slot_errors(cands, refs, stacked=True) == [(0.0, 0.0), None, (0.0, 0.0)]


def test_on_a_cpu_the_slots_are_checked_one_by_one_in_their_own_precision(monkeypatch):
    from kernelwright.engine.child import correctness

    cands, refs = _slots(5)
    cands[3] = (cands[3][0], torch.zeros(7))
    monkeypatch.setattr(correctness, "_errors_stacked", lambda c, r: pytest.fail("stacked on a CPU"))
    assert correctness.slot_errors(cands, refs) == [errors(c, r) for c, r in zip(cands, refs, strict=True)]


def test_large_outputs_are_checked_in_chunks(monkeypatch):
    from kernelwright.engine.child import correctness

    cands, refs = _slots(10)
    cands[6] = (cands[6][0], torch.zeros(7))
    want = correctness.slot_errors(cands, refs, stacked=True)
    monkeypatch.setattr(correctness, "STACKED_CHECK_BYTES", 6 * 8 * 27 * 3)  # three slots a chunk
    calls = []
    real = correctness._errors_stacked
    monkeypatch.setattr(correctness, "_errors_stacked", lambda c, r: calls.append(len(r)) or real(c, r))
    assert correctness.slot_errors(cands, refs, stacked=True) == want
    assert calls == [3, 3, 3, 1]


def test_windows_grow_after_the_warm_up_for_a_candidate_much_faster_than_its_reference():
    from kernelwright.engine.child.timing import window_plan

    p = window_plan.plan(
        est_ms=2.0, set_bytes=1 << 20, out_bytes=1 << 20, budget_bytes=1 << 30, window_ms=25, rounds=5, max_calls=256
    )
    # 25 ms of reference work; the budget holds 85 sets of 12 MiB (inputs four times, outputs eight times)
    assert p.calls == 13 and p.limit == 85
    assert window_plan.regrow(p, candidate_ms=0.1, window_ms=25) and p.calls == 85  # capped by the budget
    assert "warm-up" in p.reasons[-1]
    q = window_plan.plan(2.0, 1 << 20, 1 << 20, 1 << 30, 25, 5, 256)
    assert not window_plan.regrow(q, candidate_ms=3.0, window_ms=25) and q.calls == 13  # never shrinks


def test_a_second_look_grows_the_windows_only_where_the_first_was_far_off():
    """The GPU's second warm-up window (grown, warm) sizes the windows again: its per-call time no
    longer carries the first window's fixed costs over a few calls."""
    from kernelwright.engine.child.timing import window_plan

    p = window_plan.plan(2.0, 1 << 20, 1 << 20, 1 << 30, 25, 5, 256)
    assert window_plan.regrow(p, candidate_ms=0.5, window_ms=25) and p.calls == 50  # fixed costs in the estimate
    assert not window_plan.regrow(p, candidate_ms=0.4, window_ms=25, min_factor=1.5) and p.calls == 50  # 63: close
    # far off (the budget)
    assert window_plan.regrow(p, candidate_ms=0.1, window_ms=25, min_factor=1.5) and p.calls == 85


def test_windows_that_cannot_be_queued_whole_halve_down_to_a_floor_and_never_grow_back():
    """A small launch-bound problem (several kernels a call, 256 calls: more launches than the
    device's queue holds) is timed as launched unless its windows shrink until they queue whole."""
    from kernelwright.engine.child.timing import window_plan

    p = window_plan.plan(0.01, 1 << 10, 1 << 10, 1 << 30, 25, 5, 256)
    assert p.calls == 256
    sizes = []
    while window_plan.fit_queue(p, "the reference"):
        sizes.append(p.calls)
        assert p.warmup_calls == p.calls == p.limit  # the next warm-up is the shorter window
    assert sizes == [128, 64, 32, 16] and "could not queue" in p.reasons[-1]
    assert not window_plan.fit_queue(p, "the candidate") and p.calls == window_plan.QUEUE_MIN_CALLS
    assert not window_plan.regrow(p, candidate_ms=0.001, window_ms=25) and p.calls == 16  # capped by its limit
    few = window_plan.plan(2.0, 1 << 10, 1 << 10, 1 << 30, 25, 5, 256)
    assert few.calls == 13 and not window_plan.fit_queue(few, "the candidate") and few.calls == 13


def test_a_speedup_that_launches_would_change_says_so_and_stays_trusted():
    """`launch_bound`: a side's host takes more than 1.25x its device time to launch a call, or the
    device's figure and the one as launched are more than 1.25x apart; a fact about timing, never a
    failure nor a reason to distrust the speed-up. Figures from CUDA-L1's kernels on an H200."""
    from kernelwright.core.config import REPORT_ONLY_FLAGS, EvalConfig
    from kernelwright.engine.child.timing.window_facts import launch_gap

    assert "launch_bound" in REPORT_ONLY_FLAGS and "launch_bound" not in EvalConfig().guards.fail_on

    def facts(r_host, c_host, as_launched):  # type: ignore[no-untyped-def]
        return {"reference_host_ms": r_host, "candidate_host_ms": c_host, "speedup_as_launched": as_launched}

    # level1/98 (KL divergence, 22 us of device work behind ~70 us of Python a call): as launched
    # 0.93x against the device's 1.08x is within 1.25x, but both hosts are 3x their devices
    # (do_bench read 2.25x, back-to-back 2.10x)
    line = launch_gap(1.083, facts(0.0677, 0.0727, 0.9318), {"reference": 0.0221, "candidate": 0.0204}, 1.25)
    assert "reference's host takes 67.7 us" in line and "22.1 us" in line and "candidate's host" in line
    assert "as launched" not in line
    # level1/92: the host paces both sides and as launched is 0.759x against the device's 0.986x
    line = launch_gap(0.986, facts(0.0530, 0.0699, 0.7594), {"reference": 0.0267, "candidate": 0.0271}, 1.25)
    assert "0.986x" in line and "0.759x" in line and "back-to-back" in line
    # the gap alone, either way (a host within 1.25x of its device on both sides)
    assert "1.31x" in launch_gap(1.314, facts(0.01, 0.01, 1.0), {"reference": 0.1, "candidate": 0.1}, 1.25)
    assert "0.76x" in launch_gap(0.76, facts(0.01, 0.01, 1.0), {"reference": 0.1, "candidate": 0.1}, 1.25)
    # level1/57 (128 us) and level1/85 (28 us): the device's work outlasts each host's launches
    assert not launch_gap(1.284, facts(0.0512, 0.0943, 1.284), {"reference": 0.1248, "candidate": 0.0972}, 1.25)
    assert not launch_gap(1.0, facts(0.0172, 0.0256, 0.9995), {"reference": 0.0285, "candidate": 0.0285}, 1.25)
    host_bound = facts(0.08, 0.08, 1.0)
    assert not launch_gap(1.0, host_bound, {"reference": 0.02, "candidate": 0.02}, 0)  # no check
    assert not launch_gap(None, host_bound, {"reference": 0.02, "candidate": 0.02}, 1.25)
    assert not launch_gap(1.0, {}, {"reference": 0.02, "candidate": 0.02}, 1.25)  # no launch figures
    from kernelwright.core.record import EvalResult, Status

    r = EvalResult(status=Status.PASSED, correct=True, speedup=1.018, speedup_basis="device")
    r.metadata["guards"] = {"flags": {"launch_bound": line}}
    assert r.speedup_trusted


def test_an_allocation_refused_by_the_driver_or_torch_isout_of_memory():
    from kernelwright.engine.child.device_handoff import Unavailable
    from kernelwright.engine.child.timing.window_plan import out_of_memory

    assert out_of_memory(Unavailable("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)"))
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not out_of_memory(RuntimeError("ModelNew failed in a timing window"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_errors_in_the_outputs_own_precision_agree_with_float64(dtype):
    """`errors` works in float32 where both sides are finite (a third of the float64 traffic); its
    figures are float64's to far better than the 16x room the timed check allows, and a
    non-finite value on either side still takes the exact path."""
    g = torch.Generator().manual_seed(5)
    r = (torch.randn(256, 300, generator=g) * 50).to(dtype)
    for c in (r.clone(), (r.float() * (1 + 1e-3 * torch.randn(256, 300, generator=g))).to(dtype), torch.zeros_like(r)):
        fast = errors(c, r)
        exact = errors(c.double(), r.double())
        assert fast is not None and exact is not None
        assert fast == pytest.approx(exact, rel=1e-4, abs=1e-12)
    both_inf = r.clone()
    both_inf[3, 4] = float("inf")
    c = both_inf.clone()
    c[0, 0] += 1
    assert errors(c, both_inf) == pytest.approx(errors(c.double(), both_inf.double()))  # same pattern: compared
    c[3, 4] = 1.0
    assert errors(c, both_inf) is None  # the pattern differs
    huge = torch.full((4,), 3e38)
    assert errors(-huge, huge) == pytest.approx((2.0, 2.0))  # the difference overflows float32: exact path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_absolute_errors_and_the_windows_scale_agree_with_float64(dtype):
    """`leaf_abs_errors` and `leaf_scales` measure as `errors` does: in the leaf's working precision
    where everything is finite, in float64 where a value is not or a norm overflows; figures that
    agree with float64's, leaf by leaf, and a non-finite position left out of the scale."""
    g = torch.Generator().manual_seed(7)
    r = ((torch.randn(128, 96, generator=g) * 30).to(dtype), torch.randn(7, generator=g).to(dtype))
    c = tuple((x.float() + 1e-2 * torch.randn(x.shape, generator=g)).to(dtype) for x in r)
    fast = leaf_abs_errors(c, r)
    exact = leaf_abs_errors(tuple(x.double() for x in c), tuple(x.double() for x in r))
    assert fast is not None and exact is not None and len(fast) == 2
    for f, e in zip(fast, exact, strict=True):
        assert f == pytest.approx(e, rel=1e-4)
    scales = leaf_scales([r, tuple(2 * x for x in r)])
    assert scales is not None
    for (n, m), x in zip(scales, r, strict=True):
        assert n == pytest.approx(2 * float(x.double().norm()), rel=1e-4)
        assert m == pytest.approx(2 * float(x.double().abs().max()), rel=1e-4)
    with_inf = r[0].clone()
    with_inf[0, 0] = float("inf")
    (n, m), _ = leaf_scales([(with_inf, r[1])])  # type: ignore[misc]
    rest = r[0].double().clone()
    rest[0, 0] = 0
    assert (n, m) == pytest.approx((float(rest.norm()), float(rest.abs().max())), rel=1e-4)
    assert leaf_scales([(torch.zeros(3, dtype=dtype),)]) == ((1.0, 1.0),)  # all zeros: scale 1, as `errors` takes it
    if dtype == torch.float32:
        huge = torch.full((4,), 3e38)
        assert leaf_scales([(huge,)])[0] == pytest.approx((6e38, 3e38))  # type: ignore[index]  # the float32 norm overflows: float64
        assert leaf_abs_errors((-huge,), (huge,))[0] == pytest.approx((1.2e39, 6e38))  # type: ignore[index]
    assert leaf_abs_errors((torch.ones(3, dtype=torch.complex64),), (torch.ones(3),)) is None


def test_what_a_window_takes_off_is_bounded_by_the_stages_smallest_measure():
    """A measure the runner managed to slow (load when it expects the judge to measure) can only be
    larger than the truth: what comes off a window is at most twice the smallest per-call measure
    of the stage, however large that window's own measure was."""
    seen = [Measures(copy_ms=1.0, open_ms=0.5), Measures(copy_ms=40.0, open_ms=9.0), Measures(1.2, 0.4)]
    cap = ceiling(seen)
    assert cap == Measures(copy_ms=2.0, open_ms=0.8)
    assert ceiling([]) is None
    assert Measures(64.0, 32.0).per_call(32) == Measures(2.0, 1.0)


def test_a_scalar_output_is_timed_like_any_other(cpu_config):
    """A loss returns a 0-dim tensor: its slot in a window's output region is a view of shape ()
    (the judge had failed on it with an engine error, found on a published corpus)."""
    from conftest import FIXTURES
    from kernelwright.core.record import Status
    from kernelwright.engine import evaluate

    text = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    text += "    def forward(self, p, t):\n        d = p - t\n        return (d * d).mean()\n"
    r = evaluate(FIXTURES / "problems" / "mse_loss.py", None, cpu_config, candidate_text=text)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None and r.metadata["timing"]["windows"], r.metadata.get("timing")


def test_the_judges_reference_cache_is_bounded_by_memory():
    """The judge keeps the reference's outputs of recent seeds, at most nine and at most a share of
    the device's memory, oldest out first (four 4 GiB outputs and their 8 GiB float64 oracles had
    filled an H200 and ended the evaluation as an engine error)."""
    from kernelwright.engine.child.judge_state import bounded_cache

    mb = [torch.zeros(1 << 18) for _ in range(5)]  # 1 MiB each
    cache = {seed: (mb[seed], None, [mb[seed]]) for seed in range(5)}  # 2 MiB an entry
    assert list(bounded_cache(cache, 5 << 20)) == [3, 4]
    assert list(bounded_cache(cache, 1 << 20)) == [4]  # the newest stays, whatever its size
    assert list(bounded_cache(cache, 1 << 30, most=3)) == [2, 3, 4]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("made_before", [True, False])
def test_a_commit_writes_what_matches_and_counts_what_does_not(fused, made_before):
    # the single-tensor path (no structure walk) and the general one count the same outputs as
    # mismatched, and write every other output into its own slot
    from kernelwright.engine.child import shared_region
    from kernelwright.engine.child.timing.layouts import Layout
    from kernelwright.engine.child.timing.runner_window import commit

    ref = torch.randn(3, 4)
    layout = Layout.of_outputs(ref)
    outs = [
        torch.full((3, 4), 1.0),
        (torch.full((3, 4), 2.0),),  # a one-tuple around the right tensor: the structure walk takes it
        torch.zeros(3, 4, dtype=torch.float64),  # another dtype
        torch.zeros(4, 3),  # another shape
        None,  # not a tensor
        [torch.zeros(3, 4), torch.zeros(3, 4)],  # two leaves for one
        torch.full((3, 4), 7.0),
    ]
    buf = torch.full((len(outs) * layout.stride,), 255, dtype=torch.uint8)
    region = shared_region.Region(buf, buf.numel(), -1)
    slots = layout.sets(region, len(outs)) if made_before else None
    assert commit(outs, layout, region, fused=fused, slots=slots) == 4
    got = [s[0] for s in layout.sets(region, len(outs))]
    assert torch.equal(got[0], outs[0]) and torch.equal(got[1], outs[1][0]) and torch.equal(got[6], outs[6])
    assert all(torch.isnan(got[i]).all() for i in (2, 3, 4, 5))  # (0xff bytes: left as they were)
    with pytest.raises(ValueError):
        commit(outs, layout, region, slots=layout.sets(region, 2))
    # a multi-leaf reference takes the general path
    layout2 = Layout.of_outputs((ref, ref[0]))
    buf2 = torch.zeros(2 * layout2.stride, dtype=torch.uint8)
    r2 = shared_region.Region(buf2, buf2.numel(), -1)
    assert commit([(ref, ref[0]), ref], layout2, r2, fused=fused) == 1


def test_the_judges_own_out_of_memory_names_the_fix_and_blames_no_candidate():
    # (a GPU shared with other evaluations: the judge's region refused by the driver, seen on an H100
    # under six parallel test workers, was reported as an engine bug)
    from kernelwright.engine.child.device_handoff import Unavailable
    from kernelwright.engine.child.judge import failure_message

    oom = failure_message(Unavailable("cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)"))
    assert "not the candidate's fault" in oom and "window_budget_mb" in oom and "engine bug" not in oom
    assert "CUDA_ERROR_OUT_OF_MEMORY" in oom
    bug = failure_message(KeyError("x"))
    assert "engine bug" in bug and "window_budget_mb" not in bug
