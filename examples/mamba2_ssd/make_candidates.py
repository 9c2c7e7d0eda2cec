"""Writes the two Mamba-2 SSD candidates from their sources: the CUDA kernels (`ssd_kernel.cu`)
and the argument checks and bindings (`ssd_bindings.cpp`).

A candidate is one self-contained Python file (the KernelBench format: the engine evaluates the
file alone), so each holds the two sources as strings. `candidate_y.py` returns Y and
`candidate_state.py` the final state; they differ only in that mode, and one build serves both
(the same sources, the same extension name). Edit the sources or this file, then run

    python3 examples/mamba2_ssd/make_candidates.py            # rewrites both candidates
    python3 examples/mamba2_ssd/make_candidates.py --check    # exit 1 if they are not current

(`tests/test_mamba2_cpu.py` runs the check.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = HERE / "ssd_kernel.cu"
BINDINGS = HERE / "ssd_bindings.cpp"

TITLE = {"y": "returning Y.", "state": "returning the final state."}
STATE_NOTE = """
The kernel source is the same as candidate_y.py (one build serves both); here it runs in its
state-only mode: no C, no Y; segments (tensor cores) chain their end states, the last one is
written out.
"""
DOC = """
Two kernels in one source, picked by shape (`ssd_fused_cfg` / `ssd_fused_path` force one):
  * d_state 64 or 128: every matrix product on the tensor cores in split precision
    (a = a_hi + a_lo; a*b ~= a_lo*b_hi + a_hi*b_lo + a_hi*b_hi, fp32 accumulate): 3xTF32 keeps
    ~fp32 accuracy (plain TF32 gives ~1e-3 normwise); the state lives in mma accumulators. The
    auto choice: path 5 for fp32 Y (the state products in 3xBF16, below), path 6 for bf16, path 2
    (all 3xTF32) for the fp32 final state.
    The sequence is cut into segments so that the grid fills the GPU at any length:
      1. local pass, all segments in parallel: each segment's own end state from a zero state
         (starting after the steps whose weight to the segment end, exp(sum of A), is below
         exp(-110): zero in float32, so they contribute exactly nothing; with decaying A this
         pass is short, with A near 0 it walks the whole segment);
      2. chain: block k waits for H_out[k-1] (flag, release/acquire), publishes
         H_out[k] = exp(sum of A over segment k) * H_out[k-1] + local state k: one [p x n] axpy
         a segment, the only serial part;
      3. output pass: each segment walks again from its entering state and writes Y.
    Blocks take tickets in segment-major order, so a block's predecessor has always started
    (no deadlock). With enough (batch, head) pairs to fill the SMs it uses one segment (no
    extra pass). bfloat16 inputs/outputs: same kernel, bf16 loads and stores, fp32 arithmetic;
    raw bf16 inputs are exact in TF32, so their split's lo part (and its mma) is skipped.
    Path 5: path 2 with the two state products (C H and the state update, 2/3 of the tensor work)
    in split-precision 3xBF16 (mma m16n8k16: half the instructions of 3xTF32 for them); error
    ~1e-6 normwise on Mamba-like inputs, up to ~5e-6 where the state dominates (growing A, the
    final state), against ~2e-7 for path 2. Path 6: C B^T in 3xBF16 too (its C split shared with
    C H); fastest, but 3e-5 in fp32 on spiky A, so it is the auto path only for bf16, where the
    output's own rounding (~1e-3) dominates.
  * other d_state (the KernelBench default has 16): FP32 FFMA on the CUDA cores, one block per
    (batch, head, head-dim tile) walking the sequence (bf16 inputs are widened to fp32 first).

Inside a walk, 32 steps per chunk (the chunked form gives the same function for any block_len,
so the problem's block_len only sets the reference's own rounding). Per chunk:
  G = (C B^T) * exp(cum_l - cum_s) for s <= l           (intra-chunk "attention")
  Y = G X + exp(cum_l) * C H^T                          (H: state entering the chunk)
  H = exp(total) * H + (exp(total - cum_s) * X)^T B     (state leaving the chunk)
The running state H stays on chip; the next chunk's inputs are in flight while the current
chunk computes. Exponent arguments are formed from a float64 prefix sum and always as
differences (never exp(a) * exp(-b)), so neither large positive nor large negative A overflows
or underflows where the true decay does not.
"""

HEAD = """
# Written by make_candidates.py from ssd_kernel.cu and ssd_bindings.cpp: edit those, then run
# `python3 examples/mamba2_ssd/make_candidates.py`.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

"""

CPP_NOTE = """

# Argument checks and the Python-facing functions, compiled by the host C++ compiler (main.cpp).
# Every check message is a literal or ONE std::string built with std::to_string and `+`: a
# TORCH_CHECK whose message has several parts (e.g. "got ", D, ")") formats them through a
# std::ostringstream inside this extension, and on the H100 device machine (torch 2.11, its
# image's compilers) that took the process down with SIGSEGV instead of raising, whether compiled
# by nvcc or by the host compiler; literal and single-std::string messages raise
# (tests/test_mamba2_gpu.py::test_bad_arguments_raise_and_the_process_survives).
"""

TAIL = """

ssd_ext = load_inline(
    name="kw_mamba2_ssd_seg",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["ssd_fused", "ssd_fused_path", "ssd_fused_cfg"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, batch_size, seq_length, n_heads, d_head, d_state, block_len=64, io_dtype="float32"):
        super().__init__()
        assert seq_length % block_len == 0, "seq_length must be a multiple of block_len"
        self.block_len = block_len
        # same parameters, drawn in the same order as the reference; io_dtype "bfloat16"
        # (problem_y_bf16.py): B and C rounded to bf16, A kept in float32, bf16 X in and Y out
        io = getattr(torch, io_dtype)
        self.A = nn.Parameter(torch.randn(batch_size, seq_length, n_heads))
        self.B = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))
        self.C = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))

    def forward(self, X, initial_states=None):
        return ssd_ext.ssd_fused(X, self.A, self.B, self.C, initial_states, RETURN_STATE, 0)
"""


def _raw(name: str, text: str) -> str:
    """`name = r\"\"\"...\"\"\"`: the source as a raw string literal, unchanged."""
    if '"""' in text or text.endswith("\\"):
        raise SystemExit(f"{name}: the source holds a triple quote or ends in a backslash; it cannot be a raw string")
    return f'{name} = r"""\n{text}"""'


def candidate(kind: str) -> str:
    """The text of candidate_<kind>.py (kind: y or state)."""
    title = f'"""Mamba-2 SSD in fused CUDA kernels, {TITLE[kind]}\n'
    doc = title + (STATE_NOTE if kind == "state" else "") + DOC + '"""\n'
    tail = TAIL.replace("RETURN_STATE", "True" if kind == "state" else "False")
    return (doc + HEAD + _raw("cuda_source", KERNEL.read_text()) + CPP_NOTE
            + _raw("cpp_source", BINDINGS.read_text()) + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a candidate is not current")
    args = ap.parse_args(argv)
    stale = []
    for kind in TITLE:
        path, text = HERE / f"candidate_{kind}.py", candidate(kind)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"not current: {', '.join(stale)}; run python3 examples/mamba2_ssd/make_candidates.py", file=sys.stderr)
        return 1
    print(f"{'rewrote' if stale else 'current'}: {', '.join(stale) or 'candidate_y.py, candidate_state.py'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
