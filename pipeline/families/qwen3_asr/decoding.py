"""Qwen3-ASR's three graphs (encoder, prefill, step) driven at fixed shapes: audio in, greedy tokens out.

numpy and onnxruntime only. Every call runs at shapes fixed by the container: the encoder at its samples,
prefill at `prompt_slots`, each step at `cache_slots`; or, where `prompt_step` and `cache_step` are set
(the CPU, whose sessions compile nothing per shape), prefill over the prompt rounded up to whole
`prompt_step`s and each step over the cache slots in use rounded up to whole `cache_step`s: their cost
grows with those lengths, and their logits do not depend on them (padding invariance, `verify`). The
prompt is the chat template around as many audio placeholders as the clip has audio tokens (a context's
tokens in its system turn, within the room the export keeps: pipeline/families/qwen3_asr/context.py), padded to
`prompt_slots`; the step's keys and values go to cache slot `position` here on the host (the graph returns
them; no in-graph scatter). Decoding stops at an end-of-text id, at `max_new_tokens`, or when the cache is
full.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ...audio import SAMPLE_RATE

ENCODER, PREFILL, STEP = "encoder", "prefill", "step"
GRAPHS = (ENCODER, PREFILL, STEP)
CONTEXT_AT = 3  # models/qwen3_asr.py PromptTokens.context_at, for manifests written before it


@dataclass(frozen=True)
class Qwen3Shapes:
    """The fixed shapes a model directory serves at (manifest dimensions["shapes"])."""

    container_samples: int
    prompt_slots: int
    cache_slots: int
    max_new_tokens: int
    cache_step: int = 0  # > 0: the cache grows in steps of this many slots up to cache_slots; 0: all from the start
    prompt_step: int = 0  # > 0: prefill runs over the prompt rounded up to this many slots; 0: all prompt_slots

    def cache_size(self, position: int) -> int:
        """The cache slots a step at `position` runs over: room for its own keys and values."""
        if not self.cache_step:
            return self.cache_slots
        return min(self.cache_slots, round_up(position + 1, self.cache_step))

    def prompt_size(self, length: int) -> int:
        """The prompt slots prefill runs over for a prompt of `length` tokens."""
        if not self.prompt_step:
            return self.prompt_slots
        return min(self.prompt_slots, round_up(length, self.prompt_step))

    @classmethod
    def from_dimensions(cls, dimensions: dict) -> Qwen3Shapes:
        return cls(**dimensions["shapes"])


def round_up(count: int, step: int) -> int:
    return -(-count // step) * step


@dataclass(frozen=True)
class Qwen3Result:
    tokens: list[int]
    audio_tokens: int
    first_logits: np.ndarray  # prefill's logits [V] (for verification)
    step_logits: list[np.ndarray]  # each step's logits [V]


def window_geometry(dims: dict) -> tuple[int, int]:
    """(samples, audio tokens) of one attention window, from the manifest's dimensions."""
    chunk_frames = tokens = 2 * dims["audio"]["n_window"]
    for _ in range(3):  # three stride-2 convolutions
        tokens = (tokens - 1) // 2 + 1
    window_tokens = tokens * (dims["audio"]["n_window_infer"] // chunk_frames)
    return dims["audio"]["n_window_infer"] * SAMPLE_RATE // 100, window_tokens  # 100 mel frames a second


def audio_slots(dims: dict, shapes: Qwen3Shapes) -> int:
    """The encoder's output rows for the container (whole windows of audio tokens)."""
    window, window_tokens = window_geometry(dims)
    return shapes.container_samples // window * window_tokens


def rung_shapes(dims: dict, windows: int) -> Qwen3Shapes:
    """The shapes of a container of `windows` attention windows: the prompt holds exactly their audio
    tokens, the cache that prompt and the manifest's max_new_tokens (the manifest's own shapes at its
    container)."""
    window, window_tokens = window_geometry(dims)
    top, prompt = Qwen3Shapes.from_dimensions(dims), prompt_capacity(dims["prompt"], windows * window_tokens)
    return Qwen3Shapes(windows * window, prompt, prompt + top.max_new_tokens, top.max_new_tokens)


def serving_overrides(dims: dict, shapes: Qwen3Shapes | None = None) -> dict[str, dict[str, int]]:
    """Graph -> the sizes of its free axes at `shapes` (default: the manifest's), every axis fixed as a GPU
    compiles it (`shapes`' prompt_step and cache_step are the CPU's, whose sessions keep their axes free;
    the encoder's axis is named by torch.export as "<window samples>*windows" and is fixed at the
    container's samples)."""
    shapes = shapes or Qwen3Shapes.from_dimensions(dims)
    window, _ = window_geometry(dims)
    return {ENCODER: {f"{window}*windows": shapes.container_samples},
            PREFILL: {"prompt": shapes.prompt_slots, "audio_tokens": audio_slots(dims, shapes)},
            STEP: {"cache": shapes.cache_slots}}


def forced_language_ids(prompt: dict, language: str | None) -> list[int]:
    """The ids that tell the model `language` ("language <Name><asr_text>"; None: none, it names it)."""
    if language is None:
        return []
    known = prompt.get("languages", {})
    if language not in known:
        raise ValueError(f"the model cannot be told the language {language!r} (it knows "
                         f"{', '.join(sorted(known)) or 'none'})")
    return list(known[language])


def prompt_capacity(prompt: dict, audio_tokens: int) -> int:
    """Prompt slots for `audio_tokens` audio placeholders, the longest forced language and the room kept for
    a context (prompt: the manifest's dimensions["prompt"], or models/qwen3_asr.py PromptTokens as a dict)."""
    forced = max(map(len, prompt.get("languages", {}).values()), default=0)
    return len(prompt["prefix"]) + audio_tokens + len(prompt["suffix"]) + forced + prompt.get("context_tokens", 0)


def prompt_prefix(prompt: dict, system: Sequence[int] | None = None) -> list[int]:
    """The template's ids before the audio; `system`: the ids of the system turn's text with a context
    (pipeline/families/qwen3_asr/context.py), in place of the text alone (prefix[1:context_at])."""
    if system is None:
        return list(prompt["prefix"])
    return [prompt["prefix"][0], *system, *prompt["prefix"][prompt.get("context_at", CONTEXT_AT):]]


def prompt_length(prompt: dict, audio_tokens: int, language: str | None = None,
                  system: Sequence[int] | None = None) -> int:
    """The tokens of prompt_ids' prompt, without building it."""
    return (len(prompt_prefix(prompt, system)) + audio_tokens + len(prompt["suffix"])
            + len(forced_language_ids(prompt, language)))


def prompt_ids(prompt: dict, audio_tokens: int, slots: int, language: str | None = None,
               system: Sequence[int] | None = None) -> tuple[np.ndarray, int]:
    """The template (with a context's `system` ids, prompt_prefix) around `audio_tokens` placeholders, then
    the forced language's ids if any, padded to `slots`: (ids int64 [1, slots], length)."""
    ids = [*prompt_prefix(prompt, system), *([prompt["audio_token_id"]] * audio_tokens), *prompt["suffix"],
           *forced_language_ids(prompt, language)]
    if len(ids) > slots:
        raise ValueError(f"a prompt of {len(ids)} tokens does not fit {slots} prompt slots")
    padded = np.full((1, slots), prompt["eos_token_ids"][-1], dtype=np.int64)
    padded[0, : len(ids)] = ids
    return padded, len(ids)


def grown(cache: np.ndarray, slots: int) -> np.ndarray:
    """`cache` [layers, B, kv, S, hd] in a zeroed cache of `slots` slots (its first ones, if it is larger)."""
    shape = list(cache.shape)
    shape[3] = slots
    out = np.zeros(shape, cache.dtype)  # fp16 too
    kept = min(slots, cache.shape[3])
    out[:, :, :, :kept] = cache[:, :, :, :kept]
    return out


class Qwen3Decoder:
    """sessions: {"encoder", "prefill", "step"} -> onnxruntime.InferenceSession; prompt: manifest
    dimensions["prompt"]; shapes: the fixed shapes every call runs at."""

    def __init__(self, sessions: dict, prompt: dict, shapes: Qwen3Shapes) -> None:
        self.sessions, self.prompt, self.shapes = sessions, prompt, shapes
        self.eos = set(prompt["eos_token_ids"])

    def decode(self, audio: np.ndarray, max_new_tokens: int | None = None, language: str | None = None,
               system: Sequence[int] | None = None) -> Qwen3Result:
        """Greedy tokens of one clip (float32 [n] in [-1, 1], n <= container) at the fixed shapes; `language`
        forces the language (forced_language_ids), `system` puts a context into the prompt (prompt_prefix)."""
        shapes = self.shapes
        if len(audio) > shapes.container_samples:
            raise ValueError(f"{len(audio) / SAMPLE_RATE:g} s of audio exceeds the "
                             f"{shapes.container_samples / SAMPLE_RATE:g} s container")
        container = np.zeros((1, shapes.container_samples), dtype=np.float32)
        container[0, : len(audio)] = audio
        return self.decode_container(container, len(audio), max_new_tokens, language=language, system=system)

    def decode_container(self, container: np.ndarray, valid: int, max_new_tokens: int | None = None,
                         prompt_slots: int | None = None, cache_slots: int | None = None,
                         ignore_eos: bool = False, language: str | None = None,
                         system: Sequence[int] | None = None, forced_tokens: list[int] | None = None) -> Qwen3Result:
        """As decode, for a container [1, samples] already filled (what lies past `valid` is ignored);
        prompt_slots/cache_slots other than the manifest's are for verification only (prompt_slots: exactly
        that many, never fewer by `prompt_step`); `ignore_eos` goes on
        past an end token (the warm-up, which must run every graph); `forced_tokens` feeds those tokens
        instead of the argmax (teacher forcing: verify compares int8's logits with fp32's on fp32's tokens)."""
        exact_prompt = prompt_slots is not None
        prompt_slots = prompt_slots or self.shapes.prompt_slots
        cache_slots = cache_slots or self.shapes.cache_slots
        limit = min(max_new_tokens or self.shapes.max_new_tokens, cache_slots,
                    len(forced_tokens) if forced_tokens is not None else cache_slots)
        embeds, token_lengths = self.sessions[ENCODER].run(
            None, {"audio": container.astype(np.float32, copy=False), "audio_lengths": np.array([valid], np.int32)})
        audio_tokens = int(token_lengths[0])
        ids, length = prompt_ids(self.prompt, audio_tokens, prompt_slots, language, system)
        if not exact_prompt:
            ids = ids[:, : self.shapes.prompt_size(length)]
        logits, keys, values = self.sessions[PREFILL].run(
            None, {"prompt_ids": ids, "prompt_lengths": np.array([length], np.int64), "audio_embeds": embeds})
        sizing = replace(self.shapes, cache_slots=cache_slots)
        cache_keys, cache_values = (grown(prefilled, sizing.cache_size(length)) for prefilled in (keys, values))
        first_logits, step_logits, tokens = logits[0], [], []
        position = length
        for index in range(limit):
            token = int(logits[0].argmax()) if forced_tokens is None else forced_tokens[index]
            if token in self.eos and not ignore_eos:
                break
            tokens.append(token)
            if position >= cache_slots or len(tokens) == limit:
                break
            if position >= cache_keys.shape[3]:  # a growing cache is full: its next size
                size = sizing.cache_size(position)
                cache_keys, cache_values = grown(cache_keys, size), grown(cache_values, size)
            logits, keys, values = self.sessions[STEP].run(None, {
                "token_ids": np.array([[token]], np.int64), "positions": np.array([position], np.int64),
                "cache_keys": cache_keys, "cache_values": cache_values})
            cache_keys[:, :, :, position], cache_values[:, :, :, position] = keys[:, :, :, 0], values[:, :, :, 0]
            step_logits.append(logits[0])
            position += 1
        return Qwen3Result(tokens, audio_tokens, first_logits, step_logits)
