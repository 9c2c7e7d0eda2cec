"""Mamba-2 SSD (state space duality), chunked scan, returning Y, with bfloat16 inputs and output.

KernelBench format, the bfloat16 twin of `problem_y.py` (same recurrence, same parameters drawn in the
same order), set up the way Mamba-2 runs in bf16: the input X, the projections B and C and the
output Y are bfloat16; the per-step log-decay A stays float32 (as mamba_ssm keeps dt and A). The
reference computes in float32, or wider when its inputs are wider (`torch.promote_types`), and
rounds Y to the input's dtype once at the end. So the engine's float64 oracle (the module and
inputs upcast to float64) computes the same math in float64, and the reference's own error is the
bf16 rounding of its output, the least any bf16-output kernel can have.

    kernelwright eval examples/mamba2_ssd/problem_y_bf16.py examples/mamba2_ssd/candidate_y.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def segsum(x: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = x[..., j+1] + ... + x[..., i] for j <= i, and -inf above the diagonal."""
    T = x.size(-1)
    csum = torch.cumsum(x, dim=-1)
    diff = csum[..., :, None] - csum[..., None, :]
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
    return diff.masked_fill(~lower, -torch.inf)


def ssd_chunked(X, A, B, C, block_len, initial_states=None, want_y=True):
    """Returns (Y, final_state): Y (b, l, h, p) (None when not want_y), final_state (b, h, p, n)."""
    b, l, h, p = X.shape
    n = B.shape[-1]
    c = l // block_len
    # (b, c, block, ...) chunks along the sequence
    Xc = X.reshape(b, c, block_len, h, p)
    Bc = B.reshape(b, c, block_len, h, n)
    Cc = C.reshape(b, c, block_len, h, n)
    Ac = A.reshape(b, c, block_len, h).permute(0, 3, 1, 2)  # (b, h, c, block)
    A_cum = torch.cumsum(Ac, dim=-1)

    # 1. state at the end of each chunk, from that chunk's inputs only
    decay_to_end = torch.exp(A_cum[..., -1:] - A_cum)  # (b, h, c, block)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_to_end, Xc)

    # 2. recurrence over chunk boundaries
    if initial_states is None:
        initial_states = torch.zeros_like(states[:, :1])
    states = torch.cat([initial_states, states], dim=1)  # (b, c+1, h, p, n)
    chunk_decay = torch.exp(segsum(F.pad(A_cum[..., -1], (1, 0))))  # (b, h, c+1, c+1)
    all_states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    entering, final_state = all_states[:, :-1], all_states[:, -1]
    if not want_y:
        return None, final_state

    # 3. intra-chunk (diagonal block) outputs
    decay = torch.exp(segsum(Ac))  # (b, h, c, block, block)
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, decay, Xc)

    # 4. contribution of the state entering each chunk
    decay_from_start = torch.exp(A_cum)  # (b, h, c, block)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, entering, decay_from_start)

    Y = (Y_diag + Y_off).reshape(b, l, h, p)  # chunks back in order: (c, block) -> c * block + block
    return Y, final_state


class Model(nn.Module):
    def __init__(self, batch_size, seq_length, n_heads, d_head, d_state, block_len=64, io_dtype="bfloat16"):
        super().__init__()
        assert seq_length % block_len == 0, "seq_length must be a multiple of block_len"
        self.block_len = block_len
        io = getattr(torch, io_dtype)
        self.A = nn.Parameter(torch.randn(batch_size, seq_length, n_heads))  # float32, as in mamba_ssm
        self.B = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))
        self.C = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state).to(io))

    def forward(self, X, initial_states=None):
        wide = torch.promote_types(X.dtype, torch.float32)  # float32 here; float64 in the oracle
        S0 = None if initial_states is None else initial_states.to(wide)
        Y, _ = ssd_chunked(X.to(wide), self.A.to(wide), self.B.to(wide), self.C.to(wide), self.block_len, S0)
        return Y.to(X.dtype)


batch_size = 16
seq_length = 128
n_heads = 8
d_head = 64
d_state = 16
block_len = 64
io_dtype = "bfloat16"


def get_inputs():
    return [torch.randn(batch_size, seq_length, n_heads, d_head).to(getattr(torch, io_dtype))]


def get_init_inputs():
    return [batch_size, seq_length, n_heads, d_head, d_state, block_len, io_dtype]
