"""The probe (engine/child/timing/probe.py): a trusted process the judge opens windows on, to measure
what a window costs besides the calls. Used on a GPU; here its process runs on the CPU, which
exercises the same path (start, ready, the shared output ring, windows, release, end)."""

from __future__ import annotations

import time

import torch

from kernelwright.engine.child.timing import probe
from kernelwright.engine.child.timing.window_plan import Measures
from kernelwright.engine.child.timing.window_timer import WindowTimer


def _timer(sock, draw):
    return WindowTimer(sock, torch.device("cpu"), draw, lambda x: x * 2, lambda e, r, c, s: True, lambda s: 30.0)


def test_a_probe_serves_windows_on_the_runners_ring_and_reports_its_fixed_costs():
    p = probe.Probe(torch.device("cpu"))
    try:
        assert p.wait_ready(60.0), p.failed
        gen = torch.Generator().manual_seed(0)

        def draw():
            return [torch.randn(64, 32, generator=gen)]

        owner = _timer(None, draw)  # the candidate's timer owns the ring; no runner here
        pt = _timer(p.sock, draw)
        pt.ring_owner = owner
        fixed = {}
        ring_ids = []
        for calls in (4, 4, 8):
            sets, layout = pt.pool(calls)
            _, ref_outs = pt.reference_window(sets, layout)
            res = pt.candidate_window(sets, layout, ref_outs, expected_ms=1.0, measures=Measures(0.0, 0.0))
            f = probe.fixed_ms(res.open_to_computed_ms, res.runner_ms)
            assert f is not None and 0.0 <= f <= res.open_to_computed_ms
            fixed.setdefault(calls, []).append(f)
            assert res.runner_ms["calls"] >= 0 and "commit" in res.runner_ms
            ring_ids.append(owner.ring_id)
        assert sorted(fixed) == [4, 8] and len(fixed[4]) == 2
        # one ring, made by the owner, grown once (4 then 8 sets); the probe mapped each as it came
        assert owner.ring is not None and ring_ids[0] == ring_ids[1] != ring_ids[2] and pt.sent_ring == ring_ids[2]
        # the zeros the probe's model returns are what its slots hold (it runs no candidate code)
        from kernelwright.engine.child.timing.probe_windows import release_probe

        release_probe(pt)
        owner.close()
    finally:
        p.close()
    assert p.proc is not None and p.proc.wait(10) is not None


def test_a_probe_whose_process_dies_is_not_ready_and_says_why():
    p = probe.Probe(torch.device("cpu"))
    assert p.proc is not None
    p.proc.kill()
    t0 = time.monotonic()
    assert not p.wait_ready(30.0)
    assert time.monotonic() - t0 < 30.0 and "ended before it was ready" in p.failed


def test_the_fixed_cost_is_the_wall_less_the_probes_own_calls_and_nonsense_is_refused():
    assert probe.fixed_ms(5.0, {"device": 3.5, "calls": 3.9}) == 1.5
    assert probe.fixed_ms(5.0, {"calls": 4.0}) == 1.0
    assert probe.fixed_ms(5.0, {"device": 6.0}) is None  # more than the window: not a time inside it
    assert probe.fixed_ms(5.0, {"device": "x"}) is None
    assert probe.fixed_ms(5.0, {}) is None


def test_what_comes_off_is_the_quickest_opening_the_probe_measured_and_at_most_half_the_windows_own():
    from kernelwright.engine.child.timing.probe_windows import off

    assert off(None, 10.0) == 0.0 and off([], 10.0) == 0.0
    assert off([1.6, 1.4, 1.8], 10.0) == 1.4  # a slowed probe window only makes its opening larger
    assert off([3.0], 4.0) == 2.0  # never more than half of the candidate window's time to `computed`
