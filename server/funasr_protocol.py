"""The FunASR runtime WebSocket protocol, message layer: parse what FunASR clients send, build what they read.

Pure: no asyncio, no sockets (server/funasr.py moves the bytes). Written from FunASR's own protocol
description (runtime/docs/websocket_protocol.md) and its servers (runtime/websocket/bin/websocket-server*.cpp,
runtime/python/websocket/funasr_wss_server.py); see docs/protocol.md, section "FunASR runtime protocol".

Client -> server
    {"mode": "2pass"|"online"|"offline", "wav_name": "…", "wav_format": "pcm", "audio_fs": 16000,
     "is_speaking": true, "chunk_size": [5, 10, 5], "chunk_interval": 10, "hotwords": "{\"word\": 20}",
     "itn": true, "svs_lang": "auto", "svs_itn": true}                       (first message; unknown keys ok)
    <binary PCM16 at audio_fs, or the bytes of an audio file when wav_format is not pcm>
    {"is_speaking": false}  or  {"is_finished": true}                         (end of this input)

Server -> client
    {"mode": "2pass-online"|"online", "wav_name", "text": "<new text>", "is_final": false}
    {"mode": "2pass-offline"|"offline", "wav_name", "text", "is_final", "timestamp": "[[ms,ms],…]",
     "stamp_sents": [{"text_seg", "punc", "start", "end", "ts_list"}], "start_time": ms, "end_time": ms}
     (with a punctuation model, `text` is its text and `stamp_sents` has one entry per punctuation mark, as
     FunASR's C++ runtime builds them: runtime/onnxruntime/src/util.cpp TimestampSentence)
    {"mode", "wav_name", "text": "", "is_final": true, "is_end": true}       (answer to an end with is_end)
    {"wav_name", "text": "ERROR. …", "is_final": false, "is_end": true, "error": "…", "code": "…"}
Times are integer milliseconds from the start of the input.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from pipeline.audio import MAX_INPUT_RATE, MIN_INPUT_RATE, SAMPLE_RATE
from pipeline.transcript import Sentence, is_cjk, join_texts
from pipeline.errors import ProtocolError
from pipeline.stable_prefix import StablePrefix

from .protocol import parse_json_object

FUNASR_PORT = 10095  # FunASR runtime's default port (what its clients dial when given no --port)
SUBPROTOCOL = "binary"  # what FunASR's clients offer; browsers (its html5 page) offer none
MODES = ("2pass", "online", "offline")
DEFAULT_WAV_NAME = "wav-default-id"  # FunASR's C++ servers' default
PCM = "pcm"
REALTIME_PCM_ONLY = "Real-time transcription service ONLY SUPPORT PCM stream."  # FunASR's own wording
_END_KEYS = ("is_speaking", "is_finished", "is_end")
_PUNCTUATION = ".,?!;:。，？！；：、"


@dataclass(frozen=True)
class FunasrConfig:
    """The settings of one input (a stream or a file), from the client's JSON messages."""

    mode: str | None = None  # None: the client sent no mode (FunASR's offline file client): whole-input results
    wav_name: str = DEFAULT_WAV_NAME
    wav_format: str = PCM
    audio_fs: int = SAMPLE_RATE
    itn: bool = True
    svs_lang: str = "auto"
    svs_itn: bool | None = None
    tags: bool = False  # the client sent svs_lang or svs_itn: results carry SenseVoice's tags
    hotwords: Any = None
    chunk_size: tuple[int, ...] = (5, 10, 5)
    chunk_interval: int = 10
    token: str | None = None
    unknown: tuple[str, ...] = field(default=(), compare=False)  # keys we tolerate but do not know

    @property
    def pcm(self) -> bool:
        return self.wav_format.lower() == PCM

    @property
    def reply_mode(self) -> str:
        return self.mode or "offline"

    @property
    def whole_input(self) -> bool:
        """One result for the whole input: a file (wav_format not pcm) or a client that sent no mode."""
        return self.reply_mode == "offline" and (self.mode is None or not self.pcm)

    @property
    def use_itn(self) -> bool:
        """SenseVoice's text normalisation: svs_itn when the client sent it, else itn (both default true)."""
        return self.svs_itn if self.svs_itn is not None else self.itn

    @property
    def final_mode(self) -> str:
        return {"2pass": "2pass-offline"}.get(self.reply_mode, self.reply_mode)

    @property
    def partial_mode(self) -> str:
        return {"2pass": "2pass-online"}.get(self.reply_mode, self.reply_mode)


@dataclass(frozen=True)
class Control:
    """One parsed text message: the settings it leaves, and whether it ends the input."""

    config: FunasrConfig
    end: bool = False  # is_speaking false or is_finished true
    ack: bool = False  # is_end true as well: answer with an end acknowledgement (FunASR's newer clients)


def _bool(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # some clients send 0/1
        return bool(value)
    raise ProtocolError(f"{key} must be true or false, got {value!r}", code="bad_start")


def _int_list(value: Any, key: str) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(items, list) or not items:
            raise ValueError
        numbers = tuple(int(x.strip()) if isinstance(x, str) else x for x in items)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            raise ValueError
    except ValueError:
        raise ProtocolError(f"{key} must be a list of integers or a comma-separated string, got {value!r}",
                            code="bad_start") from None
    return numbers


def parse_control(text: str, previous: FunasrConfig) -> Control:
    """Parse one text frame; settings it does not mention keep their `previous` values (FunASR keeps
    per-connection state). Raises ProtocolError (invalid_json, bad_start, unsupported_audio)."""
    data = parse_json_object(text)
    changes: dict[str, Any] = {}
    mode = data.get("mode")
    if mode is not None:
        if mode not in MODES:
            raise ProtocolError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", code="bad_start")
        changes["mode"] = mode
    for key in ("wav_name", "wav_format", "svs_lang", "token"):
        if data.get(key) is not None:
            if not isinstance(data[key], str) or (key != "wav_name" and not data[key]):
                raise ProtocolError(f"{key} must be a non-empty string, got {data[key]!r}", code="bad_start")
            changes[key] = data[key]
    if data.get("audio_fs") is not None:
        rate = data["audio_fs"]
        if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
            raise ProtocolError(f"audio_fs must be an integer from {MIN_INPUT_RATE} to {MAX_INPUT_RATE} Hz, "
                                f"got {rate!r}", code="unsupported_audio")
        changes["audio_fs"] = rate
    for key in ("itn", "svs_itn"):
        value = _bool(data, key)
        if value is not None:
            changes[key] = value
    if data.get("chunk_size") is not None:
        changes["chunk_size"] = _int_list(data["chunk_size"], "chunk_size")
    if data.get("chunk_interval") is not None:
        interval = data["chunk_interval"]
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ProtocolError(f"chunk_interval must be a positive integer, got {interval!r}", code="bad_start")
        changes["chunk_interval"] = interval
    if "hotwords" in data:
        changes["hotwords"] = data["hotwords"]
    if "svs_lang" in data or "svs_itn" in data:
        changes["tags"] = True
    known = ({f.name for f in dataclasses.fields(FunasrConfig)} - {"tags", "unknown"}) | set(_END_KEYS)
    changes["unknown"] = tuple(sorted(set(data) - known))
    speaking, finished, is_end = _bool(data, "is_speaking"), _bool(data, "is_finished"), _bool(data, "is_end")
    end = speaking is False or finished is True
    return Control(dataclasses.replace(previous, **changes), end=end, ack=end and is_end is True)


# ---- server -> client ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the input
    end: float


@dataclass(frozen=True)
class SegmentResult:
    """One segment's final transcript (times in seconds from the start of the input)."""

    segment: int
    text: str
    start: float
    end: float
    words: tuple[Word, ...] = ()  # FunASR's timestamp unit: a word, or one CJK character
    language: str | None = None
    emotion: str | None = None
    event: str | None = None
    error: str | None = None  # the model failed on this segment (text is then empty)
    # Punctuated (--punc): `text` is the punctuation model's, and these its sentences; None: not punctuated
    sentences: tuple[Sentence, ...] | None = None


def ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def tagged_text(result: SegmentResult, config: FunasrConfig) -> str:
    """The text as FunASR's SenseVoice gives it when the client asked with svs_lang/svs_itn:
    '<|en|><|NEUTRAL|><|Speech|><|woitn|>text' (a tag the model did not produce is left out);
    the plain text otherwise."""
    if not config.tags:
        return result.text
    tags = "".join(f"<|{tag}|>" for tag in (result.language, result.emotion, result.event) if tag)
    return f"{tags}<|{'withitn' if config.use_itn else 'woitn'}|>{result.text}"


def timestamp_string(words: Sequence[Word]) -> str:
    """'[[start_ms,end_ms],...]', one pair per word: FunASR sends this field as a string."""
    return json.dumps([[ms(w.start), ms(w.end)] for w in words], separators=(",", ":"))


def stamp_sentence(result: SegmentResult, text: str) -> dict[str, Any]:
    """FunASR's stamp_sents entry for one segment that was not punctuated (one sentence per segment)."""
    punc = text[-1] if text and text[-1] in _PUNCTUATION else ""
    segment_words = [w.text for w in result.words]
    if punc and segment_words and segment_words[-1].endswith(punc):
        segment_words[-1] = segment_words[-1][:-1]
    return {"text_seg": " ".join(w for w in segment_words if w), "punc": punc, "start": ms(result.start),
            "end": ms(result.end), "ts_list": [[ms(w.start), ms(w.end)] for w in result.words]}


def stamp_sentences(result: SegmentResult, text: str) -> list[dict[str, Any]]:
    """A segment's stamp_sents entries: with punctuation one per sentence, as FunASR's TimestampSentence writes
    them (runtime/onnxruntime/src/util.cpp): the words before each mark joined by blanks, the mark as the text
    writes it, the first word's start, the last word's end, each word's [start, end] (integer ms). One thing
    differs: FunASR's C++ list of marks (TimestampIsPunctuation) lacks ".", so it runs an English sentence on
    past its "." and hands the words after it the times of the words before; here "." ends a sentence like
    "。" does. Without punctuation: stamp_sentence."""
    if result.sentences is None:
        return [stamp_sentence(result, text)] if text else []
    return [{"text_seg": " ".join(w.text for w in s.words), "punc": s.mark, "start": ms(s.start), "end": ms(s.end),
             "ts_list": [[ms(w.start), ms(w.end)] for w in s.words]} for s in result.sentences]


def final_message(config: FunasrConfig, results: Sequence[SegmentResult], is_final: bool) -> dict[str, Any]:
    """A `2pass-offline`/`offline` result for one segment, or for several (a whole input)."""
    texts = [tagged_text(r, config) for r in results]
    message: dict[str, Any] = {
        "mode": config.final_mode, "wav_name": config.wav_name, "text": join_texts(texts), "is_final": is_final,
        "timestamp": timestamp_string([w for r in results for w in r.words]),
        "stamp_sents": [entry for r, t in zip(results, texts) for entry in stamp_sentences(r, t)],
    }
    if results:
        message["start_time"], message["end_time"] = ms(results[0].start), ms(results[-1].end)
    errors = [r.error for r in results if r.error]
    if errors:
        message["error"] = "; ".join(errors)
    return message


class ResultWriter:
    """One input's results as FunASR messages. Stateful because FunASR's clients append every `online` and
    `2pass-online` text to what they show: a segment's partials send only the text they commit
    (pipeline/stable_prefix.py); in `online` mode its final sends the rest after what was sent (the client
    cannot take text back), in `2pass` its final is the whole second-pass text, which FunASR's clients show
    in place of the segment's online text (funasr_wss_client.py resets it on each 2pass-offline text)."""

    def __init__(self, config: FunasrConfig) -> None:
        self.config = config  # the connection replaces it when a later message renames the input
        self._segments: dict[int, StablePrefix] = {}  # open segment -> the text its deltas add up to
        self._any_text = False  # an earlier segment of this input sent text: the next one is separated

    def partial(self, segment: int, snapshot: str) -> dict[str, Any] | None:
        """A partial transcript of an open segment -> a delta message, or None when nothing new is stable."""
        prefix = self._segments.setdefault(segment, StablePrefix())
        first = not prefix.text
        delta = prefix.update(snapshot)
        if not delta:
            return None
        return partial_message(self.config, self._separate(delta, final=False) if first else delta)

    def final(self, result: SegmentResult, is_final: bool) -> dict[str, Any] | None:
        """A segment's final -> its 2pass-offline/offline result, whole: FunASR's 2pass clients drop the
        segment's online text when it comes, so the second pass may correct it; in online mode, the rest of
        its text as a delta (None when nothing is left and the message is not needed as the input's last)."""
        prefix = self._segments.pop(result.segment, StablePrefix())
        if self.config.reply_mode != "online":
            message = final_message(self.config, [result], is_final)
            message["text"] = self._separate(message["text"])
            return message
        sent = prefix.text
        rest = prefix.complete(result.text)
        delta = rest if sent else self._separate(rest)
        if not delta and not is_final and not result.error:
            return None
        message = partial_message(self.config, delta, is_final)
        if result.error:
            message["error"] = result.error
        return message

    def _separate(self, text: str, final: bool = True) -> str:
        """A segment's first text after an earlier segment's text starts with a space unless it is CJK:
        FunASR's clients print texts as they come, and FunASR's punctuation model starts a segment that opens
        with a Latin word with a space (ct_transformer), so clients read separate words. The space goes after
        SenseVoice's tags, which stay first for clients that parse them. `final`: the text settles the
        segment (an online/offline text, or a 2pass-offline text); a 2pass-online text does not (the
        segment's 2pass-offline text replaces it)."""
        tags = _TAG_PREFIX.match(text).group(0)
        words = text[len(tags):]
        if words and self._any_text and not is_cjk(words[0]) and not words[0].isspace():
            text = f"{tags} {words}"
        if words and (final or self.config.reply_mode == "online"):
            self._any_text = True
        return text


_TAG_PREFIX = re.compile(r"(?:<\|[^|<>]*\|>)*")  # SenseVoice's '<|en|><|NEUTRAL|>…' before a text


def partial_message(config: FunasrConfig, text: str, is_final: bool = False) -> dict[str, Any]:
    return {"mode": config.partial_mode, "wav_name": config.wav_name, "text": text, "is_final": is_final}


def end_message(config: FunasrConfig) -> dict[str, Any]:
    """The last message of an input that ended with no result left to send (FunASR always sends one)."""
    if config.reply_mode == "online":
        return partial_message(config, "", is_final=True)
    return {"mode": config.final_mode, "wav_name": config.wav_name, "text": "", "is_final": True}


def ack_message(config: FunasrConfig) -> dict[str, Any]:
    """The answer to an end message carrying is_end: true (FunASR's newer Python client waits for it)."""
    return {"mode": config.reply_mode, "wav_name": config.wav_name, "text": "", "is_final": True, "is_end": True}


def error_message(wav_name: str, code: str, message: str) -> dict[str, Any]:
    """A fatal error in FunASR's style ('ERROR. …' in text) plus the fields its newer clients read."""
    return {"wav_name": wav_name, "text": f"ERROR. {message}", "is_final": False, "is_end": True,
            "error": message, "code": code}


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, allow_nan=False)
