"""A candidate's text is shown, never obeyed by the terminal (core/printable.py)."""

from __future__ import annotations

import io

from rich.console import Console

from conftest import ADD_ONE
from kernelwright.cli.console import render_result
from kernelwright.core.printable import printable
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

# what a reward-hacking candidate prints into its own error: move up a line, erase it, write a
# passing verdict over the failing one, and set the window's title
FORGED = "\x1b[1A\x1b[2K\rpassed  speedup 41.0x\x1b]0;kernelwright: passed\x1b\\\x9b2J"

CANDIDATE = f"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        raise RuntimeError({FORGED!r})
"""


def test_control_characters_are_written_out_and_tabs_and_newlines_kept():
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("\x1b[31mred\x07\x7f\x9b") == "\\x1b[31mred\\x07\\x7f\\x9b"
    assert printable({"k\x1b": ["\r", ("\x00",)], "n": 3}) == {"k\\x1b": ["\\x0d", ("\\x00",)], "n": 3}


def test_an_error_the_candidate_writes_reaches_the_terminal_as_text(cpu_config):
    cpu_config.time_candidate = False
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=CANDIDATE)
    assert r.status is Status.RUNTIME_ERROR
    assert "\x1b" not in r.error_log and "\x9b" not in r.error_log and "\\x1b[1A" in r.error_log
    buf = io.StringIO()
    render_result(r, Console(file=buf, force_terminal=True, width=200))
    shown = buf.getvalue()
    # rich's own styling is there; none of the candidate's sequences are
    for seq in ("\x1b[1A", "\x1b[2K", "\x1b]0;", "\x9b"):
        assert seq not in shown, seq
