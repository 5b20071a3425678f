"""Hotwords for Qwen3-ASR: context biasing, the text the reference puts into the system turn of its prompt.

`qwen-asr`'s transcribe(context=...) renders its chat template with the context as the system message,
"<|im_start|>system\\n{context}<|im_end|>\\n<|im_start|>user\\n<|audio_start|>...", and its tokenizer
encodes the text between the control tokens as one string: "system\\n" and the context together (a context
that starts with a newline changes the newline's token). Here the hotwords (and an OpenAI request's
`prompt`) become that context: the prompt first, then the hotwords joined by HOTWORD_SEPARATOR (a boost has
no meaning for a prompt: the model weighs the context itself). The ids come from the model directory's own
tokenizer (pipeline/families/qwen3_asr/bpe.py: tokens.txt and merges.txt), and must fit the room the export kept in the
prompt (PromptTokens.context_tokens: the prompt keeps its fixed, warmed shape); a context that does not
fit, or holds the model's control tokens, is refused with bad_start.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

from ...errors import ProtocolError
from ...hotwords import Hotword
from ...modeldir import ModelDirectory
from .bpe import MERGES_FILE, Qwen3Tokenizer, model_tokenizer
from .decoding import CONTEXT_AT

SYSTEM_TURN = "system\n"  # the system turn's text before the context: prefix[1:context_at]
HOTWORD_SEPARATOR = ", "
MAX_PROMPT_CHARS = 4096  # an OpenAI prompt longer than this is refused before it is encoded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Qwen3Context:
    """A context for the prompt: its text and the ids of the system turn's text with it (prompt_prefix)."""

    text: str
    system: tuple[int, ...]


def context_text(hotwords: Sequence[Hotword], prompt: str = "") -> str:
    """The prompt as written (a blank one is none), then the hotwords, joined by HOTWORD_SEPARATOR."""
    return HOTWORD_SEPARATOR.join(([prompt] if prompt.strip() else []) + [h.text for h in hotwords])


class ContextEncoder:
    """Contexts for one model directory; its tokenizer is read on first use (merges.txt: 1.7 MB)."""

    def __init__(self, model: ModelDirectory) -> None:
        self.model = model
        self.prompt = model.manifest.dimensions["prompt"]
        self._tokenizer: Qwen3Tokenizer | None = None

    @property
    def room(self) -> int:
        """The context tokens the prompt has room for."""
        return int(self.prompt.get("context_tokens", 0))

    def tokenizer(self) -> Qwen3Tokenizer:
        """The model directory's tokenizer; ProtocolError bad_start without merges.txt, or when it does not
        spell the template's own system turn as the manifest has it (merges of another tokenizer)."""
        if self._tokenizer is None:
            added = self.prompt.get("added_ids") or self._control_ids()
            try:
                tokenizer = model_tokenizer(self.model.path, self.model.tokens, added)
            except ValueError as exc:
                raise ProtocolError(f"hotwords need the model's tokenizer: {exc}", code="bad_start") from None
            own = list(self.prompt["prefix"][1: self.prompt.get("context_at", CONTEXT_AT)])
            if tokenizer.encode(SYSTEM_TURN) != own:
                raise ProtocolError(f"hotwords need the model's tokenizer: its merges.txt spells {SYSTEM_TURN!r} "
                                    f"as {tokenizer.encode(SYSTEM_TURN)}, the prompt has {own}", code="bad_start")
            self._tokenizer = tokenizer
        return self._tokenizer

    def context(self, hotwords: Sequence[Hotword], prompt: str = "") -> Qwen3Context | None:
        """The context of `hotwords` and `prompt`; None for neither. ProtocolError bad_start when it holds a
        control token or does not fit the prompt's room."""
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ProtocolError(f"the prompt has {len(prompt)} characters; at most {MAX_PROMPT_CHARS}",
                                code="bad_start")
        text = context_text(hotwords, prompt)
        if not text:
            return None
        if not self.room:
            raise ProtocolError("this Qwen3-ASR export keeps no room in its prompt for hotwords (a context): export "
                                "it again (`--context-tokens`, default 128)", code="bad_start")
        tokenizer = self.tokenizer()
        try:
            system = tuple(tokenizer.encode(SYSTEM_TURN + text))
        except ValueError as exc:
            raise ProtocolError(f"hotwords: {exc}", code="bad_start") from None
        used = len(system) - (self.prompt.get("context_at", CONTEXT_AT) - 1)  # past the system turn's own text
        if used > self.room:
            raise ProtocolError(f"the hotwords (context) are {used} tokens; this model's prompt has room for "
                                f"{self.room} (export with a larger --context-tokens)", code="bad_start")
        return Qwen3Context(text, system)

    def _control_ids(self) -> list[int]:
        """A manifest from before added_ids: the template's own control tokens."""
        prompt = self.prompt
        return [prompt["prefix"][0], prompt["prefix"][-1], prompt["suffix"][0], prompt["audio_token_id"],
                *prompt["eos_token_ids"]]


def read_contexts(model: ModelDirectory) -> ContextEncoder:
    """A ContextEncoder with its tokenizer read now when the directory has merges.txt (the engine's warm-up):
    the first stream with hotwords does not wait for it. A tokenizer that cannot serve is logged; the model
    still serves, and each stream with hotwords is refused."""
    encoder = ContextEncoder(model)
    if (model.path / MERGES_FILE).is_file():
        start = time.perf_counter()
        try:
            encoder.tokenizer()
            log.info("read the tokenizer for hotwords in %.2f s", time.perf_counter() - start)
        except ProtocolError as exc:
            log.warning("%s", exc)
    return encoder
