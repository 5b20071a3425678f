"""Qwen3-ASR (0.6B / 1.7B) as a paddable PyTorch model, state_dict-compatible with the released checkpoints.

The reference is the `qwen-asr` package (`qwen_asr/core/transformers_backend/`): its module tree is
`thinker.audio_tower` (models/qwen3_audio.py), `thinker.model` (models/qwen3_text.py) and
`thinker.lm_head`, and so are our state_dict keys. Input is the Whisper-style 128-bin log-mel the
reference's WhisperFeatureExtractor makes (`features`, from raw audio: models/qwen3_frontend.py), in a
container of whole 100-frame chunks, plus its valid length; three fixed-shape stages follow: `encode`, `prefill`, `step`, and `greedy_decode` drives them.

Released geometries (config.json of Qwen/Qwen3-ASR-0.6B and -1.7B on the Hugging Face hub, which this
machine cannot reach; the values as mirrored in public ports: 0.6B in the test configs of the MLX and
CoreML ports and the swift port's docs/asr-model.md (ivan-digital/qwen3-asr-swift), 1.7B in the same doc
and the CoreML port's metadata). Special token ids are Qwen2's tokenizer's, from the same sources.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from pipeline.families.qwen3_asr import decoding as qwen3_decoding

from .qwen3_audio import AudioEncoder, audio_token_lengths
from .qwen3_frontend import WhisperLogMel
from .qwen3_text import TextModel



@dataclass(frozen=True)
class AudioDimensions:
    num_mel_bins: int = 128
    d_model: int = 896
    encoder_layers: int = 18
    encoder_attention_heads: int = 14
    encoder_ffn_dim: int = 3584
    output_dim: int = 1024
    downsample_hidden_size: int = 480
    n_window: int = 50  # a conv chunk is 2 * n_window mel frames
    n_window_infer: int = 800  # an attention window is n_window_infer mel frames
    max_source_positions: int = 1500

    def __post_init__(self) -> None:
        if self.d_model % self.encoder_attention_heads or self.n_window_infer % (2 * self.n_window):
            raise ValueError(f"invalid audio dimensions: {self}")

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def tokens_per_chunk(self) -> int:
        tokens = self.chunk_frames
        for _ in range(3):
            tokens = (tokens - 1) // 2 + 1
        return tokens

    @property
    def window_tokens(self) -> int:
        return self.tokens_per_chunk * (self.n_window_infer // self.chunk_frames)


@dataclass(frozen=True)
class TextDimensions:
    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads or self.head_dim % 2:
            raise ValueError(f"invalid text dimensions: {self}")


@dataclass(frozen=True)
class PromptTokens:
    """The chat template around the audio, as token ids: `prefix`, the audio placeholders, `suffix`
    ("<|im_start|>system\\n<|im_end|>\\n<|im_start|>user\\n<|audio_start|>" ... "<|audio_end|><|im_end|>\\n
    <|im_start|>assistant\\n"), and the ids that end decoding (<|im_end|>, <|endoftext|>)."""

    prefix: tuple[int, ...] = (151644, 8948, 198, 151645, 198, 151644, 872, 198, 151669)
    suffix: tuple[int, ...] = (151670, 151645, 198, 151644, 77091, 198)
    audio_token_id: int = 151676
    eos_token_ids: tuple[int, ...] = (151645, 151643)
    # Language code -> the ids of "language <Name><asr_text>", which the reference appends to the prompt to
    # force that language (its output is then the text alone); from the checkpoint's tokenizer.
    languages: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # A context (hotwords) goes into the system turn, as the reference's transcribe(context=...) puts it:
    # prefix[1:context_at] is that turn's text ("system\n"), encoded again together with the context.
    context_at: int = 3
    # Prompt slots the export keeps for a context's tokens, so that a prompt with one keeps the fixed shape.
    context_tokens: int = 0
    # The tokenizer's added tokens (never a merge's result; a context may not contain them), and the ids the
    # reference writes as nothing (its special tokens and ids it names no token for: skip_special_tokens).
    added_ids: tuple[int, ...] = ()
    special_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Qwen3ASRDimensions:
    audio: AudioDimensions = field(default_factory=AudioDimensions)
    text: TextDimensions = field(default_factory=TextDimensions)
    prompt: PromptTokens = field(default_factory=PromptTokens)

    @classmethod
    def preset(cls, name: str) -> Qwen3ASRDimensions:
        try:
            return cls.from_dict(PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown Qwen3-ASR size {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_dict(cls, data: dict) -> Qwen3ASRDimensions:
        def build(kind, values):
            known = {f.name for f in dataclasses.fields(kind)}
            return kind(**{k: tuple(v) if isinstance(v, list) else
                           {code: tuple(ids) for code, ids in v.items()} if isinstance(v, dict) else v
                           for k, v in values.items() if k in known})

        return cls(build(AudioDimensions, data.get("audio", {})), build(TextDimensions, data.get("text", {})),
                   build(PromptTokens, data.get("prompt", {})))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict] = {
    "0.6b": {},
    # The 1.7B release stores its lm_head beside the embedding (708 tensors, 2,349,217,408 parameters, as
    # public projects pin them), which the checkpoint loader keeps apart: so does this preset, so its
    # export is the size (and needs the memory) of the release's.
    "1.7b": {
        "audio": dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096, output_dim=2048),
        "text": dict(hidden_size=2048, intermediate_size=6144, tie_word_embeddings=False),
    },
    # Tests and fixtures: the real 128 bins, 100-frame chunks and 13 tokens a chunk, 2-chunk windows.
    "tiny": {
        "audio": dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, output_dim=48,
                      downsample_hidden_size=8, n_window_infer=200),
        "text": dict(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, rope_theta=10000.0, tie_word_embeddings=False),
        "prompt": dict(prefix=(250, 10, 13, 251, 13, 250, 11, 13, 253), suffix=(254, 251, 13, 250, 12, 13),
                       audio_token_id=255, eos_token_ids=(251, 252)),  # languages: export/qwen3_asr.py's synthetic
    },
}


class Thinker(nn.Module):
    def __init__(self, dims: Qwen3ASRDimensions) -> None:
        super().__init__()
        self.audio_tower = AudioEncoder(dims.audio)
        self.model = TextModel(dims.text)
        self.lm_head = nn.Linear(dims.text.hidden_size, dims.text.vocab_size, bias=False)
        if dims.text.tie_word_embeddings:  # one tensor, as in the reference (both keys in the state_dict)
            self.lm_head.weight = self.model.embed_tokens.weight


class Qwen3ASR(nn.Module):
    def __init__(self, dims: Qwen3ASRDimensions) -> None:
        super().__init__()
        self.dims = dims
        self.frontend = WhisperLogMel(dims.audio.num_mel_bins)  # constants only: the state_dict stays the reference's
        self.thinker = Thinker(dims)

    def features(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio [B, N] (N a whole number of seconds, so the mel is whole 100-frame chunks), valid samples [B]
        -> (log-mel [B, n_mels, N / 160], mel lengths [B])."""
        return self.frontend(audio, audio_lengths)

    def encode(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, n_mels, C * 100], mel_lengths [B] -> (audio embeddings [B, C * 13, H], token lengths [B])."""
        return self.thinker.audio_tower(mel.to(self.thinker.lm_head.weight.dtype), mel_lengths)

    def half_model(self) -> Qwen3ASR:
        """This model with the audio tower, the LLM and its head in fp16 (the GPU graphs); the log-mel (its
        power spectra pass fp16's 65504), the RoPE angles and the logits stay float32."""
        self.thinker.half()
        self.thinker.model.inv_freq = self.thinker.model.inv_freq.float()
        return self

    def prefill(self, prompt_ids, prompt_lengths, audio_embeds):
        """prompt_ids [B, P] (audio placeholders in place, padded past prompt_lengths), audio_embeds
        [B, A, H] -> (logits [B, V] of the last valid token, keys, values [layers, B, kv, P, hd])."""
        text = self.thinker.model
        embeds = text.prompt_embeddings(prompt_ids, audio_embeds, self.dims.prompt.audio_token_id)
        hidden, keys, values = text.prefill(embeds, prompt_lengths)
        return self.thinker.lm_head(hidden).float(), keys, values

    def step(self, token_ids, positions, cache_keys, cache_values):
        hidden, keys, values = self.thinker.model.step(token_ids, positions, cache_keys, cache_values)
        return self.thinker.lm_head(hidden).float(), keys, values

    def prompt_ids(self, token_lengths: torch.Tensor, prompt_slots: int,
                   language: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The template around `token_lengths` audio placeholders, padded to prompt_slots: (ids, lengths)."""
        return build_prompt_ids(self.dims, [int(n) for n in token_lengths], prompt_slots, language)

    @torch.no_grad()
    def greedy_decode(self, mel, mel_lengths, max_new_tokens: int, cache_slots: int | None = None,
                      language: str | None = None) -> list[list[int]]:
        """Greedy tokens for each row at fixed shapes: prompt slots for a full container, and a cache of
        `cache_slots` (default: prompt slots + max_new_tokens). Stops a row at an end-of-text id.
        `language`: forced, as the reference's transcribe(language=...)."""
        embeds, token_lengths = self.encode(mel, mel_lengths)
        prompt_slots = prompt_capacity(self.dims, embeds.shape[1])
        ids, lengths = self.prompt_ids(token_lengths, prompt_slots, language)
        logits, keys, values = self.prefill(ids, lengths, embeds)
        cache_slots = cache_slots or prompt_slots + max_new_tokens
        shape = list(keys.shape)
        shape[3] = cache_slots
        cache_keys, cache_values = keys.new_zeros(shape), values.new_zeros(shape)
        cache_keys[:, :, :, :prompt_slots], cache_values[:, :, :, :prompt_slots] = keys, values
        positions = lengths.clone()
        tokens: list[list[int]] = [[] for _ in range(mel.shape[0])]
        done = [False] * mel.shape[0]
        eos = set(self.dims.prompt.eos_token_ids)
        for _ in range(max_new_tokens):
            next_ids = logits.argmax(-1)
            for row, token in enumerate(next_ids.tolist()):
                done[row] = done[row] or token in eos
                if not done[row]:
                    tokens[row].append(token)
            if all(done) or int(positions.max()) >= cache_slots:
                break
            logits, keys, values = self.step(next_ids[:, None], positions, cache_keys, cache_values)
            rows = torch.arange(mel.shape[0])
            cache_keys[:, rows, :, positions] = keys[:, :, :, 0].transpose(0, 1)
            cache_values[:, rows, :, positions] = values[:, :, :, 0].transpose(0, 1)
            positions = positions + 1
        return tokens


def prompt_capacity(dims: Qwen3ASRDimensions, audio_slots: int) -> int:
    """Prompt slots for a container of `audio_slots` audio tokens (and the longest forced language): the
    serving pipeline's own count, so the export and the server agree."""
    return qwen3_decoding.prompt_capacity(dataclasses.asdict(dims.prompt), audio_slots)


def build_prompt_ids(dims: Qwen3ASRDimensions, token_lengths: list[int], prompt_slots: int,
                     language: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt as the serving pipeline builds it (pipeline/families/qwen3_asr/decoding.py prompt_ids): ids
    [B, prompt_slots], lengths [B]."""
    rows = [qwen3_decoding.prompt_ids(dataclasses.asdict(dims.prompt), count, prompt_slots, language)
            for count in token_lengths]
    return (torch.from_numpy(np.concatenate([ids for ids, _ in rows])),
            torch.tensor([length for _, length in rows], dtype=torch.int64))


def load_qwen3_state(model: Qwen3ASR, state: dict[str, torch.Tensor]) -> None:
    """Load a released checkpoint's tensors strictly; a tied lm_head may be absent (it is the embedding)."""
    from .sensevoice import load_state_strict

    state = dict(state)
    if "thinker.lm_head.weight" not in state and model.dims.text.tie_word_embeddings:
        if "thinker.model.embed_tokens.weight" in state:
            state["thinker.lm_head.weight"] = state["thinker.model.embed_tokens.weight"]
    load_state_strict(model, state)


__all__ = ["Qwen3ASR", "Qwen3ASRDimensions", "audio_token_lengths", "load_qwen3_state", "PRESETS"]
