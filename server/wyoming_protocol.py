"""The Wyoming protocol (Home Assistant's voice services), the speech-to-text part: framing and events.

Pure, sans-I/O like python-websockets' core: `EventReader.receive_data(bytes)` then `events()`; `encode()`
builds the bytes of one event. server/wyoming.py moves the bytes. Written from the `wyoming` package
(1.10.2: event.py, asr.py, audio.py, info.py, error.py) and the servers Home Assistant talks to.

Framing: one JSON header line {"type", "data"?, "data_length"?, "payload_length"?, "version"?} and "\n",
then data_length bytes of JSON merged into "data", then payload_length bytes of payload (audio).

Client -> server                                      Server -> client
    describe                                              info {"asr": [program with one model]}
    transcribe {"language"?, "name"?, ...}
    audio-start {"rate", "width", "channels"}
    audio-chunk {"rate", "width", "channels"} + PCM       transcript-start {"language"?}   (at the first text)
                                                          transcript-chunk {"text"}        (per segment)
    audio-stop                                            transcript {"text", "language"?}
                                                          transcript-stop
    anything else: ignored (the protocol's rule)          error {"text", "code"}, then the server closes

Why no runtime dependency on the `wyoming` package (the tests use its client): its reader returns None for
a malformed header instead of saying what was wrong, trusts data_length and payload_length whatever their
size (a client could make us allocate gigabytes), and its server owns the socket loop, where ours must
share the stream endpoints' admission, idle timeout and shutdown (server/streaming.py). The framing is the
forty lines below.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.audio import MAX_INPUT_RATE, MIN_INPUT_RATE
from pipeline.errors import ProtocolError, quoted
from pipeline.json_text import loads_shallow

from .protocol import MAX_TEXT_MESSAGE

WYOMING_PORT = 10300  # what Home Assistant's Wyoming integration and wyoming-faster-whisper use
PROTOCOL_VERSION = "1.10.2"  # the `wyoming` package version whose events we speak (sent in every header)
MAX_HEADER = MAX_TEXT_MESSAGE  # bytes of one header line, and of one event's data
_BLANK = re.compile(rb"[ \t\n\r\x0b\x0c]*")  # what bytes.strip() strips
WIDTHS = (1, 2, 3, 4)  # bytes per sample: u8, s16, s24, s32 (little-endian, as the package's audioop)
MAX_CHANNELS = 8
ATTRIBUTION = {"name": "Unipad ASR", "url": ""}  # required by clients; the project has no public home page yet


@dataclass(frozen=True)
class Event:
    """One Wyoming event; `data` already merged with the bytes that followed the header."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""


@dataclass(frozen=True)
class PcmFormat:
    """The audio-start's format; every audio-chunk must repeat it."""

    rate: int
    width: int
    channels: int

    @property
    def frame_bytes(self) -> int:
        return self.width * self.channels


class EventReader:
    """Bytes in, Events out. A malformed event raises ProtocolError (invalid_json, message_too_big) from
    `receive_data`; the reader is then unusable, as the connection it belongs to is about to close."""

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()
        self._header: dict[str, Any] | None = None  # read, waiting for its data and payload
        self._events: list[Event] = []

    def receive_data(self, data: bytes) -> None:
        self._buffer += data
        while self._step():
            pass

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _step(self) -> bool:
        """Parse one header or one complete event from the buffer; False when more bytes are needed."""
        if self._header is None:
            # blank lines between events are skipped at C speed (a flood of them is no event, and no work)
            blank = _BLANK.match(self._buffer).end()
            del self._buffer[:blank]
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > MAX_HEADER:
                    raise ProtocolError(f"event header longer than {MAX_HEADER} bytes without a newline",
                                        code="message_too_big")
                return False
            line = bytes(self._buffer[:end])  # not blank: it starts past the blanks skipped above
            del self._buffer[:end + 1]  # in place: a copy of the rest per line is quadratic in a read's lines
            self._header = parse_header(line, self.max_payload)
            return True
        data_length, payload_length = self._header["data_length"], self._header["payload_length"]
        if len(self._buffer) < data_length + payload_length:
            return False
        data = dict(self._header["data"])
        if data_length:
            extra = _json_object(bytes(self._buffer[:data_length]), f"the data of a {self._header['type']} event")
            data.update(extra)
        payload = bytes(self._buffer[data_length:data_length + payload_length])
        del self._buffer[:data_length + payload_length]
        self._events.append(Event(self._header["type"], data, payload))
        self._header = None
        return True


def parse_header(line: bytes, max_payload: int) -> dict[str, Any]:
    """A header line -> {"type", "data", "data_length", "payload_length"}; ProtocolError naming the fault."""
    header = _json_object(line, "an event header")
    kind = header.get("type")
    if not isinstance(kind, str) or not kind:
        raise ProtocolError(f'event header without a "type" string: {quoted(line.decode("utf-8", "replace"))}',
                            code="invalid_json")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise ProtocolError(f'"data" of a {kind} event must be an object, got {quoted(data)}', code="invalid_json")
    lengths = {}
    for name, limit in (("data_length", MAX_HEADER), ("payload_length", max_payload)):
        value = header.get(name) or 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProtocolError(f'"{name}" of a {kind} event must be a byte count, got {quoted(value)}',
                                code="invalid_json")
        if value > limit:
            raise ProtocolError(f"{kind} event with {name} {value} (at most {limit})", code="message_too_big")
        lengths[name] = value
    return {"type": kind, "data": data, **lengths}


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = loads_shallow(raw)
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deep
        raise ProtocolError(f"{what} is not JSON ({exc}): {quoted(raw.decode('utf-8', 'replace'))}",
                            code="invalid_json") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {quoted(value)}", code="invalid_json")
    return value


def encode(kind: str, data: dict[str, Any] | None = None, payload: bytes = b"") -> bytes:
    """One event as bytes: data after the header (data_length), as the package writes it."""
    header: dict[str, Any] = {"type": kind, "version": PROTOCOL_VERSION}
    body = json.dumps(data, ensure_ascii=False).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header, ensure_ascii=False).encode() + b"\n" + body + payload


# ---- what clients send -----------------------------------------------------------------------------------

def pcm_format(event: Event) -> PcmFormat:
    """The format of an audio-start or audio-chunk; ProtocolError unsupported_audio when we cannot take it."""
    values = [event.data.get(name) for name in ("rate", "width", "channels")]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ProtocolError(f"{event.type} needs integer rate, width and channels, got {quoted(event.data)}",
                            code="unsupported_audio")
    fmt = PcmFormat(*values)
    if not MIN_INPUT_RATE <= fmt.rate <= MAX_INPUT_RATE:
        raise ProtocolError(f"rate must be {MIN_INPUT_RATE}-{MAX_INPUT_RATE} Hz, got {fmt.rate}",
                            code="unsupported_audio")
    if fmt.width not in WIDTHS or not 1 <= fmt.channels <= MAX_CHANNELS:
        raise ProtocolError(f"width must be one of {WIDTHS} bytes and channels 1-{MAX_CHANNELS}, got width "
                            f"{fmt.width}, channels {fmt.channels}", code="unsupported_audio")
    return fmt


def to_float32(payload: bytes, fmt: PcmFormat) -> bytes:
    """Little-endian integer PCM of `fmt` -> float32 mono bytes (f32le), at fmt.rate. Widths and channel
    counts our intake does not take (u8, s24, s32, 3+ channels) are converted here; the rate is resampled by
    the StreamSession. A payload of partial frames is invalid_audio."""
    if len(payload) % fmt.frame_bytes:
        raise ProtocolError(f"audio-chunk of {len(payload)} bytes is not whole frames of {fmt.frame_bytes} bytes "
                            f"(width {fmt.width} x channels {fmt.channels})", code="invalid_audio")
    raw = np.frombuffer(payload, np.uint8)
    if fmt.width == 1:  # unsigned 8-bit, centred on 128
        samples = (raw.astype(np.float32) - 128.0) / 128.0
    else:  # sign-extend each sample into an int32's top bytes, whatever its width
        wide = np.zeros((len(raw) // fmt.width, 4), np.uint8)
        wide[:, 4 - fmt.width:] = raw.reshape(-1, fmt.width)
        samples = wide.view("<i4").ravel().astype(np.float32) / 2.0 ** 31
    return samples.reshape(-1, fmt.channels).mean(axis=1, dtype=np.float32).astype("<f4").tobytes()


def requested_language(event: Event, known: list[str]) -> str:
    """transcribe's language as the model's code: "en-US" -> "en" when only "en" is known; None/"": auto.
    ProtocolError bad_start for a language the model does not know (Home Assistant offers only `known`)."""
    language = event.data.get("language")
    if language in (None, ""):
        return "auto"
    if not isinstance(language, str):
        raise ProtocolError(f"transcribe's language must be a string, got {quoted(language)}", code="bad_start")
    for candidate in (language, language.replace("_", "-").split("-")[0].lower()):
        if candidate in known or candidate == "auto":
            return candidate
    raise ProtocolError(f"unknown language {quoted(language)}; this model knows {', '.join(known)}",
                        code="bad_start")


# ---- what the server sends -------------------------------------------------------------------------------

def info_event(model_name: str, description: str, languages: list[str], version: str | None) -> bytes:
    """The answer to describe: one ASR program with one installed model. Home Assistant offers the
    installed models' languages in its voice pipeline settings and names the engine after the program."""
    model = {"name": model_name, "description": description, "attribution": ATTRIBUTION, "installed": True,
             "version": version, "languages": languages}
    program = {"name": "unipad-asr", "description": "Unipad ASR: real-time speech recognition",
               "attribution": ATTRIBUTION, "installed": True, "version": version, "models": [model],
               "supports_transcript_streaming": True,
               # Home Assistant (or a satellite) decides when the command ends and sends audio-stop.
               "requires_external_vad": True}
    return encode("info", {"asr": [program], "tts": [], "handle": [], "intent": [], "wake": [], "mic": [],
                           "snd": []})


def transcript_start(language: str | None) -> bytes:
    return encode("transcript-start", {"language": language} if language else None)


def transcript_chunk(text: str) -> bytes:
    return encode("transcript-chunk", {"text": text})


def transcript(text: str, language: str | None) -> bytes:
    return encode("transcript", {"text": text, **({"language": language} if language else {})})


def transcript_stop() -> bytes:
    return encode("transcript-stop")


def error_event(code: str, text: str) -> bytes:
    return encode("error", {"text": text, "code": code})
