"""Continuous integrate-and-fire (CIF) with static shapes: no loop, no data-dependent indexing.

FunASR's `cif` walks the frames in a Python loop (an ONNX Loop once exported) and its `cif_v1` gathers the
firing frames with boolean indexing (NonZero, a data-dependent shape); neither runs on a fixed-shape
accelerator. The same arithmetic as closed-form tensors:

    S_t = a_0 + ... + a_t                        cumulative weight after frame t (S_-1 = 0)
    token k collects from frame t the part of [S_t-1, S_t] that lies in [k, k + 1):
        w[k, t] = max(0, min(S_t, k + 1) - max(S_t-1, k))
    token k fires (is emitted) when S reaches k + 1, at the frame t where floor(S) passes k
    embeddings = w @ hidden                       [tokens_max, frames] x [frames, D]
    fires_t = frac(S_t) + [floor(S_t) > floor(S_t-1)]   FunASR's `fires` (its integrate at each frame)

That is what FunASR's loop computes: at a firing frame the token takes `1 - integrate` of the frame's
weight and the remainder starts the next token. The sums are taken in 64-bit fixed point (alphas times
2^30, then an integer cumsum) so that they are exact whatever the length: FunASR's `cif_v1` takes them in
float64 for the same reason, and float32 would lose the fractional part once S reaches the hundreds.
A frame's alpha is at most 1 (a sigmoid) plus the 0.45 tail, so a frame fires at most once and the
token count never exceeds the frame count: `tokens_max = frames` is a bound, not a guess.
"""
from __future__ import annotations

import torch

FIXED_POINT_BITS = 30  # alphas >= 2^-7 are exact in fixed point; sums of 1000 frames stay far below 2^63
ONE = 1 << FIXED_POINT_BITS


def cif(hidden: torch.Tensor, alphas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrate-and-fire at threshold 1.

    hidden float [B, T, D], alphas float [B, T] (>= 0, zero on frames that must not count)
        -> (embeddings [B, T, D]: token k in row k, rows past the token count zero,
            fires float32 [B, T] (FunASR's cif peaks), token_counts int64 [B] = floor(sum of alphas))
    """
    fixed = (alphas.float() * ONE).to(torch.int64)  # exact: scaling by a power of two, then truncation
    total = fixed.cumsum(1)  # S_t, [B, T]
    previous = total - fixed  # S_t-1
    whole = torch.div(total, ONE, rounding_mode="floor")
    token_counts = whole[:, -1]
    # Token starts k * ONE for k = 0 .. T-1, from a cumsum of ones (no arange on a traced length).
    starts = (torch.ones_like(alphas[0], dtype=torch.int64).cumsum(0) - 1) * ONE  # [T]
    starts = starts[None, :, None]  # [1, K = T, 1] against frames [B, 1, T]
    share = torch.minimum(total[:, None, :], starts + ONE) - torch.maximum(previous[:, None, :], starts)
    fired = (starts < token_counts[:, None, None] * ONE).to(hidden.dtype)  # [B, K, 1]
    weights = torch.clamp(share, min=0).to(torch.float32) * (1.0 / ONE)  # [B, K, T]
    embeddings = torch.matmul(weights.to(hidden.dtype), hidden) * fired
    fired_here = (whole > torch.div(previous, ONE, rounding_mode="floor")).to(torch.float32)
    fires = (total - whole * ONE).to(torch.float32) * (1.0 / ONE) + fired_here
    return embeddings, fires, token_counts

