"""OpenAI Realtime transcription sessions, pure: the session settings a client may send, and every event.

Both shapes of the settings are read (openai-python src/openai/types/realtime/ and types/beta/realtime/):
    session.update                {"session": {"type": "transcription", "audio": {"input": {
                                     "format": {"type": "audio/pcm", "rate": 24000},
                                     "transcription": {"model", "language", "languages", "prompt"},
                                     "turn_detection": {"type": "server_vad", "threshold",
                                                        "prefix_padding_ms", "silence_duration_ms"}
                                                     | {"type": "semantic_vad", "eagerness"} | null}}}}
    transcription_session.update  {"session": {"input_audio_format": "pcm16",
                                     "input_audio_transcription": {...}, "turn_detection": {...} | null}}
Audio is little-endian PCM16 mono at 24 kHz (OpenAI's only rate) or at 16 kHz where a client says so
(`rate: 16000`). server_vad is our VAD: `silence_duration_ms` -> end_silence, `prefix_padding_ms` ->
pre_roll, and `threshold` (0-1, louder speech needed as it grows) -> webrtcvad's aggressiveness:
below 0.15 -> 0, below 0.3 -> 1, below 0.5 -> 2, from 0.5 (OpenAI's default) -> 3 (ours); with --vad silero
it is Silero's speech probability itself.
semantic_vad (openai-agents' voice pipeline sends it by default) is our VAD too: it hears silence, not
meaning, so `eagerness` picks the end-of-turn silence (EAGERNESS_SILENCE_MS), with server_vad's defaults
for the rest. Its other fields (`create_response`, `interrupt_response`) are about responses: ignored.
"""
from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from pipeline.errors import quoted
from pipeline.json_text import loads_shallow
from pipeline.segmenter_options import MIN_HOLD, SegmenterOptions

REALTIME_PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"  # what OpenAI's browser SDK offers, with its key in "openai-insecure-api-key.<key>"
RATES = (24000, 16000)
DEFAULT_RATE = 24000
THRESHOLD_MODES = ((0.15, 0), (0.3, 1), (0.5, 2))  # (below this threshold, webrtcvad mode); else 3
GA_UPDATE = "session.update"
BETA_UPDATE = "transcription_session.update"
PCM_TYPE = "audio/pcm"
BETA_FORMATS = {"pcm16": DEFAULT_RATE}
# semantic_vad's eagerness -> the silence that ends a turn. OpenAI's semantic model ends a turn as soon as
# the words sound finished and waits at most 8 s / 4 s / 2 s (low / medium / high) when they do not; a
# silence detector cannot tell, so each eagerness gets the silence a server_vad user would pick for it:
# medium (and auto, which is medium) OpenAI's and our server_vad default, 0.5 s; high the shortest
# that rarely splits a sentence at a pause, 0.3 s; low room for a pause to think, 1 s. Waiting the
# maxima would hold every answer 2-8 s.
EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 300}
DEFAULT_EAGERNESS = "auto"


class EventError(Exception):
    """A client event the session cannot take: answered with an `error` event; the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 event_id: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.event_id = message, code, param, event_id


@dataclass(frozen=True)
class TurnDetection:
    silence_duration_ms: int = 500  # OpenAI's default as ours (end_silence 0.5 s)
    prefix_padding_ms: int = 300  # OpenAI's default as ours (pre_roll 0.3 s)
    threshold: float = 0.5
    eagerness: str | None = None  # semantic_vad's (its silence_duration_ms from EAGERNESS_SILENCE_MS); None: server_vad


@dataclass(frozen=True)
class SessionConfig:
    rate: int = DEFAULT_RATE
    model: str = ""  # what the client named; answered back as given (the served model decodes)
    language: str = "auto"
    prompt: str = ""
    turn_detection: TurnDetection | None = TurnDetection()  # None: segments only on commit


def vad_mode(threshold: float) -> int:
    return next((mode for below, mode in THRESHOLD_MODES if threshold < below), 3)


def segmenter_options(base: SegmenterOptions, config: SessionConfig) -> SegmenterOptions:
    """The server's segmenter settings with the client's server_vad ones applied."""
    vad = config.turn_detection
    if vad is None:
        return base
    end_silence = max(vad.silence_duration_ms / 1000, 0.03)
    # threshold is a speech probability, as Silero's is (webrtcvad's modes are mapped from it)
    return dataclasses.replace(base, end_silence=end_silence, post_roll=min(base.post_roll, end_silence),
                               pre_roll=vad.prefix_padding_ms / 1000, vad_aggressiveness=vad_mode(vad.threshold),
                               vad_threshold=max(vad.threshold, MIN_HOLD))


def _get(data: Any, key: str, kind: type | tuple[type, ...], param: str) -> Any:
    if not isinstance(data, dict) or data.get(key) is None:
        return None
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise EventError(f"Invalid type for '{param}.{key}': got {type(value).__name__}", param=f"{param}.{key}")
    return value


def _first_language(transcription: dict[str, Any], param: str) -> str | None:
    """gpt-transcribe's plural `languages` (what LiveKit's openai plugin sends for it): this model decodes
    one language, so the first one listed stands for `language`."""
    languages = _get(transcription, "languages", list, param) or []
    if not all(isinstance(code, str) for code in languages):
        raise EventError(f"Invalid type for '{param}.languages': expected an array of strings",
                         param=f"{param}.languages")
    return next((code for code in languages if code), None)


def _object(data: dict[str, Any], key: str, param: str) -> dict[str, Any]:
    """The object at `data[key]`, {} when absent or null; EventError for another type (a string, a list)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise EventError(f"Invalid type for '{param}.{key}': expected an object, got {type(value).__name__}",
                         param=f"{param}.{key}")
    return value


def _turn_detection(data: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("type", "server_vad") not in ("server_vad", "semantic_vad"):
        kind = data.get("type") if isinstance(data, dict) else data
        raise EventError(f"turn_detection type {kind!r} is not supported; use server_vad, semantic_vad or null",
                         param=param)
    if data.get("type") == "semantic_vad":
        return _semantic_vad(data, param, current)
    base = current if current is not None and current.eagerness is None else TurnDetection()
    silence = _get(data, "silence_duration_ms", int, param)
    padding = _get(data, "prefix_padding_ms", int, param)
    threshold = _get(data, "threshold", (int, float), param)
    if silence is not None and not 30 <= silence <= 10_000:
        raise EventError(f"silence_duration_ms must be from 30 to 10000, got {silence}", param=param)
    if padding is not None and not 0 <= padding <= 5_000:
        raise EventError(f"prefix_padding_ms must be from 0 to 5000, got {padding}", param=param)
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise EventError(f"threshold must be from 0 to 1, got {threshold}", param=param)
    return TurnDetection(base.silence_duration_ms if silence is None else silence,
                         base.prefix_padding_ms if padding is None else padding,
                         base.threshold if threshold is None else float(threshold))


def _semantic_vad(data: dict[str, Any], param: str, current: TurnDetection | None) -> TurnDetection:
    """{"type": "semantic_vad", "eagerness"} -> our VAD with that eagerness's end silence (an absent
    eagerness keeps the current one, as server_vad's absent fields do; `auto` to begin with)."""
    eagerness = _get(data, "eagerness", str, param)
    if eagerness is None:
        eagerness = current.eagerness if current is not None and current.eagerness else DEFAULT_EAGERNESS
    if eagerness not in EAGERNESS_SILENCE_MS:
        raise EventError(f"eagerness must be one of {', '.join(EAGERNESS_SILENCE_MS)}, got {quoted(eagerness)}",
                         param=f"{param}.eagerness")
    return TurnDetection(silence_duration_ms=EAGERNESS_SILENCE_MS[eagerness], eagerness=eagerness)


def _rate(fmt: Any, param: str) -> int:
    if isinstance(fmt, str):  # the beta shape: "pcm16"
        if fmt not in BETA_FORMATS:
            raise EventError(f"input_audio_format {fmt!r} is not supported; use pcm16", param=param,
                             code="unsupported_audio_format")
        return BETA_FORMATS[fmt]
    if not isinstance(fmt, dict) or fmt.get("type", PCM_TYPE) != PCM_TYPE:
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise EventError(f"audio format {kind!r} is not supported; use audio/pcm", param=param,
                         code="unsupported_audio_format")
    rate = fmt.get("rate", DEFAULT_RATE)
    if rate not in RATES:
        raise EventError(f"audio/pcm rate must be 24000 (or 16000), got {rate!r}", param=f"{param}.rate",
                         code="unsupported_audio_format")
    return int(rate)


def apply_update(config: SessionConfig, event: dict[str, Any], languages: Any) -> SessionConfig:
    """A session.update / transcription_session.update -> the new settings (EventError: unchanged)."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise EventError("Missing required parameter: 'session'", code="missing_required_parameter",
                         param="session")
    if event["type"] == GA_UPDATE:
        if session.get("type", "transcription") != "transcription":
            raise EventError(f"session.type {session.get('type')!r} is not supported: this server transcribes "
                             "(type \"transcription\")", param="session.type")
        source = _object(_object(session, "audio", "session"), "input", "session.audio")
        prefix = "session.audio.input"
        fmt_key, transcription_key = "format", "transcription"
    else:
        source, prefix, fmt_key, transcription_key = session, "session", "input_audio_format", "input_audio_transcription"
    changes: dict[str, Any] = {}
    if source.get(fmt_key) is not None:
        changes["rate"] = _rate(source[fmt_key], f"{prefix}.{fmt_key}")
    if "turn_detection" in source:
        changes["turn_detection"] = _turn_detection(source["turn_detection"], f"{prefix}.turn_detection",
                                                    config.turn_detection)
    param = f"{prefix}.{transcription_key}"
    transcription = _object(source, transcription_key, prefix)
    for key in ("model", "language", "prompt"):
        value = _get(transcription, key, str, param)
        if value is not None:
            changes[key] = value or ("auto" if key == "language" else "")
    language_key = "language"
    first = _first_language(transcription, param)
    if first and changes.get("language", "auto") == "auto":  # `language` wins when both are given
        changes["language"], language_key = first, "languages"
    if changes.get("language", "auto") not in languages:
        raise EventError(f"language {quoted(changes['language'])} is not supported; this model knows "
                         f"{', '.join(languages)}", param=f"{param}.{language_key}")
    return dataclasses.replace(config, **changes)


# ---- server events ------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"event_id": new_id("event"), "type": kind, **fields}


def session_object(session_id: str, config: SessionConfig) -> dict[str, Any]:
    """The transcription session as the GA API describes it (RealtimeTranscriptionSessionCreateResponse)."""
    vad = config.turn_detection
    turn_detection: dict[str, Any] | None = None
    if vad is not None and vad.eagerness is not None:
        turn_detection = {"type": "semantic_vad", "eagerness": vad.eagerness}
    elif vad is not None:
        turn_detection = {"type": "server_vad", "threshold": vad.threshold,
                          "prefix_padding_ms": vad.prefix_padding_ms, "silence_duration_ms": vad.silence_duration_ms}
    transcription = {"model": config.model, "language": None if config.language == "auto" else config.language,
                     "prompt": config.prompt}
    return {"id": session_id, "object": "realtime.transcription_session", "type": "transcription",
            "audio": {"input": {"format": {"type": PCM_TYPE, "rate": config.rate}, "noise_reduction": None,
                                "transcription": transcription, "turn_detection": turn_detection}},
            "include": [],
            # the beta shape's fields too, for clients of transcription_session.update
            "input_audio_format": "pcm16", "input_audio_transcription": transcription,
            "turn_detection": turn_detection}


def error_event(message: str, code: str | None, param: str | None = None, event_id: str | None = None,
                kind: str = "invalid_request_error") -> dict[str, Any]:
    return event("error", error={"type": kind, "code": code, "message": message, "param": param,
                                 "event_id": event_id})


def parse_event(text: str) -> dict[str, Any]:
    """A client event's JSON -> dict with a string `type` (EventError otherwise)."""
    try:
        data = loads_shallow(text)
    except ValueError as exc:
        raise EventError(f"The server could not parse the event: {exc}", code="invalid_json") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise EventError("An event must be a JSON object with a string 'type'", code="invalid_json")
    return data
