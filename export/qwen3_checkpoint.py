"""A released Qwen3-ASR checkpoint directory (Hugging Face's Qwen/Qwen3-ASR-0.6B layout) as our model.

    config.json              thinker_config.audio_config and .text_config: the dimensions
    model.safetensors        the weights (bf16), keys `thinker.audio_tower.*`, `thinker.model.*`,
                             `thinker.lm_head.weight`; or model.safetensors.index.json and its shards
    vocab.json               the byte-level BPE vocabulary (token text -> id)
    tokenizer_config.json    added_tokens_decoder: the special tokens (<|im_start|>, <|audio_pad|>, <asr_text>, ...)
tokens.txt gets one line per id of the model's vocabulary (ids no tokenizer file names: "<|unused{id}|>").
The prompt's ids (the chat template around the audio) are looked up by their text, so a checkpoint whose
tokenizer numbers them differently still gets the right prompt; a missing one is a ValueError.
merges.txt is not needed: serving only turns ids into text, and the forced-language prompts are whole
tokens looked up by text (forced_languages).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.qwen3_text import ASR_TEXT_TAG, LANGUAGE_CODES

CONFIG_FILE, VOCAB_FILE, TOKENIZER_CONFIG_FILE = "config.json", "vocab.json", "tokenizer_config.json"
WEIGHTS_FILE, WEIGHTS_INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
# The chat template (models/qwen3_asr.py PromptTokens) by token text; "Ċ" is byte-level BPE's "\n".
PROMPT_PREFIX = ("<|im_start|>", "system", "Ċ", "<|im_end|>", "Ċ", "<|im_start|>", "user", "Ċ", "<|audio_start|>")
PROMPT_SUFFIX = ("<|audio_end|>", "<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ")
AUDIO_TOKEN, EOS_TOKENS = "<|audio_pad|>", ("<|im_end|>", "<|endoftext|>")
LANGUAGE_WORD = "language"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path.parent} is not a Qwen3-ASR checkpoint: no {path.name}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None


def read_vocabulary(directory: Path) -> dict[str, int]:
    """Token text -> id: vocab.json plus the added tokens of tokenizer_config.json."""
    vocab = dict(read_json(directory / VOCAB_FILE))
    added = read_json(directory / TOKENIZER_CONFIG_FILE).get("added_tokens_decoder", {})
    vocab.update({entry["content"]: int(i) for i, entry in added.items()})
    return vocab


def token_list(vocab: dict[str, int], size: int) -> list[str]:
    tokens = [f"<|unused{i}|>" for i in range(size)]
    for text, i in vocab.items():
        if not 0 <= i < size:
            raise ValueError(f"token {text!r} has id {i}, outside the model's vocabulary of {size}")
        if "\n" in text:
            raise ValueError(f"token {i} contains a newline (not byte-level BPE)")
        tokens[i] = text
    return tokens


def forced_languages(vocab: dict[str, int]) -> dict[str, list[int]]:
    """Language code -> the ids of "language <Name><asr_text>" (the reference's forced-language suffix), for
    each language whose name is one token of this vocabulary (as the pre-tokenizer splits " <Name>", so BPE
    gives that token; without merges.txt a name of several tokens could not be split faithfully: left out)."""
    if LANGUAGE_WORD not in vocab or ASR_TEXT_TAG not in vocab:
        return {}
    return {code: [vocab[LANGUAGE_WORD], vocab["Ġ" + name.capitalize()], vocab[ASR_TEXT_TAG]]
            for name, code in LANGUAGE_CODES.items() if "Ġ" + name.capitalize() in vocab}


def prompt_ids(vocab: dict[str, int]) -> dict:
    missing = sorted({*PROMPT_PREFIX, *PROMPT_SUFFIX, AUDIO_TOKEN, *EOS_TOKENS} - set(vocab))
    if missing:
        raise ValueError(f"the tokenizer lacks the prompt's tokens {', '.join(missing)}")
    return {"prefix": [vocab[t] for t in PROMPT_PREFIX], "suffix": [vocab[t] for t in PROMPT_SUFFIX],
            "audio_token_id": vocab[AUDIO_TOKEN], "eos_token_ids": [vocab[t] for t in EOS_TOKENS],
            "languages": forced_languages(vocab)}


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as stored (bf16 in the releases). Not converted here: loading copies
    each into the model's float32 parameter, so the weights are held in float32 once (plus the bf16 copy
    until it is dropped), not twice (9.4 GB more for the 1.7B model)."""
    from safetensors.torch import load_file

    if (directory / WEIGHTS_INDEX_FILE).is_file():
        shards = sorted(set(read_json(directory / WEIGHTS_INDEX_FILE)["weight_map"].values()))
    elif (directory / WEIGHTS_FILE).is_file():
        shards = [WEIGHTS_FILE]
    else:
        raise ValueError(f"{directory} is not a Qwen3-ASR checkpoint: no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            state.update(load_file(str(directory / shard)))
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError and OSError
            raise ValueError(f"{directory / shard}: not readable safetensors ({exc})") from None
    return state


def checkpoint_model(directory: Path):
    """(model, tokens) of a released checkpoint directory; ValueError when it is not one."""
    from models.qwen3_asr import Qwen3ASR, Qwen3ASRDimensions, load_qwen3_state

    thinker = read_json(directory / CONFIG_FILE).get("thinker_config")
    if not isinstance(thinker, dict) or "audio_config" not in thinker or "text_config" not in thinker:
        raise ValueError(f"{directory / CONFIG_FILE}: no thinker_config with audio_config and text_config "
                         "(not a Qwen3-ASR checkpoint)")
    vocab, state = read_vocabulary(directory), read_weights(directory)
    text = dict(thinker["text_config"])
    # A checkpoint without an lm_head tensor ties it to the embedding; with one, it is loaded as given.
    text["tie_word_embeddings"] = "thinker.lm_head.weight" not in state
    dims = Qwen3ASRDimensions.from_dict({"audio": thinker["audio_config"], "text": text, "prompt": prompt_ids(vocab)})
    model = Qwen3ASR(dims).eval()
    try:
        load_qwen3_state(model, state)  # bf16 -> the float32 parameters, exactly
        del state
    except (KeyError, RuntimeError) as exc:
        raise ValueError(f"{directory}: the weights do not fit Qwen3-ASR at {dims.text.hidden_size} x "
                         f"{dims.text.num_hidden_layers} ({exc})") from None
    return model, token_list(vocab, dims.text.vocab_size)
