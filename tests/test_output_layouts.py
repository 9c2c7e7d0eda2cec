"""A timed output is committed as it is laid out in memory (channels_last stays channels_last): the
candidate never pays for a rearrangement into the reference's layout that its caller would not
make, and the judge reads each slot in the runner's stated order, which it does not trust."""

from __future__ import annotations

import pytest
import torch

from conftest import FIXTURES
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.child import shared_region
from kernelwright.engine.child.timing.layouts import Layout
from kernelwright.engine.child.timing.runner_window import commit, dense_orders, laid_out

HERE = FIXTURES / "layout"


def test_a_channels_last_output_is_committed_byte_for_byte_and_read_back_equal():
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    orders = dense_orders(x)
    assert orders == [[0, 2, 3, 1]]
    layout = Layout.of_outputs(x.contiguous())
    region = shared_region.Region(torch.zeros(layout.stride * 2, dtype=torch.uint8), layout.stride * 2, -1)
    assert commit([x, x * 2], layout, region, orders=orders) == 0
    slots = layout.sets(region, 2)
    # the slot holds x's memory in its own order (no transpose made), and reads back equal
    raw = slots[0][0].reshape(-1)
    assert torch.equal(raw, x.permute(0, 2, 3, 1).reshape(-1))
    assert torch.equal(laid_out(slots[0][0], orders[0]), x) and torch.equal(laid_out(slots[1][0], orders[0]), x * 2)


def test_contiguous_and_odd_outputs_keep_the_reference_layout():
    assert dense_orders(torch.randn(3, 4)) == [None]
    assert dense_orders(torch.randn(4, 3).t()) == [[1, 0]]
    assert dense_orders(torch.randn(8, 8)[:, :4]) == [None]  # not dense: copied as today
    assert dense_orders((torch.randn(2, 2), 3)) == [None, None]


def test_an_order_that_does_not_fit_is_ignored():
    slot = torch.arange(24.0).reshape(2, 3, 4)
    for bad in ([0, 1], [0, 0, 1], "0,1,2", None, [2, 1, 0, 3]):
        assert laid_out(slot, bad) is slot


@pytest.mark.slow
def test_a_channels_last_candidate_passes_with_its_timed_outputs_right(cpu_config):
    r = evaluate(HERE / "problem.py", HERE / "channels_last.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert "timed_output_mismatch" not in r.flags()
    assert all(w["bad_slots"] == 0 for w in r.metadata["timing"]["windows"])


@pytest.mark.slow
def test_a_runner_that_lies_about_its_layout_gets_no_trusted_speed_up(cpu_config):
    r = evaluate(HERE / "problem.py", HERE / "lying_order.py", cpu_config)
    assert r.status is not Status.PASSED or "timed_output_mismatch" in r.flags(), (r.status, r.flags())
