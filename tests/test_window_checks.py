"""The judge's check of every timed slot: the errors computed for all slots at once are the errors
computed slot by slot, and a slot that is replayed, unwritten, non-finite or of another shape is
caught whichever way it is computed."""

from __future__ import annotations

import pytest
import torch

from kernelwright.engine.child.windows import errors, slot_errors


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
    got = slot_errors(cands, refs)
    want = [errors(c, r) for c, r in zip(cands, refs, strict=True)]
    assert got[7] is None and want[7] is None
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            assert g == pytest.approx(w, rel=1e-9, abs=1e-15)
    assert got[2][1] == pytest.approx(1.0) and got[5][0] > 0.5  # far off: the check rejects them
    assert got[0][0] < 1e-5


def test_slots_that_cannot_be_stacked_are_checked_one_by_one():
    cands, refs = _slots(4)
    cands[1] = (torch.randn(5, 4), cands[1][1])  # a wrong shape: no comparison at all
    refs = [(a, b, 3) for a, b in refs]  # a non-tensor leaf
    cands = [(a, b, 3) for a, b in cands]
    cands[3] = (cands[3][0], cands[3][1], 4)
    got = slot_errors(cands, refs)
    assert got[1] is None and got[3] is None
    assert got[0] is not None and got[0] == pytest.approx(errors(cands[0], refs[0]))


def test_integer_outputs_are_compared_exactly():
    refs = [torch.arange(6) + i for i in range(3)]
    cands = [r.clone() for r in refs]
    cands[1][0] += 1
    assert slot_errors(cands, refs) == [(0.0, 0.0), None, (0.0, 0.0)]


def test_large_outputs_are_checked_in_chunks(monkeypatch):
    from kernelwright.engine.child import windows

    cands, refs = _slots(10)
    cands[6] = (cands[6][0], torch.zeros(7))
    want = windows.slot_errors(cands, refs)
    monkeypatch.setattr(windows, "STACKED_CHECK_BYTES", 6 * 8 * 27 * 3)  # three slots a chunk
    calls = []
    real = windows._errors_stacked
    monkeypatch.setattr(windows, "_errors_stacked", lambda c, r: calls.append(len(r)) or real(c, r))
    assert windows.slot_errors(cands, refs) == want
    assert calls == [3, 3, 3, 1]
