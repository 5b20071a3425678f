"""The wire messages of the Unipad stream endpoint, defined once for the server and the clients.

Pure: no asyncio, no sockets. Text frames carry JSON objects with a `type`; binary frames carry PCM.

Client -> server
    {"type": "start", "sample_rate": 48000, "format": "s16le"|"f32le", "channels": 1,
     "language": "auto", "itn": false, "partials": true, "token": "...",
     "hotwords": ["save", {"text": "turn on", "boost": 2.0}],
     "resumable": true, "resume": {"session": "…", "segment": 4, "time": 12.33}}  (first message)
    <binary PCM frames>
    {"type": "stop"}                                                          (no more audio)

Server -> client
    {"type": "ready", "session": "…", "model": "…", "provider": "CPUExecutionProvider", "sample_rate": 16000}
    {"type": "partial", "segment": 0, "text": "…", "start": 1.2, "end": 2.3}
    {"type": "final", "segment": 0, "text": "…", "start": 1.2, "end": 2.9,
     "language": "en", "emotion": "NEUTRAL", "event": "Speech", "tokens": [{"text", "start", "end"}…]}
    {"type": "error", "code": "…", "message": "…", "segment": 3 (optional)}
    {"type": "done", "segments": 4}
Times are seconds from the start of the stream. See docs/protocol.md.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Union

from pipeline.audio import MAX_INPUT_RATE, MIN_INPUT_RATE, PCM_FORMATS, SAMPLE_RATE, AudioFormat
from pipeline.errors import ProtocolError, quoted
from pipeline.hotwords import Hotword, parse_hotwords
from pipeline.json_text import loads_shallow

from .resume import Resume, parse_resume

STREAM_PATH = "/v1/stream"
DEFAULT_PORT = 8765
MAX_TEXT_MESSAGE = 64 * 1024  # a control message is small; audio goes in binary frames
# WebSocket close codes we use (RFC 6455 and the IANA registry).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # server shutting down
CLOSE_UNSUPPORTED = 1003  # unsupported audio format
CLOSE_INVALID_PAYLOAD = 1007  # malformed JSON, NaN samples
CLOSE_POLICY = 1008  # authentication, origin, protocol misuse
CLOSE_TOO_BIG = 1009  # a message over max_size
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013  # overloaded


# ---- client -> server ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    sample_rate: int = SAMPLE_RATE
    format: str = "s16le"
    channels: int = 1
    language: str = "auto"
    itn: bool = False
    partials: bool = True
    token: str | None = None
    hotwords: tuple[Hotword, ...] | None = None  # pipeline/hotwords.py; sent as [{"text", "boost"}, ...]
    resumable: bool = False  # on a server's drain, keep the open segment for a resume (server/resume.py)
    resume: Resume | None = None  # continue a stream another connection left unfinished
    type: str = "start"

    @property
    def audio_format(self) -> AudioFormat:
        return AudioFormat(sample_rate=self.sample_rate, encoding=self.format, channels=self.channels)


@dataclass(frozen=True)
class Stop:
    type: str = "stop"


ClientMessage = Union[Start, Stop]


def parse_json_object(text: str) -> dict[str, Any]:
    """One control frame's JSON object (ours and FunASR's); ProtocolError invalid_json otherwise."""
    try:
        data = loads_shallow(text)
    except ValueError as exc:
        raise ProtocolError(f"invalid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProtocolError("a control message must be a JSON object", code="invalid_json")
    return data


def parse_client_message(text: str) -> ClientMessage:
    """Parse one text frame from a client; raise ProtocolError with a precise code and message."""
    data = parse_json_object(text)
    kind = data.get("type")
    if kind == "stop":
        return Stop()
    if kind != "start":
        raise ProtocolError(f"unknown message type {kind!r} (expected 'start' or 'stop')", code="unknown_type")
    return _parse_start(data)


def _parse_start(data: dict[str, Any]) -> Start:
    unknown = set(data) - {f for f in Start.__dataclass_fields__}
    if unknown:
        raise ProtocolError(f"unknown field(s) in start: {', '.join(sorted(unknown))}", code="bad_start")
    rate = data.get("sample_rate", SAMPLE_RATE)
    if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        raise ProtocolError(
            f"sample_rate must be an integer from {MIN_INPUT_RATE} to {MAX_INPUT_RATE} Hz, got {quoted(rate)}",
            code="unsupported_audio",
        )
    fmt = data.get("format", "s16le")
    if fmt not in PCM_FORMATS:
        raise ProtocolError(f"format must be one of {', '.join(PCM_FORMATS)}, got {fmt!r}", code="unsupported_audio")
    channels = data.get("channels", 1)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels not in (1, 2):  # 2.0 is no count
        raise ProtocolError(f"channels must be 1 or 2, got {quoted(channels)}", code="unsupported_audio")
    for name in ("itn", "partials", "resumable"):
        if name in data and not isinstance(data[name], bool):
            raise ProtocolError(f"{name} must be true or false", code="bad_start")
    for name in ("language", "token"):
        if name in data and data[name] is not None and not isinstance(data[name], str):
            raise ProtocolError(f"{name} must be a string", code="bad_start")
    fields = {k: v for k, v in data.items() if k != "type"}
    fields["hotwords"] = parse_hotwords(data.get("hotwords")) or None  # ProtocolError bad_start
    if data.get("resume") is not None:
        fields["resume"] = parse_resume(data["resume"])  # ProtocolError bad_resume
    return Start(**fields)


# ---- server -> client ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    session: str
    model: str
    provider: str
    sample_rate: int = SAMPLE_RATE
    type: str = "ready"


@dataclass(frozen=True)
class TokenTime:
    text: str
    start: float
    end: float


@dataclass(frozen=True)
class Partial:
    segment: int
    text: str
    start: float
    end: float
    type: str = "partial"


@dataclass(frozen=True)
class Final:
    segment: int
    text: str
    start: float
    end: float
    language: str | None = None
    emotion: str | None = None
    event: str | None = None
    tokens: list[TokenTime] = field(default_factory=list)
    type: str = "final"


@dataclass(frozen=True)
class Error:
    code: str
    message: str
    segment: int | None = None
    type: str = "error"


@dataclass(frozen=True)
class Done:
    segments: int
    type: str = "done"


ServerMessage = Union[Ready, Partial, Final, Error, Done]
_SERVER_TYPES = {cls.type: cls for cls in (Ready, Partial, Final, Error, Done)}  # type: ignore[attr-defined]


def _round_times(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("start", "end"):
        if isinstance(data.get(key), float):
            data[key] = round(data[key], 3)
    return data


def encode(message: ServerMessage | ClientMessage) -> str:
    data = asdict(message)
    data = {k: v for k, v in data.items() if v is not None}
    if "tokens" in data:
        data["tokens"] = [_round_times(t) for t in data["tokens"]]
    return json.dumps(_round_times(data), ensure_ascii=False, allow_nan=False)


def parse_server_message(text: str) -> ServerMessage:
    """Parse one text frame from the server (used by the clients)."""
    data = json.loads(text)
    cls = _SERVER_TYPES.get(data.get("type")) if isinstance(data, dict) else None
    if cls is None:
        raise ProtocolError(f"unexpected server message: {text[:200]}", code="unknown_type")
    fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
    if cls is Final:
        fields["tokens"] = [TokenTime(**t) for t in fields.get("tokens", [])]
    return cls(**fields)
