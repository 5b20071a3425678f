"""Qwen3-ASR's LLM decoder (Qwen3: GQA, RoPE, Q/K RMSNorm, SwiGLU) with fixed-shape prefill and step.

State-dict names are those of the reference's `Qwen3ASRThinkerTextModel` (under `thinker.model`).
- Prefill takes the whole prompt padded to a fixed length with its valid length; audio embeddings replace
  the audio placeholder tokens in order (the reference's masked_scatter, as a gather with clamped indices
  and a multiplicative blend). It returns the last valid token's logits and the keys/values of every slot.
- A step takes one token, its position and a fixed-length cache; keys at slots >= position are masked
  (additively), so cache slots holding a padded prompt's tail or stale values are never read. It returns
  the new token's keys/values; the caller writes them to slot `position` (no in-graph scatter).
- The step attends over (new token, cache slots) in that order, so every term that is not an exact zero
  sits before the padding: CPU kernels sum in blocks and vector lanes counted from the first element, and
  a new token placed after the cache landed in another block or lane for each cache length (the logits of
  one 0.6B step moved by 0.29 between a 111- and a 687-slot cache).
Positions are plain 1D: the reference's interleaved M-RoPE reduces to RoPE when its three position rows are
equal, which they always are for audio + text prompts.
"""
from __future__ import annotations

import torch
from torch import nn

from .sensevoice import ATTENTION_MASK_VALUE


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, T, head_dim] for positions [B, T]; angles in float32 even in an fp16 graph."""
    freqs = positions.to(torch.float32)[:, :, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


class TextAttention(nn.Module):
    def __init__(self, dims) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = dims.num_attention_heads, dims.num_key_value_heads, dims.head_dim
        self.q_proj = nn.Linear(dims.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dims.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dims.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, dims.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, dims.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, dims.rms_norm_eps)

    def forward(self, x, cos, sin, attention_bias, mask, past_keys=None, past_values=None):
        """x [B, T, H]; cos/sin [B, 1, T, hd]; attention_bias [B, 1, T, T + S] over (new, past slots); mask
        [B, T, 1] of valid rows; past_keys/values [B, kv_heads, S, hd] or None.
        Returns (out [B, T, H], keys, values [B, kv, T, hd])."""
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.heads, self.head_dim))).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))).transpose(1, 2)
        v = self.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = k, v
        if past_keys is not None:  # the new token first: see the module's docstring
            keys, values = torch.cat([k, past_keys], dim=2), torch.cat([v, past_values], dim=2)
        group = self.heads // self.kv_heads  # GQA: each kv head serves `group` query heads
        q = q.unflatten(1, (self.kv_heads, group))  # [B, kv, group, T, hd]
        scores = torch.matmul(q * self.head_dim**-0.5, keys[:, :, None].transpose(-2, -1))
        scores = scores + attention_bias[:, :, None]
        probabilities = torch.softmax(scores.float(), dim=-1)
        context = torch.matmul(probabilities.to(v.dtype), values[:, :, None])
        out = self.o_proj(context.flatten(1, 2).transpose(1, 2).flatten(2) * mask)
        return out, k, v


class TextMLP(nn.Module):
    def __init__(self, dims) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.up_proj = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.down_proj = nn.Linear(dims.intermediate_size, dims.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TextDecoderLayer(nn.Module):
    def __init__(self, dims) -> None:
        super().__init__()
        self.self_attn = TextAttention(dims)
        self.mlp = TextMLP(dims)
        self.input_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)

    def forward(self, x, cos, sin, attention_bias, mask, past_keys=None, past_values=None):
        """Padded rows (mask 0) stay exactly zero: int8 dynamic quantisation measures each MatMul input's range."""
        attention, k, v = self.self_attn(self.input_layernorm(x), cos, sin, attention_bias, mask, past_keys, past_values)
        x = x + attention
        return x + self.mlp(self.post_attention_layernorm(x)) * mask, k, v


class TextModel(nn.Module):
    """The decoder stack; `prefill` and `step` are the two fixed-shape graphs."""

    def __init__(self, dims) -> None:
        super().__init__()
        self.dims = dims
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList(TextDecoderLayer(dims) for _ in range(dims.num_hidden_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        exponents = torch.arange(0, dims.head_dim, 2, dtype=torch.int64).float() / dims.head_dim
        self.register_buffer("inv_freq", 1.0 / (dims.rope_theta**exponents), persistent=False)

    def prompt_embeddings(self, prompt_ids, audio_embeds, audio_token_id: int) -> torch.Tensor:
        """Token embeddings with the k-th audio placeholder replaced by audio_embeds[:, k]."""
        is_audio = (prompt_ids == audio_token_id).to(torch.int64)
        slot = torch.clamp(is_audio.cumsum(1) - 1, min=0, max=audio_embeds.shape[1] - 1)
        placed = torch.gather(audio_embeds, 1, slot[:, :, None].expand(-1, -1, audio_embeds.shape[-1]))
        blend = is_audio.to(placed.dtype)[:, :, None]
        return self.embed_tokens(prompt_ids) * (1 - blend) + placed.to(self.embed_tokens.weight.dtype) * blend

    def prefill(self, prompt_embeds: torch.Tensor, prompt_lengths: torch.Tensor):
        """prompt_embeds [B, P, H] (valid prefix of prompt_lengths) -> (last hidden [B, H],
        keys, values [layers, B, kv_heads, P, hd])."""
        positions = torch.ones_like(prompt_embeds[:, :, 0], dtype=torch.int64).cumsum(1) - 1  # [B, P]
        valid = (positions < prompt_lengths.to(torch.int64)[:, None]).to(prompt_embeds.dtype)
        causal = (positions[:, None, :] <= positions[:, :, None]).to(prompt_embeds.dtype)  # [B, q, k]
        allowed = causal * valid[:, None, :]
        attention_bias = ((allowed - 1.0) * ATTENTION_MASK_VALUE)[:, None]  # [B, 1, P, P]
        cos, sin = rotary(positions, self.inv_freq, prompt_embeds.dtype)
        x = prompt_embeds * valid[:, :, None]
        keys, values = [], []
        for layer in self.layers:
            x, k, v = layer(x, cos, sin, attention_bias, valid[:, :, None])
            keys.append(k)
            values.append(v)
        last = torch.clamp(prompt_lengths.to(torch.int64) - 1, min=0)[:, None, None].expand(-1, 1, x.shape[-1])
        hidden = self.norm(torch.gather(x, 1, last)[:, 0])
        return hidden, torch.stack(keys), torch.stack(values)

    def step(self, token_ids, positions, cache_keys, cache_values):
        """token_ids [B, 1], positions [B] (= valid cache slots), cache [layers, B, kv, S, hd] ->
        (hidden [B, H], new keys, values [layers, B, kv, 1, hd])."""
        x = self.embed_tokens(token_ids)
        positions = positions.to(torch.int64)
        slots = torch.ones_like(cache_keys[0, :, 0, :, 0], dtype=torch.int64).cumsum(1) - 1  # [B, S]
        allowed = torch.cat([torch.ones_like(positions[:, None], dtype=torch.bool), (slots < positions[:, None])], 1)
        attention_bias = ((allowed.to(x.dtype) - 1.0) * ATTENTION_MASK_VALUE)[:, None, None]  # [B, 1, 1, 1+S]
        cos, sin = rotary(positions[:, None], self.inv_freq, x.dtype)
        keys, values = [], []
        for index, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, attention_bias, 1.0, cache_keys[index], cache_values[index])
            keys.append(k)
            values.append(v)
        return self.norm(x[:, 0]), torch.stack(keys), torch.stack(values)
