"""Deepgram's /v1/listen, pure: the query parameters as one frozen `ListenOptions`, and every message and
response body, with Deepgram's field names (deepgram-sdk 7.17 listen/v1/types and types/listen_v1response*:
ListenV1Results, ListenV1SpeechStarted, ListenV1UtteranceEnd, ListenV1Metadata, ListenV1Error,
ListenV1Response). server/deepgram_live.py (WebSocket) and server/deepgram_http.py (POST) do the I/O.

What maps to what (docs/deepgram.md says it for users):
    model            any name; the served model decodes. Reported back: model_info.name is the served
                     model, model_info.arch the name the client asked for.
    language         "en-US" -> "en" when the model knows "en"; "multi" -> "auto"; absent: "auto"
    endpointing      ms of silence that end an utterance (speech_final); at least MIN_ENDPOINTING_MS (shorter
                     silences cut phrases into fragments the model hears alone); "false": segments still end
                     after the server's --end-silence, with speech_final false; absent: --end-silence
    keywords         "word:intensifier" -> a hotword with boost DEFAULT_BOOST x intensifier (at most MAX_BOOST);
                     an intensifier <= 0 (suppression) is dropped. keyterm: a hotword with DEFAULT_BOOST.
    punctuate        true: finals' transcripts as the server's punctuation model writes them (--punc), each
                     word's punctuated_word too ("Hello,"); without a punctuation model, or false: the model's text
    smart_format, diarize, filler_words, numerals, ... accepted and not applied (the model writes its own
                     text); unknown parameters are accepted too, as Deepgram does.
Word and transcript confidences are 1.0 (0.0 for an empty transcript): the engine gives no per-word scores.
"""
from __future__ import annotations

import datetime
import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Sequence
from urllib.parse import parse_qsl

from pipeline.audio import MAX_INPUT_RATE, MIN_INPUT_RATE
from pipeline.hotwords import DEFAULT_BOOST, MAX_BOOST, Hotword, make_hotword
from pipeline.errors import ProtocolError, quoted

from .deepgram_audio import WIRE_ENCODINGS

LISTEN_PATH = "/v1/listen"
TOKEN_SUBPROTOCOL = "token"  # browsers: Sec-WebSocket-Protocol: token, KEY
MAX_CHANNELS = 8  # multichannel streams (one StreamSession each); meeting bots send one per speaker
MIN_ENDPOINTING_MS = 200  # LiveKit's default 25 ms would end a segment at every pause between words
MIN_UTTERANCE_END_MS = 1000  # Deepgram's own floor for utterance_end_ms
MAX_SILENCE_MS = 10_000


class DeepgramError(Exception):
    """A request we refuse: HTTP `status` with Deepgram's error body (err_code, err_msg, request_id)."""

    def __init__(self, status: int, message: str, code: str = "Bad Request") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self, request_id: str) -> dict[str, Any]:
        return {"err_code": self.code, "err_msg": self.message, "request_id": request_id}


@dataclass(frozen=True)
class ListenOptions:
    """One /v1/listen request's parameters, validated (Deepgram's defaults where absent)."""

    model: str = "base"
    language: str = "auto"  # a language of the served model
    encoding: str | None = None  # None: containerised (WAV) audio, the format from its header
    sample_rate: int | None = None  # required with `encoding`
    channels: int = 1
    multichannel: bool = False  # each channel its own stream; else channels are averaged
    interim_results: bool = False
    endpointing_ms: int | None = None  # None: the server's --end-silence
    speech_final: bool = True  # endpointing=false: never speech_final
    utterance_end_ms: int | None = None
    vad_events: bool = False
    utterances: bool = False  # pre-recorded: results.utterances
    punctuate: bool = False  # finals punctuated by the server's punctuation model, where it has one
    hotwords: tuple[Hotword, ...] = ()  # keywords and keyterm
    ignored: tuple[str, ...] = ()  # parameters accepted and not applied (logged)

    @property
    def streams(self) -> int:
        """StreamSessions: one per channel with multichannel, else one."""
        return self.channels if self.multichannel else 1


def _flag(name: str, value: str) -> bool:
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise DeepgramError(400, f"{name}={quoted(value)}: expected true or false")


def _int(name: str, value: str, low: int, high: int) -> int:
    # ASCII digits, at most 18: int() refuses more than 4300 digits, and takes other scripts' digits too
    if not re.fullmatch(r"[0-9]{1,18}", value) or not low <= int(value) <= high:
        raise DeepgramError(400, f"{name}={quoted(value)}: expected an integer from {low} to {high}")
    return int(value)


def _keyword(value: str) -> Hotword | None:
    """Deepgram's "word:intensifier" (the intensifier optional) -> a hotword; None for a suppression."""
    text, _, tail = value.rpartition(":")
    try:
        intensifier = float(tail) if text else 1.0
    except ValueError:
        text, intensifier = value, 1.0
    text = text or value
    if intensifier <= 0:
        return None
    try:
        return make_hotword(text, min(MAX_BOOST, DEFAULT_BOOST * intensifier))
    except ProtocolError as exc:
        raise DeepgramError(400, f"keywords={quoted(value)}: {exc}") from None


def model_language(value: str, languages: Iterable[str]) -> str:
    """A BCP-47 tag -> a language of the served model (its base subtag will do); DeepgramError otherwise."""
    known = list(languages)
    if value in ("multi", "auto"):
        return "auto"
    for candidate in (value, value.lower(), value.split("-")[0].lower()):
        if candidate in known:
            return candidate
    raise DeepgramError(400, f"language={quoted(value)} is not supported by the served model; it knows "
                        f"{', '.join(k for k in known if k != 'auto')} (or multi)")


def parse_listen_query(query: str, languages: Iterable[str]) -> ListenOptions:
    """The query string of a /v1/listen request -> ListenOptions; DeepgramError 400 naming the parameter."""
    pairs = parse_qsl(query, keep_blank_values=True)
    single = {k: v for k, v in pairs}
    fields: dict[str, Any] = {}
    if "model" in single:
        fields["model"] = single["model"] or "base"
    if single.get("language"):
        fields["language"] = model_language(single["language"], languages)
    if "encoding" in single:
        if single["encoding"] not in WIRE_ENCODINGS:
            raise DeepgramError(400, f"encoding={quoted(single['encoding'])} is not supported; use "
                                f"{', '.join(WIRE_ENCODINGS)}, or no encoding for WAV")
        fields["encoding"] = single["encoding"]
        if "sample_rate" not in single:
            raise DeepgramError(400, f"encoding={single['encoding']} needs sample_rate")
    if "sample_rate" in single:
        fields["sample_rate"] = _int("sample_rate", single["sample_rate"], MIN_INPUT_RATE, MAX_INPUT_RATE)
    if "channels" in single:
        fields["channels"] = _int("channels", single["channels"], 1, MAX_CHANNELS)
    for name in ("multichannel", "interim_results", "vad_events", "utterances", "punctuate"):
        if name in single:
            fields[name] = _flag(name, single[name])
    if "endpointing" in single:
        value = single["endpointing"]
        if value.lower() == "false":
            fields["speech_final"] = False
        elif value.lower() != "true":  # "true": Deepgram's default endpointing, i.e. ours
            fields["endpointing_ms"] = max(MIN_ENDPOINTING_MS, _int("endpointing", value, 0, MAX_SILENCE_MS))
    if "utterance_end_ms" in single:
        fields["utterance_end_ms"] = max(MIN_UTTERANCE_END_MS,
                                         _int("utterance_end_ms", single["utterance_end_ms"], 0, MAX_SILENCE_MS))
    hotwords = [_keyword(v) for k, v in pairs if k == "keywords" and v]
    hotwords += [_keyword_plain(v) for k, v in pairs if k == "keyterm" and v]
    fields["hotwords"] = tuple(h for h in hotwords if h is not None)
    known = set(ListenOptions.__dataclass_fields__) | {"endpointing", "keywords", "keyterm", "token"}
    fields["ignored"] = tuple(sorted({k for k in single if k not in known}))
    return ListenOptions(**fields)


def _keyword_plain(value: str) -> Hotword:
    try:
        return make_hotword(value)
    except ProtocolError as exc:
        raise DeepgramError(400, f"keyterm={quoted(value)}: {exc}") from None


# ---- messages ------------------------------------------------------------------------------------------


def model_uuid(served: str) -> str:
    """A stable id for the served model (Deepgram reports model UUIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"unipad:{served}"))


def model_info(served: str, requested: str) -> dict[str, str]:
    return {"name": served, "version": "unipad", "arch": requested}


def plain_word(text: str) -> str:
    """Deepgram's `word`: lower case without surrounding punctuation (`punctuated_word` keeps the model's)."""
    return re.sub(r"^[^\w']+|[^\w']+$", "", text.strip()).lower() or text.strip().lower()


def words_of(words: Sequence[Any], punctuated: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Transcript words (text, start, end in stream seconds) -> Deepgram's words[]; `punctuated`: each word as the
    punctuated transcript writes it (its punctuated_word), else the model's own."""
    out = []
    for i, w in enumerate(words):
        if not w.text.strip():
            continue
        item = {"word": plain_word(w.text), "start": round(w.start, 3), "end": round(w.end, 3), "confidence": 1.0,
                "punctuated_word": (w.text if punctuated is None else punctuated[i]).strip()}
        out.append(item)
    return out


def alternative(text: str, words: Sequence[Any], punctuated: Sequence[str] | None = None) -> dict[str, Any]:
    text = text.strip()
    return {"transcript": text, "confidence": 1.0 if text else 0.0, "words": words_of(words, punctuated)}


def results(channel: int, channels: int, start: float, end: float, text: str, words: Sequence[Any],
            is_final: bool, speech_final: bool, from_finalize: bool, metadata: dict[str, Any],
            punctuated: Sequence[str] | None = None) -> dict[str, Any]:
    """A Results message: an interim (is_final false) or final transcript of [start, end] stream seconds
    (`punctuated`: each word's punctuated_word, for a punctuated transcript)."""
    return {"type": "Results", "channel_index": [channel, channels], "duration": round(max(0.0, end - start), 3),
            "start": round(start, 3), "is_final": is_final, "speech_final": speech_final,
            "from_finalize": from_finalize, "channel": {"alternatives": [alternative(text, words, punctuated)]},
            "metadata": metadata}


def results_metadata(request_id: str, served: str, requested: str) -> dict[str, Any]:
    return {"request_id": request_id, "model_info": model_info(served, requested), "model_uuid": model_uuid(served)}


def speech_started(channel: int, channels: int, timestamp: float) -> dict[str, Any]:
    return {"type": "SpeechStarted", "channel": [channel, channels], "timestamp": round(timestamp, 3)}


def utterance_end(channel: int, channels: int, last_word_end: float) -> dict[str, Any]:
    return {"type": "UtteranceEnd", "channel": [channel, channels], "last_word_end": round(last_word_end, 3)}


def _created() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def response_metadata(request_id: str, sha256: str, duration: float, channels: int, served: str,
                      requested: str) -> dict[str, Any]:
    """The metadata of a pre-recorded response, and (with type Metadata) of a stream's last message."""
    uid = model_uuid(served)
    return {"transaction_key": "deprecated", "request_id": request_id, "sha256": sha256, "created": _created(),
            "duration": round(duration, 3), "channels": channels, "models": [uid],
            "model_info": {uid: model_info(served, requested)}}


def metadata_message(**fields: Any) -> dict[str, Any]:
    return {"type": "Metadata", **response_metadata(**fields)}


def error_message(description: str, variant: str = "Error", message: str = "") -> dict[str, Any]:
    """An Error message (ListenV1Error); a SchemaError names a client text message we could not read."""
    return {"type": "Error", "variant": variant, "description": description, "message": message}


@dataclass(frozen=True)
class Utterance:
    channel: int
    start: float
    end: float
    text: str
    words: tuple[Any, ...]
    punctuated: tuple[str, ...] | None = None  # each word as the punctuated text writes it; None: not punctuated


def prerecorded_body(metadata: dict[str, Any], utterances: Sequence[Utterance], channels: int,
                     with_utterances: bool) -> dict[str, Any]:
    """Deepgram's pre-recorded response: one alternative per channel joining its utterances."""
    out = []
    for ch in range(channels):
        mine = [u for u in utterances if u.channel == ch]
        text = " ".join(u.text.strip() for u in mine if u.text.strip())
        punctuated = [p for u in mine for p in (u.punctuated or [w.text for w in u.words])]
        out.append({"alternatives": [alternative(text, [w for u in mine for w in u.words], punctuated)]})
    body: dict[str, Any] = {"metadata": metadata, "results": {"channels": out}}
    if with_utterances:
        body["results"]["utterances"] = [
            {"start": round(u.start, 3), "end": round(u.end, 3), "confidence": 1.0, "channel": u.channel,
             "transcript": u.text.strip(), "words": words_of(u.words, u.punctuated), "id": str(uuid.uuid4())}
            for u in utterances if u.text.strip()]
    return body


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
