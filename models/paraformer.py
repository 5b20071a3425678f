"""Paraformer (FunASR's paraformer-large, paraformer-zh) as a paddable PyTorch model on fixed shapes.

The state_dict is exactly FunASR's: a SAN-M encoder (`encoder.*`, the layers of models/sensevoice.py),
`CifPredictorV2` (`predictor.*`) and `ParaformerSANMDecoder` (`decoder.*`). The same contract as
SenseVoice: raw audio padded to a container plus its valid length in; the in-graph frontend; a time mask
through every encoder and decoder layer; additive attention masks; every weight MatMul's input masked so
padded rows are zero (int8-safe). The CIF is models/cif.py: closed-form, no Loop/If/NonZero/LSTM.

Output positions: the encoder has T frames; the predictor appends FunASR's tail frame (alpha 0.45 at the
first frame after the valid ones), so CIF sees T + 1 frames and at most T + 1 tokens.

Exported in two stages (EncoderStage, DecoderStage), so that the decoder's cost follows the tokens: stage
one (audio -> frontend -> encoder -> CIF) runs in the audio container; the host then hands the decoder
only the first K token rows, K a token container that holds the CIF count (rows past the count are zero,
and every decoder row depends only on its own row, the encoder output and the masked FSMN window, so K
changes no valid row: tests/models/test_paraformer.py and `export verify` check it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.modeldir import (PARAFORMER_DECODER_INPUT_NAMES, PARAFORMER_DECODER_OUTPUT_NAMES,
                               PARAFORMER_ENCODER_OUTPUT_NAMES, PARAFORMER_INPUT_NAMES)

from .cif import cif
from .frontend import FEATURE_SIZE, Frontend, sinusoid_timescales
from .sensevoice import ATTENTION_MASK_VALUE, EncoderLayerSANM, fsmn_memory, sinusoid_positions, time_mask

LAYER_NORM_EPS = 1e-12  # FunASR's transformer LayerNorm; fp16 graphs use FP16_LAYER_NORM_EPS instead
FP16_LAYER_NORM_EPS = 1e-5  # 1e-12 underflows in fp16, and a zero (padded) row would divide 0 by 0
CIF_THRESHOLD = 1.0


@dataclass(frozen=True)
class ParaformerDimensions:
    """Paraformer geometry; travels with the model in manifest.json."""

    input_size: int = FEATURE_SIZE
    output_size: int = 512
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 50  # encoder: encoders0 (1 layer) + encoders (num_blocks - 1)
    kernel_size: int = 11
    sanm_shift: int = 0
    decoder_attention_heads: int = 4
    decoder_linear_units: int = 2048
    decoder_blocks: int = 16  # all with cross-attention (att_layer_num = num_blocks), then one FFN layer
    decoder_kernel_size: int = 11
    decoder_sanm_shift: int = 0
    predictor_l_order: int = 1
    predictor_r_order: int = 1
    tail_threshold: float = 0.45
    smooth_factor: float = 1.0
    noise_threshold: float = 0.0
    vocab_size: int = 8404

    def __post_init__(self) -> None:
        for size, heads in ((self.output_size, self.attention_heads), (self.output_size, self.decoder_attention_heads)):
            if size % heads:
                raise ValueError(f"output_size {size} is not divisible by {heads} heads")
        if self.num_blocks < 1 or self.decoder_blocks < 1 or self.kernel_size < 1 or self.vocab_size < 4:
            raise ValueError(f"invalid model dimensions: {self}")

    @classmethod
    def preset(cls, name: str) -> ParaformerDimensions:
        try:
            return cls(**PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown model size {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_dict(cls, data: dict) -> ParaformerDimensions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict] = {
    "full": {},  # the released paraformer-large (paraformer-zh): vocabulary of 8404
    "tiny": dict(output_size=64, attention_heads=4, linear_units=128, num_blocks=3, decoder_attention_heads=4,
                 decoder_linear_units=128, decoder_blocks=2, vocab_size=64),
}


def attention_bias(mask: torch.Tensor) -> torch.Tensor:
    """[B, T, 1] float mask -> additive key bias [B, 1, 1, T]: 0 on valid keys, -1e4 on padded ones."""
    return ((mask - 1.0) * ATTENTION_MASK_VALUE).transpose(1, 2)[:, None]


class SANMEncoder(nn.Module):
    """FunASR's SANMEncoder (input_layer "pe"): the SenseVoice layers without its tp_encoders."""

    def __init__(self, dims: ParaformerDimensions, eps: float = LAYER_NORM_EPS) -> None:
        super().__init__()
        self.dims = dims
        self.encoders0 = nn.ModuleList([EncoderLayerSANM(dims.input_size, dims, eps)])
        self.encoders = nn.ModuleList([EncoderLayerSANM(dims.output_size, dims, eps) for _ in range(dims.num_blocks - 1)])
        self.after_norm = nn.LayerNorm(dims.output_size, eps=eps)
        self.register_buffer("timescales", sinusoid_timescales(dims.input_size), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, T, input_size] (padded rows zero), mask [B, T, 1] -> [B, T, output_size], padded rows zero."""
        bias = attention_bias(mask)
        x = sinusoid_positions(x, self.timescales, self.dims.output_size**0.5, mask)
        for layer in list(self.encoders0) + list(self.encoders):
            x = layer(x, mask, bias)
        return self.after_norm(x) * mask


class CifPredictorV2(nn.Module):
    """FunASR's CifPredictorV2 at inference: alphas from a conv + linear head, the tail frame, then CIF."""

    def __init__(self, dims: ParaformerDimensions) -> None:
        super().__init__()
        self.dims = dims
        size = dims.output_size
        self.cif_conv1d = nn.Conv1d(size, size, dims.predictor_l_order + dims.predictor_r_order + 1)
        self.cif_output = nn.Linear(size, 1)
        # The conv's weight as one [taps * D, D] matrix, kept in step with cif_conv1d (refreshed on load):
        # a plain initializer in the graph, so int8 quantises it. Computed in the graph instead, it stays a
        # float MatMul that ONNX Runtime fuses with its bias into a Gemm whose last bits depend on the
        # container, and int8 rounding downstream magnified that into different tokens.
        self.register_buffer("window_weight", self._window_weight(), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_window_weight())

    def _window_weight(self) -> torch.Tensor:
        return self.cif_conv1d.weight.detach().permute(2, 1, 0).flatten(0, 1).contiguous()  # tap-major, like `window`

    def refresh_window_weight(self) -> None:
        self.window_weight = self._window_weight().to(self.window_weight.dtype)

    def alphas(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, D] (padded rows zero), mask [B, T, 1] -> alphas float32 [B, T + 1] with the tail."""
        # The conv as one MatMul over stacked neighbour frames: int8 quantises it like every other weight,
        # and ONNX Runtime's float Conv picks shape-dependent kernels whose last bits differ per container.
        left, right = self.dims.predictor_l_order, self.dims.predictor_r_order
        frames = hidden.shape[1]
        padded = nn.functional.pad(hidden, (0, 0, left, right))
        window = torch.cat([padded[:, k:k + frames] for k in range(left + right + 1)], -1)  # [B, T, taps * D]
        context = torch.relu(torch.matmul(window, self.window_weight) + self.cif_conv1d.bias)
        # cif_output as a product and a row sum, in float32, not a MatMul: this one number per frame decides
        # how many tokens fire, so int8 must not round it (FunASR's recipe keeps it float too), and as a
        # float MatMul ONNX Runtime fuses it with its bias into a Gemm whose last bits depend on the
        # container (one unit at 5 s on the released size: the int8 decoder then rounded other tokens).
        # A row sum reads its own row only, in the same order at any frame count.
        weight, bias = self.cif_output.weight.float(), self.cif_output.bias.float()
        alphas = torch.sigmoid(((context * mask).float() * weight).sum(-1, keepdim=True) + bias)
        alphas = torch.relu(alphas * self.dims.smooth_factor - self.dims.noise_threshold) * mask.float()
        alphas = alphas[:, :, 0]
        # FunASR's tail_process_fn: tail_threshold on the first frame past the valid ones.
        valid = mask[:, :, 0].float()
        zero = torch.zeros_like(valid[:, :1])
        tail = torch.cat([zero + 1.0, valid], 1) - torch.cat([valid, zero], 1)
        return torch.cat([alphas, zero], 1) + tail * self.dims.tail_threshold

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """-> (token embeddings [B, T + 1, D], token_counts int64 [B], alphas [B, T + 1], fires [B, T + 1])."""
        alphas = self.alphas(hidden, mask)
        extended = torch.cat([hidden, torch.zeros_like(hidden[:, :1])], 1)
        embeddings, fires, token_counts = cif(extended, alphas)
        return embeddings, token_counts, alphas, fires


class MultiHeadedAttentionSANMDecoder(nn.Module):
    """The decoder's self-attention: only an FSMN memory block (the encoder's, without attention)."""

    def __init__(self, size: int, kernel_size: int, sanm_shift: int) -> None:
        super().__init__()
        self.fsmn_block = nn.Conv1d(size, size, kernel_size, groups=size, bias=False)
        left = (kernel_size - 1) // 2 + sanm_shift
        self.padding = (left, kernel_size - 1 - left)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return fsmn_memory(self.fsmn_block, self.padding, x * mask, mask)


class MultiHeadedAttentionCrossAtt(nn.Module):
    """Attention from token rows to encoder frames; padded frames masked by an additive bias."""

    def __init__(self, heads: int, size: int, memory_size: int) -> None:
        super().__init__()
        self.heads, self.d_k, self.size = heads, size // heads, size
        self.linear_q = nn.Linear(size, size)
        self.linear_k_v = nn.Linear(memory_size, size * 2)
        self.linear_out = nn.Linear(size, size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, memory: torch.Tensor, memory_bias: torch.Tensor) -> torch.Tensor:
        """x [B, K, size], mask [B, K, 1], memory [B, T, D] (padded rows zero), memory_bias [B, 1, 1, T]."""
        q = self.linear_q(x)
        k, v = self.linear_k_v(memory).split(self.size, dim=-1)
        q_h, k_h, v_h = (t.unflatten(-1, (self.heads, self.d_k)).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q_h * self.d_k**-0.5, k_h.transpose(-2, -1)) + memory_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v_h).transpose(1, 2).flatten(2)
        return self.linear_out(context * mask) * mask


class PositionwiseFeedForwardDecoderSANM(nn.Module):
    """w_2(LayerNorm(relu(w_1 x))), w_2 without bias."""

    def __init__(self, size: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.w_1 = nn.Linear(size, hidden)
        self.w_2 = nn.Linear(hidden, size, bias=False)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.norm(torch.relu(self.w_1(x))) * mask)


class DecoderLayerSANM(nn.Module):
    """FunASR's DecoderLayerSANM (pre-norm): FFN, then FSMN with the residual, then cross-attention.
    The last layer (decoders3) has only the FFN and no residual at all, as in FunASR."""

    def __init__(self, dims: ParaformerDimensions, eps: float, attention: bool) -> None:
        super().__init__()
        size = dims.output_size
        self.feed_forward = PositionwiseFeedForwardDecoderSANM(size, dims.decoder_linear_units, eps)
        self.norm1 = nn.LayerNorm(size, eps=eps)
        self.self_attn = self.src_attn = None
        if attention:
            self.self_attn = MultiHeadedAttentionSANMDecoder(size, dims.decoder_kernel_size, dims.decoder_sanm_shift)
            self.src_attn = MultiHeadedAttentionCrossAtt(dims.decoder_attention_heads, size, dims.output_size)
            self.norm2 = nn.LayerNorm(size, eps=eps)
            self.norm3 = nn.LayerNorm(size, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, memory: torch.Tensor, memory_bias: torch.Tensor) -> torch.Tensor:
        hidden = self.feed_forward(self.norm1(x) * mask, mask)
        if self.self_attn is None:
            return hidden
        x = x + self.self_attn(self.norm2(hidden) * mask, mask)
        return x + self.src_attn(self.norm3(x) * mask, mask, memory, memory_bias)


class ParaformerSANMDecoder(nn.Module):
    def __init__(self, dims: ParaformerDimensions, eps: float = LAYER_NORM_EPS) -> None:
        super().__init__()
        size = dims.output_size
        self.embed = nn.Sequential(nn.Embedding(dims.vocab_size, size))  # in the checkpoint; unused at inference
        self.decoders = nn.ModuleList([DecoderLayerSANM(dims, eps, True) for _ in range(dims.decoder_blocks)])
        self.decoders3 = nn.ModuleList([DecoderLayerSANM(dims, eps, False)])
        self.after_norm = nn.LayerNorm(size, eps=eps)
        self.output_layer = nn.Linear(size, dims.vocab_size)

    def forward(self, memory: torch.Tensor, memory_mask: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """memory [B, T, D], memory_mask [B, T, 1], tokens [B, K, D] (rows past the count zero),
        token_mask [B, K, 1] -> logits [B, K, vocab]."""
        bias = attention_bias(memory_mask)
        x = tokens
        for layer in list(self.decoders) + list(self.decoders3):
            x = layer(x, token_mask, memory, bias)
        return self.output_layer(self.after_norm(x) * token_mask)


class Paraformer(nn.Module):
    """The whole graph: audio -> frontend -> encoder -> CIF -> decoder -> best token per position.

    forward(audio float32 [B, N] in [-1, 1], audio_lengths int [B])
        -> token_ids int32 [B, T + 1] (argmax; 0 past the count), token_logprobs float32 [B, T + 1],
           token_counts int32 [B], cif_alphas and cif_peaks float32 [B, T + 1] (CIF weights with the tail,
           FunASR's CIF fires), peak_lengths int32 [B] (valid frames + 1)
    (pipeline/families/paraformer/decoding.py names them and turns them into text and times).
    with T = ceil(fbank frames / 6) encoder frames. CMVN is set from am.mvn with `set_cmvn`.
    """

    def __init__(self, dims: ParaformerDimensions) -> None:
        super().__init__()
        self.dims = dims
        self.frontend = Frontend()
        self.encoder = SANMEncoder(dims)
        self.predictor = CifPredictorV2(dims)
        self.decoder = ParaformerSANMDecoder(dims)

    def set_cmvn(self, shift, scale) -> None:
        self.frontend.set_cmvn(shift, scale)

    def half_encoder(self) -> Paraformer:
        """This model with encoder and decoder in fp16 (for GPU graphs); the frontend, the CIF sums and the
        log-softmax stay float32. LayerNorm epsilons become FP16_LAYER_NORM_EPS (1e-12 underflows)."""
        for module in (self.encoder, self.predictor, self.decoder):
            module.half()
            for norm in module.modules():
                if isinstance(norm, nn.LayerNorm):
                    norm.eps = max(norm.eps, FP16_LAYER_NORM_EPS)
        self.encoder.timescales = self.encoder.timescales.float()
        return self

    def features(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised LFR features [B, T, 560] (padded rows zero) and their lengths [B]."""
        return self.frontend(audio, audio_lengths)

    def encode(self, features: torch.Tensor, feature_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (encoder output [B, T, D] with padded rows zero, mask [B, T, 1])."""
        x = features.to(self.encoder.after_norm.weight.dtype)
        mask = time_mask(x, feature_lengths)
        return self.encoder(x, mask), mask

    def decode(self, memory: torch.Tensor, memory_mask: torch.Tensor, embeddings: torch.Tensor,
               token_counts: torch.Tensor) -> torch.Tensor:
        """Decoder log-probabilities float32 [B, K, vocab]; rows past a token count are meaningless."""
        token_mask = time_mask(embeddings, token_counts)
        logits = self.decoder(memory, memory_mask, embeddings.to(memory.dtype), token_mask.to(memory.dtype))
        return torch.log_softmax(logits.float(), dim=-1)

    def encoder_stage(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Stage one -> (encoder_out [B, T, D], encoder_lengths int32 [B], token_embeddings [B, T + 1, D]
        (rows past the count zero), token_counts int32 [B], cif_alphas, cif_peaks [B, T + 1], peak_lengths)."""
        features, feature_lengths = self.features(audio, audio_lengths)
        memory, mask = self.encode(features, feature_lengths)
        embeddings, token_counts, alphas, fires = self.predictor(memory, mask)
        lengths = feature_lengths.to(torch.int32)
        return memory, lengths, embeddings, token_counts.to(torch.int32), alphas, fires, lengths + 1

    def decoder_stage(self, memory: torch.Tensor, memory_lengths: torch.Tensor, embeddings: torch.Tensor,
                      token_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage two, on any number K of token rows that holds the count -> (token_ids int32 [B, K], the
        argmax, 0 past the count; token_logprobs float32 [B, K], its log-prob, 0 past the count)."""
        logprobs = self.decode(memory, time_mask(memory, memory_lengths), embeddings, token_counts)
        best, ids = logprobs.max(-1)
        real = time_mask(logprobs, token_counts)[:, :, 0]
        return (ids * real.to(torch.int64)).to(torch.int32), best * real

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Both stages on all T + 1 token rows -> (token_ids, token_logprobs, token_counts, cif_alphas,
        cif_peaks, peak_lengths), as pipeline/families/paraformer/decoding.ParaformerOutput.from_graph reads them."""
        memory, lengths, embeddings, counts, alphas, fires, peak_lengths = self.encoder_stage(audio, audio_lengths)
        token_ids, token_logprobs = self.decoder_stage(memory, lengths, embeddings, counts)
        return token_ids, token_logprobs, counts, alphas, fires, peak_lengths

    def export_stages(self) -> tuple[nn.Module, nn.Module]:
        """The two graphs `python -m export` writes (export/onnx_export.py)."""
        return EncoderStage(self), DecoderStage(self)


class Stage(nn.Module):
    """One exported graph of a Paraformer (its weights are the model's)."""

    def __init__(self, model: Paraformer) -> None:
        super().__init__()
        self.model = model

    def half_encoder(self) -> Stage:
        self.model.half_encoder()
        return self


class EncoderStage(Stage):
    """Paraformer.encoder_stage as a module to export: audio and lengths in, free `batch` and `samples`."""

    def onnx_signature(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return PARAFORMER_INPUT_NAMES, PARAFORMER_ENCODER_OUTPUT_NAMES

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.model.encoder_stage(audio, audio_lengths)


class DecoderStage(Stage):
    """Paraformer.decoder_stage as a module to export: free `batch`, `frames` and `tokens`."""

    EXAMPLE_FRAMES, EXAMPLE_TOKENS = 84, 40  # distinct, so the exporter cannot tie the two axes together

    def onnx_signature(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return PARAFORMER_DECODER_INPUT_NAMES, PARAFORMER_DECODER_OUTPUT_NAMES

    def onnx_example(self) -> tuple[torch.Tensor, ...]:
        size, dtype = self.model.dims.output_size, self.model.decoder.output_layer.weight.dtype
        return (torch.zeros(1, self.EXAMPLE_FRAMES, size, dtype=dtype), torch.full((1,), 60, dtype=torch.int32),
                torch.zeros(1, self.EXAMPLE_TOKENS, size, dtype=dtype), torch.full((1,), 20, dtype=torch.int32))

    def forward(self, encoder_out: torch.Tensor, encoder_lengths: torch.Tensor, token_embeddings: torch.Tensor,
                token_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # the graph's input names
        return self.model.decoder_stage(encoder_out, encoder_lengths, token_embeddings, token_counts)
