"""A released Qwen3-ASR checkpoint directory (Hugging Face's Qwen/Qwen3-ASR-0.6B layout) as our model.

    config.json              thinker_config.audio_config and .text_config: the dimensions
    model.safetensors        the weights (bf16), keys `thinker.audio_tower.*`, `thinker.model.*`,
                             `thinker.lm_head.weight`; or model.safetensors.index.json and its shards
    vocab.json               the byte-level BPE vocabulary (token text -> id)
    merges.txt               the BPE merges: copied into the model directory, to encode a context
                             (hotwords) for the prompt (pipeline/families/qwen3_asr/bpe.py), and here each language's
                             forced prompt; without it the export serves, takes no hotwords, and forces
                             only the languages whose name is one token
    tokenizer_config.json    added_tokens_decoder: the added tokens (<|im_start|>, <|audio_pad|>, <asr_text>, ...),
                             each "special" or not
tokens.txt gets one line per id of the model's vocabulary (ids no tokenizer file names: "<|unused{id}|>").
The prompt's ids (the chat template around the audio) are looked up by their text, so a checkpoint whose
tokenizer numbers them differently still gets the right prompt; a missing one is a ValueError. The
manifest also records the added ids and the ids the reference writes as nothing (special_ids: its
special tokens and the nameless ids; it decodes with skip_special_tokens).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.families.qwen3_asr.bpe import MERGES_FILE, Qwen3Tokenizer, read_merges
from pipeline.families.qwen3_asr.text import ASR_TEXT_TAG, LANGUAGE_CODES

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


def read_added_tokens(directory: Path) -> dict[int, tuple[str, bool]]:
    """tokenizer_config.json's added tokens: id -> (text, special)."""
    added = read_json(directory / TOKENIZER_CONFIG_FILE).get("added_tokens_decoder", {})
    return {int(i): (entry["content"], bool(entry.get("special", False))) for i, entry in added.items()}


def read_vocabulary(directory: Path) -> dict[str, int]:
    """Token text -> id: vocab.json plus the added tokens of tokenizer_config.json."""
    vocab = dict(read_json(directory / VOCAB_FILE))
    vocab.update({text: i for i, (text, _) in read_added_tokens(directory).items()})
    return vocab


def tokenizer_ids(vocab: dict[str, int], added: dict[int, tuple[str, bool]], size: int) -> dict[str, list[int]]:
    """The added ids, and the ids the reference writes as nothing: its special added tokens and the ids of the
    model's vocabulary that no tokenizer file names (its decode skips those too)."""
    named = set(vocab.values()) | set(added)
    nameless = [i for i in range(size) if i not in named]
    return {"added_ids": sorted(added), "special_ids": sorted([i for i, (_, special) in added.items() if special]
                                                              + nameless)}


def token_list(vocab: dict[str, int], size: int) -> list[str]:
    tokens = [f"<|unused{i}|>" for i in range(size)]
    for text, i in vocab.items():
        if not 0 <= i < size:
            raise ValueError(f"token {text!r} has id {i}, outside the model's vocabulary of {size}")
        if "\n" in text:
            raise ValueError(f"token {i} contains a newline (not byte-level BPE)")
        tokens[i] = text
    return tokens


def forced_languages(vocab: dict[str, int], tokenizer: Qwen3Tokenizer | None = None) -> dict[str, list[int]]:
    """Language code -> the ids of "language <Name><asr_text>" (the reference's forced-language suffix). With
    the checkpoint's merges (`tokenizer`) every language, its name encoded as the reference's tokenizer does
    (the newline before "language" is a piece of its own, so the text alone gives the same ids); without,
    each language whose name is one token (" <Name>", as the pre-tokenizer splits it): a name of several
    tokens could not be split faithfully and is left out."""
    if LANGUAGE_WORD not in vocab or ASR_TEXT_TAG not in vocab:
        return {}
    if tokenizer is not None:
        return {code: [*tokenizer.encode(f"{LANGUAGE_WORD} {name.capitalize()}"), vocab[ASR_TEXT_TAG]]
                for name, code in LANGUAGE_CODES.items()}
    return {code: [vocab[LANGUAGE_WORD], vocab["Ġ" + name.capitalize()], vocab[ASR_TEXT_TAG]]
            for name, code in LANGUAGE_CODES.items() if "Ġ" + name.capitalize() in vocab}


def prompt_ids(vocab: dict[str, int], tokenizer: Qwen3Tokenizer | None = None) -> dict:
    missing = sorted({*PROMPT_PREFIX, *PROMPT_SUFFIX, AUDIO_TOKEN, *EOS_TOKENS} - set(vocab))
    if missing:
        raise ValueError(f"the tokenizer lacks the prompt's tokens {', '.join(missing)}")
    return {"prefix": [vocab[t] for t in PROMPT_PREFIX], "suffix": [vocab[t] for t in PROMPT_SUFFIX],
            "audio_token_id": vocab[AUDIO_TOKEN], "eos_token_ids": [vocab[t] for t in EOS_TOKENS],
            "languages": forced_languages(vocab, tokenizer)}


def checkpoint_tokenizer(directory: Path, added: dict[int, tuple[str, bool]]) -> Qwen3Tokenizer | None:
    """The checkpoint's BPE (vocab.json, merges.txt), None without merges.txt; ValueError when unreadable."""
    if not (directory / MERGES_FILE).is_file():
        return None
    return Qwen3Tokenizer(dict(read_json(directory / VOCAB_FILE)), read_merges(directory / MERGES_FILE),
                          (text for text, _ in added.values()))


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
    size = int(text.get("vocab_size", Qwen3ASRDimensions().text.vocab_size))
    added = read_added_tokens(directory)
    prompt = prompt_ids(vocab, checkpoint_tokenizer(directory, added)) | tokenizer_ids(vocab, added, size)
    dims = Qwen3ASRDimensions.from_dict({"audio": thinker["audio_config"], "text": text, "prompt": prompt})
    model = Qwen3ASR(dims).eval()
    try:
        load_qwen3_state(model, state)  # bf16 -> the float32 parameters, exactly
        del state
    except (KeyError, RuntimeError) as exc:
        raise ValueError(f"{directory}: the weights do not fit Qwen3-ASR at {dims.text.hidden_size} x "
                         f"{dims.text.num_hidden_layers} ({exc})") from None
    return model, token_list(vocab, dims.text.vocab_size)
