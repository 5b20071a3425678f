"""SenseVoiceSmall as a paddable PyTorch model: state_dict-compatible with FunASR, length-aware throughout.

`SenseVoice(dims)` maps raw audio padded to any container plus its valid length to CTC log-probabilities
whose valid frames do not depend on the padding. How each stage stays padding-invariant:
- the frontend (models/frontend.py) zeroes padded samples and gathers LFR frames with clamped indices;
- positions come from a cumsum of ones (never arange().view()), the mask from comparing them with lengths;
- attention masks are additive (-1e4 on padded keys: exp underflows to exactly 0), never Where;
- every input of a weight MatMul is multiplied by the time mask, so padded rows are exactly zero where
  int8 dynamic quantisation measures an activation's range (LayerNorm of a zero row is its bias);
- reshapes are unflatten/flatten of known sizes; no slicing or Python branching on tensor values.
"""
from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipeline.audio import PROMPT_FRAMES

from .frontend import FEATURE_SIZE, Frontend, sinusoid_timescales

ATTENTION_MASK_VALUE = 1e4  # additive; large enough that exp() of a masked score is exactly 0 in fp32
EVENT_PROMPT_ROW = 1
EMOTION_PROMPT_ROW = 2


@dataclass(frozen=True)
class ModelDimensions:
    """SenseVoice encoder geometry; travels with the model in manifest.json."""

    input_size: int = FEATURE_SIZE
    output_size: int = 512
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 50  # encoders0 (1 layer) + encoders (num_blocks - 1)
    tp_blocks: int = 20
    kernel_size: int = 11
    sanm_shift: int = 0
    vocab_size: int = 25055
    prompt_rows: int = 16  # rows of `embed`: languages 0-13, text norm 14-15

    def __post_init__(self) -> None:
        if self.output_size % self.attention_heads:
            raise ValueError(f"output_size {self.output_size} is not divisible by {self.attention_heads} heads")
        if self.num_blocks < 1 or self.tp_blocks < 0 or self.kernel_size < 1 or self.vocab_size < 2:
            raise ValueError(f"invalid model dimensions: {self}")

    @classmethod
    def preset(cls, name: str) -> ModelDimensions:
        try:
            return cls(**PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown model size {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_dict(cls, data: dict) -> ModelDimensions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict] = {
    "full": {},  # the released iic/SenseVoiceSmall: 233,999,167 parameters, 917 tensors
    "tiny": dict(output_size=64, attention_heads=4, linear_units=128, num_blocks=3, tp_blocks=1, vocab_size=64),
    # The shipped demo model (models/demo): python -m export train-demo.
    "demo": dict(output_size=192, attention_heads=4, linear_units=768, num_blocks=6, tp_blocks=1, vocab_size=71),
}


def time_mask(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, T, 1] float mask of the first `lengths` rows, sized by x's own time dimension."""
    positions = torch.ones_like(x[:, :, 0], dtype=torch.int64).cumsum(1)
    return (positions <= lengths.to(torch.int64)[:, None]).to(x.dtype)[:, :, None]


def fsmn_memory(conv: nn.Conv1d, padding: tuple[int, int], x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """FunASR's FSMN memory block: depthwise conv over time plus the input, masked. x [B, T, D] (padded
    rows zero), mask [B, T, 1] -> [B, T, D]. Shared by the SAN-M encoder and the Paraformer decoder.

    The conv runs as a 2-D conv of height 1 on x seen as NHWC ([B, 1, T, D] permuted to [B, D, 1, T]), with
    the conv's own zero padding when it is symmetric: ONNX Runtime's CPU provider then runs it as one
    blocked (NCHWc) depthwise kernel and folds both permutes into its layout reorders. The 1-D conv
    between transposes ran 3-4x slower (a full-size Paraformer has 66 of these blocks). Same sums, same
    weights (conv.weight [D, 1, K] gains a unit axis).

    fp16 graphs (the GPUs') keep the 1-D conv: on CUDA (H100, cuDNN 9) each 2-D conv of height 1 costs
    about 300 ms on its first run at every shape, so a full-size SenseVoice session took 16-20 s to warm up
    and a server's grid of 12 over 200 s; the 1-D conv's first run costs a tenth of that (`bench fsmn`,
    docs/history.md, "Capacity")."""
    left, right = padding
    if left != right:  # a shifted window: pad the time axis explicitly
        x_pad, left = nn.functional.pad(x, (0, 0, left, right)), 0
    else:
        x_pad = x
    if x.dtype == torch.float16:
        memory = nn.functional.conv1d(x_pad.transpose(1, 2), conv.weight, padding=left, groups=conv.groups)
        return (memory.transpose(1, 2) + x) * mask
    # contiguous(): an identity in the graph; without it torch.export fails on the permuted strides
    image = x_pad.unsqueeze(1).permute(0, 3, 1, 2).contiguous()  # [B, D, 1, T]
    memory = nn.functional.conv2d(image, conv.weight.unsqueeze(2), padding=(0, left), groups=conv.groups)
    return (memory.permute(0, 2, 3, 1).flatten(1, 2) + x) * mask


def sinusoid_positions(x: torch.Tensor, timescales: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """FunASR's SinusoidalPositionEncoder after scaling: (x * scale + [sin, cos](position * timescales)) * mask.
    1-based positions; the angles reach hundreds of radians, so they stay float32 even in an fp16 graph."""
    angles = torch.ones_like(x[:, :, :1], dtype=torch.float32).cumsum(1) * timescales
    encoding = torch.cat([torch.sin(angles), torch.cos(angles)], -1).to(x.dtype)
    return (x * scale + encoding) * mask


class MultiHeadedAttentionSANM(nn.Module):
    """Self-attention plus an FSMN memory block (depthwise conv over v), as in FunASR."""

    def __init__(self, heads: int, in_size: int, size: int, kernel_size: int, sanm_shift: int) -> None:
        super().__init__()
        self.heads = heads
        self.d_k = size // heads
        self.size = size
        self.linear_out = nn.Linear(size, size)
        self.linear_q_k_v = nn.Linear(in_size, size * 3)
        self.fsmn_block = nn.Conv1d(size, size, kernel_size, groups=size, bias=False)
        left = (kernel_size - 1) // 2 + sanm_shift
        self.padding = (left, kernel_size - 1 - left)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, in] (padded rows zero), mask [B, T, 1], attention_bias [B, 1, 1, T] -> [B, T, size]."""
        q, k, v = self.linear_q_k_v(x).split(self.size, dim=-1)
        v = v * mask
        memory = fsmn_memory(self.fsmn_block, self.padding, v, mask)
        q_h, k_h, v_h = (t.unflatten(-1, (self.heads, self.d_k)).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q_h * self.d_k**-0.5, k_h.transpose(-2, -1)) + attention_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v_h).transpose(1, 2).flatten(2)
        return self.linear_out(context * mask) + memory


class PositionwiseFeedForward(nn.Module):
    def __init__(self, size: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(size, hidden)
        self.w_2 = nn.Linear(hidden, size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.w_2(torch.relu(self.w_1(x)) * mask)


class EncoderLayerSANM(nn.Module):
    """Pre-LayerNorm SAN-M layer; the first layer (560 -> 512) has no attention residual. `dims` is any
    geometry with output_size, attention_heads, linear_units, kernel_size, sanm_shift (SenseVoice's or
    Paraformer's); `eps` is the LayerNorm epsilon of that family (FunASR: 1e-5 SenseVoice, 1e-12 SAN-M)."""

    def __init__(self, in_size: int, dims: ModelDimensions, eps: float = 1e-5) -> None:
        super().__init__()
        size = dims.output_size
        self.self_attn = MultiHeadedAttentionSANM(dims.attention_heads, in_size, size, dims.kernel_size, dims.sanm_shift)
        self.feed_forward = PositionwiseFeedForward(size, dims.linear_units)
        self.norm1 = nn.LayerNorm(in_size, eps=eps)
        self.norm2 = nn.LayerNorm(size, eps=eps)
        self.residual = in_size == size

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        attention = self.self_attn(self.norm1(x) * mask, mask, attention_bias)
        x = x + attention if self.residual else attention
        return x + self.feed_forward(self.norm2(x) * mask, mask)


class SenseVoiceEncoderSmall(nn.Module):
    def __init__(self, dims: ModelDimensions) -> None:
        super().__init__()
        self.dims = dims
        self.encoders0 = nn.ModuleList([EncoderLayerSANM(dims.input_size, dims)])
        self.encoders = nn.ModuleList([EncoderLayerSANM(dims.output_size, dims) for _ in range(dims.num_blocks - 1)])
        self.tp_encoders = nn.ModuleList([EncoderLayerSANM(dims.output_size, dims) for _ in range(dims.tp_blocks)])
        self.after_norm = nn.LayerNorm(dims.output_size, eps=1e-5)
        self.tp_norm = nn.LayerNorm(dims.output_size, eps=1e-5)
        self.register_buffer("timescales", sinusoid_timescales(dims.input_size), persistent=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x [B, T, input_size] with padded rows zero, lengths [B] -> [B, T, output_size], padded rows zero."""
        mask = time_mask(x, lengths)
        attention_bias = ((mask - 1.0) * ATTENTION_MASK_VALUE).transpose(1, 2)[:, None]  # [B, 1, 1, T]
        x = sinusoid_positions(x, self.timescales, self.dims.output_size**0.5, mask)
        for layer in self.encoders0:
            x = layer(x, mask, attention_bias)
        for layer in self.encoders:
            x = layer(x, mask, attention_bias)
        x = self.after_norm(x) * mask
        for layer in self.tp_encoders:
            x = layer(x, mask, attention_bias)
        return self.tp_norm(x) * mask


class CTCHead(nn.Module):
    def __init__(self, size: int, vocab_size: int) -> None:
        super().__init__()
        self.ctc_lo = nn.Linear(size, vocab_size)


class SenseVoice(nn.Module):
    """The whole graph: audio -> frontend -> prompts + encoder -> CTC log-probabilities.

    forward(audio float32 [B, N] in [-1, 1], audio_lengths int [B], language int [B], textnorm int [B])
        -> logprobs float32 [B, ceil(T/6) + 4, vocab], logprob_lengths int32 [B]
    The state_dict holds exactly FunASR SenseVoiceSmall's tensors; frontend constants and CMVN are
    non-persistent buffers (CMVN is set from am.mvn with `set_cmvn`).
    """

    def __init__(self, dims: ModelDimensions) -> None:
        super().__init__()
        self.dims = dims
        self.frontend = Frontend()
        self.embed = nn.Embedding(dims.prompt_rows, dims.input_size)
        self.encoder = SenseVoiceEncoderSmall(dims)
        self.ctc = CTCHead(dims.output_size, dims.vocab_size)

    def half_encoder(self) -> SenseVoice:
        """This model with the prompt table, encoder and CTC head in fp16 (for GPU graphs); the frontend,
        positions and log-softmax stay float32. Inputs and outputs keep their float32 types."""
        for module in (self.embed, self.encoder, self.ctc):
            module.half()
        self.encoder.timescales = self.encoder.timescales.float()
        return self

    def set_cmvn(self, shift, scale) -> None:
        self.frontend.set_cmvn(shift, scale)

    def features(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised LFR features [B, T, 560] (padded rows zero) and their lengths [B]."""
        return self.frontend(audio, audio_lengths)

    def encode(
        self, features: torch.Tensor, feature_lengths: torch.Tensor, language: torch.Tensor, textnorm: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt rows + encoder + CTC: (logprobs [B, T + 4, V], lengths int32 [B])."""
        language = language.to(torch.int64)
        ones = torch.ones_like(language)
        rows = torch.stack([language, ones * EVENT_PROMPT_ROW, ones * EMOTION_PROMPT_ROW, textnorm.to(torch.int64)], 1)
        x = torch.cat([self.embed(rows), features.to(self.embed.weight.dtype)], dim=1)
        lengths = feature_lengths + PROMPT_FRAMES
        logits = self.ctc.ctc_lo(self.encoder(x, lengths))
        return torch.log_softmax(logits.float(), dim=-1), lengths.to(torch.int32)

    def forward(
        self, audio: torch.Tensor, audio_lengths: torch.Tensor, language: torch.Tensor, textnorm: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features, feature_lengths = self.features(audio, audio_lengths)
        return self.encode(features, feature_lengths, language, textnorm)


def load_checkpoint_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a FunASR `model.pt` (optionally wrapped as {"state_dict": ...}) into a plain state_dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as exc:  # torch's own messages run to many lines
        raise ValueError(f"{path}: not a PyTorch state_dict file (torch.load: {type(exc).__name__})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: not a state_dict (expected a dict of tensors)")
    return state


def load_state_strict(model: SenseVoice, state: dict[str, torch.Tensor]) -> None:
    """load_state_dict(strict=True) with one clear message naming missing, unexpected and misshapen keys."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = [f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}" for k in own if k in state and state[k].shape != own[k].shape]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshapen)):
        if keys:
            shown = ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
            problems.append(f"{len(keys)} {label}: {shown}")
    if problems:
        raise ValueError("checkpoint does not match the model: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)
