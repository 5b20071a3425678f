"""The tiny Qwen3-ASR fixture (tests/fixtures/qwen3, the `qwen-asr` package's model on random weights) in the
layout Qwen releases Qwen3-ASR-0.6B in: config.json with a thinker_config, model.safetensors with `thinker.*`
keys, vocab.json, merges.txt and tokenizer_config.json's added tokens.

Its tokenizer is a small byte-level BPE in the real one's form, at the tiny preset's ids: the template's
words where the fixture's prompt has them (10 "system", 11 "user", 12 "assistant", 13 "Ċ"), "language" and
" English", " Chinese" (" Cantonese" is two tokens, " Cant" + "onese"), each built by merges from single
bytes; the other ids are the printable ASCII bytes, space, newline and tab (so any
ASCII text is spelled), then words whose merges the hotword tests use; ids 249-255 are the added tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "qwen3"
CONFIG = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
SPECIAL = {249: "<asr_text>", 250: "<|im_start|>", 251: "<|im_end|>", 252: "<|endoftext|>", 253: "<|audio_start|>",
           254: "<|audio_end|>", 255: "<|audio_pad|>"}  # the tiny preset's prompt ids (models/qwen3_asr.py)
WORDS = {10: "system", 11: "user", 12: "assistant", 13: "Ċ", 20: "language", 21: "ĠEnglish", 22: "ĠChinese",
         23: "ĠCant", 24: "onese"}
MORE_WORDS = ("Ġlights", "Ġturn", "Ġon", "Ġthe", "Ġkitchen")  # hotwords with tokens of their own
BYTES = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "ĉ"]  # (Ċ is id 13)


def tiny_tokenizer() -> tuple[dict[str, int], list[str]]:
    """(vocab.json, merges in rank order): every word of WORDS and MORE_WORDS merged from its first two
    characters on, left to right."""
    vocab = {text: i for i, text in WORDS.items()}
    free = (i for i in range(249) if i not in WORDS)
    merges: list[str] = []
    for char in BYTES:
        vocab[char] = next(free)
    for word in [w for w in WORDS.values() if len(w) > 1] + list(MORE_WORDS):
        for end in range(2, len(word) + 1):
            left, right, whole = word[: end - 1], word[end - 1], word[:end]
            if f"{left} {right}" not in merges:
                merges.append(f"{left} {right}")
            if whole not in vocab:
                vocab[whole] = next(free)
    for i in free:
        vocab[f"<unused{i}>"] = i
    return vocab, merges


def released_files() -> dict[str, bytes]:
    """The tiny reference model as Qwen lays out Qwen3-ASR-0.6B (weights in float32 here, bf16 there)."""
    import torch
    from safetensors.torch import save

    dims = CONFIG["dims"]
    config = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
              "thinker_config": {"audio_config": dims["audio"], "text_config": dims["text"],
                                 "audio_token_id": dims["prompt"]["audio_token_id"]}}
    state = torch.load(FIXTURE / "model.pt", map_location="cpu", weights_only=True)
    vocab, merges = tiny_tokenizer()
    added = {str(i): {"content": text, "special": text != "<asr_text>"} for i, text in SPECIAL.items()}
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(state),
            "vocab.json": json.dumps(vocab).encode(), "merges.txt": "\n".join(["#version: 0.2", *merges, ""]).encode(),
            "tokenizer_config.json": json.dumps({"added_tokens_decoder": added}).encode()}
