"""FunASR's CT-Transformer punctuation model (`ct-punc`) as a paddable PyTorch model on fixed token shapes.

The state_dict is exactly FunASR's `CTTransformer` (funasr/models/ct_transformer/model.py): `embed` (the
vocabulary's embeddings), `encoder` (a SANMEncoder with input_layer "pe": models/paraformer.py's, the same
SAN-M layers as SenseVoice's) and `decoder` (a Linear to the punctuation classes). FunASR's `punc_forward`
is embed -> encoder -> decoder; its `inference` takes each token's argmax class.

Paddable like every model here: token ids padded to a container plus the valid count in. The ids past the
count are multiplied to 0 before the embedding lookup (any garbage there, even an id past the vocabulary,
reads row 0), the time mask comes from a cumsum of ones, the encoder masks every layer and its attention
additively, and every weight MatMul's input is masked, so a sentence padded gives what it gives alone
(int8 included: padded rows are exactly zero where dynamic quantisation measures its ranges).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.modeldir import PUNCTUATION_INPUT_NAMES, PUNCTUATION_OUTPUT_NAMES

from .paraformer import LAYER_NORM_EPS, SANMEncoder

# FunASR's punctuation classes (a release's config.yaml model_conf.punc_list, whose full-width marks
# CTTransformer.inference compares with): 1 "_" is none, 3 "。" ends a sentence (sentence_end_id). A checkpoint's
# own list replaces it on export.
RELEASED_PUNCTUATION = ("<unk>", "_", "，", "。", "？", "、")


@dataclass(frozen=True)
class CTPuncDimensions:
    """CT-Transformer geometry and classes; travels with the model in manifest.json."""

    vocab_size: int = 272727
    embed_unit: int = 256  # the embeddings' width: the encoder's input_size
    output_size: int = 256  # FunASR's att_unit: the encoder's width
    attention_heads: int = 8
    linear_units: int = 1024
    num_blocks: int = 4  # encoders0 (1 layer) + encoders (num_blocks - 1)
    kernel_size: int = 11
    sanm_shift: int = 0
    punc_list: tuple[str, ...] = RELEASED_PUNCTUATION  # class id -> its punctuation ("_": none)
    sentence_end_id: int = 3  # the class FunASR writes where it ends a text or cuts a long one

    def __post_init__(self) -> None:
        object.__setattr__(self, "punc_list", tuple(self.punc_list))  # a list from JSON
        if self.output_size % self.attention_heads or self.embed_unit % 2 or self.embed_unit < 4:
            raise ValueError(f"invalid model dimensions: {self} (heads must divide output_size; the sinusoid "
                             "positions need an even embed_unit of at least 4)")
        if self.num_blocks < 1 or self.kernel_size < 1 or self.vocab_size < 2 or len(self.punc_list) < 2:
            raise ValueError(f"invalid model dimensions: {self}")
        if not 0 <= self.sentence_end_id < len(self.punc_list):
            raise ValueError(f"sentence_end_id {self.sentence_end_id} is not a class of {list(self.punc_list)}")

    @property
    def input_size(self) -> int:
        """The encoder's input width (SANMEncoder reads it)."""
        return self.embed_unit

    @property
    def classes(self) -> int:
        return len(self.punc_list)

    @classmethod
    def preset(cls, name: str) -> CTPuncDimensions:
        try:
            return cls(**PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown model size {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_dict(cls, data: dict) -> CTPuncDimensions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"punc_list": list(self.punc_list)}


PRESETS: dict[str, dict] = {
    "full": {},  # the 272,727-word ct-punc-c's geometry (FunASR's ct_transformer/template.yaml): 4 blocks of 256
    "tiny": dict(vocab_size=96, embed_unit=32, output_size=32, attention_heads=4, linear_units=64, num_blocks=2),
}


class CTTransformer(nn.Module):
    """forward(token_ids int [B, T], token_lengths int [B]) -> punc_logits float32 [B, T, classes], zero past
    each row's length. The ids past a length may hold anything."""

    def __init__(self, dims: CTPuncDimensions) -> None:
        super().__init__()
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab_size, dims.embed_unit)
        self.encoder = SANMEncoder(dims, LAYER_NORM_EPS)
        self.decoder = nn.Linear(dims.output_size, dims.classes)

    def onnx_signature(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return PUNCTUATION_INPUT_NAMES, PUNCTUATION_OUTPUT_NAMES

    def forward(self, token_ids: torch.Tensor, token_lengths: torch.Tensor) -> torch.Tensor:
        positions = torch.ones_like(token_ids, dtype=torch.int64).cumsum(1)  # 1-based, never arange().view()
        valid = (positions <= token_lengths.to(torch.int64)[:, None]).to(torch.int64)  # [B, T]
        x = self.embed(token_ids.to(torch.int64) * valid)
        mask = valid.to(x.dtype)[:, :, None]
        hidden = self.encoder(x * mask, mask)
        return self.decoder(hidden) * mask
