"""Qwen3-ASR's audio encoder (AuT) on fixed shapes: log-mel + valid length in, audio embeddings out.

State-dict names are those of `qwen_asr.core.transformers_backend.Qwen3ASRAudioEncoder`. The reference
cuts the mel into 100-frame chunks (2 * n_window), runs three stride-2 Conv2d over each chunk (13 tokens
a chunk), and attends block-diagonally over windows of 8 chunks (n_window_infer 800 -> 104 tokens). It
drops padded positions and passes ragged `cu_seqlens`; here every shape is fixed instead (the seed's 3D
reconstruction): the container's chunks stay in place, the tokens are padded to whole windows and folded
to [B * windows, 104, D], a key mask hides the last window's padding, and the result is unfolded again.
Because a chunk's valid tokens come first in its 13 slots and only the last chunk is partial, the valid
tokens of the container are exactly its first `audio_token_lengths` slots: no gather is needed.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .sensevoice import ATTENTION_MASK_VALUE, time_mask

CONV_STRIDES = 3  # three stride-2 Conv2d: 8x along time and frequency


def conv_output_length(lengths: torch.Tensor) -> torch.Tensor:
    """Length after one stride-2, kernel-3, padding-1 convolution: (n - 1) // 2 + 1, and 0 for n = 0."""
    return torch.div(lengths - 1, 2, rounding_mode="floor") + 1


def audio_token_lengths(mel_lengths: torch.Tensor, chunk_frames: int) -> torch.Tensor:
    """The reference's `_get_feat_extract_output_lengths`: tokens of `mel_lengths` frames (13 a chunk)."""
    tail = mel_lengths % chunk_frames
    for _ in range(CONV_STRIDES):
        tail = conv_output_length(tail)
    per_chunk = chunk_frames
    for _ in range(CONV_STRIDES):
        per_chunk = (per_chunk - 1) // 2 + 1
    return tail + torch.div(mel_lengths, chunk_frames, rounding_mode="floor") * per_chunk


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's sinusoidal position table [length, channels] (the reference's SinusoidsPositionEmbedding)."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2).float())
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class AudioAttention(nn.Module):
    def __init__(self, size: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, size // heads
        self.q_proj = nn.Linear(size, size)
        self.k_proj = nn.Linear(size, size)
        self.v_proj = nn.Linear(size, size)
        self.out_proj = nn.Linear(size, size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        """x [N, W, D] (padded rows zero), mask [N, W, 1], attention_bias [N, 1, 1, W] -> [N, W, D]."""
        q, k, v = (proj(x).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = torch.matmul(q * self.head_dim**-0.5, k.transpose(-2, -1)) + attention_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).flatten(2)
        return self.out_proj(context * mask)


class AudioEncoderLayer(nn.Module):
    def __init__(self, size: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = AudioAttention(size, heads)
        self.self_attn_layer_norm = nn.LayerNorm(size)
        self.fc1 = nn.Linear(size, ffn)
        self.fc2 = nn.Linear(ffn, size)
        self.final_layer_norm = nn.LayerNorm(size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x) * mask, mask, attention_bias)
        hidden = nn.functional.gelu(self.fc1(self.final_layer_norm(x) * mask)) * mask
        return (x + self.fc2(hidden)) * mask


class AudioEncoder(nn.Module):
    """forward(mel float [B, n_mels, T], mel_lengths int [B]) -> (embeddings [B, (T / 100) * 13, output_dim],
    token_lengths int64 [B]). T must be a whole number of 100-frame chunks; rows past a length are zero."""

    def __init__(self, dims) -> None:
        super().__init__()
        self.dims = dims
        hidden = dims.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        bins = dims.num_mel_bins
        for _ in range(CONV_STRIDES):
            bins = (bins - 1) // 2 + 1
        self.conv_out = nn.Linear(hidden * bins, dims.d_model, bias=False)
        self.layers = nn.ModuleList(
            AudioEncoderLayer(dims.d_model, dims.encoder_attention_heads, dims.encoder_ffn_dim)
            for _ in range(dims.encoder_layers)
        )
        self.ln_post = nn.LayerNorm(dims.d_model)
        self.proj1 = nn.Linear(dims.d_model, dims.d_model)
        self.proj2 = nn.Linear(dims.d_model, dims.output_dim)
        positions = sinusoids(dims.max_source_positions, dims.d_model)[: dims.tokens_per_chunk]
        self.register_buffer("positional_embedding", positions, persistent=False)

    def chunk_tokens(self, mel: torch.Tensor, mel_lengths: torch.Tensor, token_lengths: torch.Tensor) -> torch.Tensor:
        """Conv2d stack over each 100-frame chunk: [B, n_mels, C * 100] -> [B, C * 13, d_model].

        The reference convolves a lone chunk (audio of at most 100 frames) at its own length but pads the
        tail of a longer audio with zero frames to 100; the conv masks reproduce both: for a lone chunk
        every conv output past its valid length is zeroed (as if it did not exist), otherwise none is.
        """
        chunk = self.dims.chunk_frames
        frames = torch.ones_like(mel[:, 0, :], dtype=torch.int64).cumsum(1)  # [B, T] 1-based
        mel = mel * (frames <= mel_lengths[:, None]).to(mel.dtype)[:, None, :]
        x = mel.unflatten(2, (-1, chunk)).permute(0, 2, 1, 3).flatten(0, 1)[:, None]  # [B*C, 1, F, 100]
        chunks = x.shape[0] // mel.shape[0]
        lone = (mel_lengths <= chunk).to(torch.int64)[:, None]  # [B, 1]
        length = mel_lengths[:, None] * lone + chunk * (1 - lone)  # lone: own length; else no mask
        length = length.expand(-1, chunks).flatten()[:, None]  # [B*C, 1]
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = nn.functional.gelu(conv(x))
            length = conv_output_length(length)
            steps = torch.ones_like(x[:, 0, 0, :], dtype=torch.int64).cumsum(1)  # [B*C, t] 1-based
            x = x * (steps <= length).to(x.dtype)[:, None, None, :]
        x = x.permute(0, 3, 1, 2).flatten(2).unflatten(0, (-1, chunks)).flatten(1, 2)  # [B, C * 13, hidden * bins]
        # Rows of padded tokens zeroed before the MatMul: int8 dynamic quantisation measures its input's range.
        x = self.conv_out(x * time_mask(x, token_lengths))
        return x + self.positional_embedding.to(x.dtype).repeat(chunks, 1)

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mel_lengths = mel_lengths.to(torch.int64)
        token_lengths = audio_token_lengths(mel_lengths, self.dims.chunk_frames)
        x = self.chunk_tokens(mel, mel_lengths, token_lengths)
        tokens = x.shape[1]
        window = self.dims.window_tokens
        padded = -(-tokens // window) * window
        x = nn.functional.pad(x, (0, 0, 0, padded - tokens))
        mask = time_mask(x, token_lengths)  # [B, padded, 1]
        x = (x * mask).unflatten(1, (-1, window)).flatten(0, 1)  # [B * windows, window, D]
        mask = mask.unflatten(1, (-1, window)).flatten(0, 1)
        attention_bias = ((mask - 1.0) * ATTENTION_MASK_VALUE).transpose(1, 2)[:, None]  # [N, 1, 1, W]
        for layer in self.layers:
            x = layer(x, mask, attention_bias)
        x = self.ln_post(x) * mask
        x = self.proj2(nn.functional.gelu(self.proj1(x)) * mask) * mask
        x = x.unflatten(0, (mel.shape[0], -1)).flatten(1, 2)
        return x[:, :tokens], token_lengths
