"""OpenAI's speech-to-text HTTP shapes, pure: the upload form, the response bodies, errors and events.

As openai-python defines them (src/openai/types/audio/: Transcription, TranscriptionVerbose,
TranscriptionSegment, TranscriptionWord, TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent; and
resources/audio/transcriptions.py for the form fields). server/openai_http.py does the I/O.
"""
from __future__ import annotations

import io
import json
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import multipart

from pipeline.errors import quoted
from pipeline.subtitles import to_srt, to_vtt

from pipeline.transcript import join_texts
from .protocol import Final, TokenTime

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAM_FORMATS = ("json", "text")  # OpenAI streams only these (its gpt-4o-transcribe models)
GRANULARITIES = ("segment", "word")
MAX_FORM_FIELD = 64 << 10  # bytes of a form field that is not the file (a prompt is a few hundred)
LANGUAGE_NAMES = {"en": "english", "zh": "chinese", "yue": "cantonese", "ja": "japanese", "ko": "korean"}
CONTENT_TYPES = {
    "json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8",
}


class ApiError(Exception):
    """An error answered as OpenAI's error object with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class TranscriptionForm:
    """The fields of a POST /v1/audio/transcriptions (temperature, chunking_strategy etc. are accepted and
    ignored: the model decodes greedily)."""

    file: bytes
    filename: str
    model: str
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    granularities: tuple[str, ...] = ()
    stream: bool = False


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0", ""):
        return False
    raise ApiError(400, f"{name} must be true or false, got {value!r}", param=name, code="invalid_value")


def _check_temperature(value: str) -> None:
    """Ignored (the model decodes greedily), but refused as OpenAI refuses it when it is not a number from 0
    to 1: a client that sends one means something by it."""
    try:
        ok = not value or 0.0 <= float(value) <= 1.0
    except ValueError:
        ok = False
    if not ok:
        raise ApiError(400, f"temperature must be a number from 0 to 1, got {value!r}", param="temperature",
                       code="invalid_value")


def parse_form(content_type: str, body: bytes) -> TranscriptionForm:
    """A multipart/form-data body -> its fields; ApiError 400 naming the first bad one."""
    kind, options = multipart.parse_options_header(content_type)
    if kind != "multipart/form-data":
        raise ApiError(400, f"the body must be multipart/form-data, got {content_type or 'no Content-Type'!r}")
    if not options.get("boundary"):
        raise ApiError(400, "the multipart/form-data Content-Type has no boundary parameter")
    fields: dict[str, list[str]] = {}
    upload: tuple[str, bytes] | None = None
    try:
        parser = multipart.MultipartParser(io.BytesIO(body), options["boundary"],
                                           content_length=len(body), memory_limit=len(body) + 1,
                                           spool_limit=len(body) + 1, partsize_limit=len(body) + 1)
        for part in parser:
            if part.name == "file":
                upload = (part.filename or "audio", part.raw)
            elif part.size > MAX_FORM_FIELD:
                raise ApiError(400, f"form field {part.name!r} is over {MAX_FORM_FIELD} bytes", param=part.name)
            else:
                try:
                    text = part.value  # decoded with the part's charset (UTF-8 unless it names one)
                except (LookupError, UnicodeDecodeError) as exc:  # an unknown charset, bytes not in it
                    raise ApiError(400, f"form field {quoted(part.name)} is not text in its charset: {exc}",
                                   param=part.name, code="invalid_value") from None
                fields.setdefault(part.name, []).append(text)
    except multipart.MultipartError as exc:
        raise ApiError(400, f"malformed multipart/form-data body: {exc}") from None
    if upload is None:
        raise ApiError(400, "no file: send the audio as the form's 'file' field", param="file")
    value = {name: values[-1] for name, values in fields.items()}
    if not value.get("model"):
        raise ApiError(400, "you must provide a model parameter", param="model", code="missing_required_parameter")
    response_format = value.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}",
                       param="response_format", code="invalid_value")
    granularities = tuple(fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", []))
    for g in granularities:
        if g not in GRANULARITIES:
            raise ApiError(400, f"timestamp_granularities[] must be segment or word, got {g!r}",
                           param="timestamp_granularities[]", code="invalid_value")
    if granularities and response_format != "verbose_json":
        raise ApiError(400, "response_format must be verbose_json to use timestamp granularities",
                       param="timestamp_granularities[]", code="invalid_value")
    _check_temperature(value.get("temperature", ""))
    stream = _flag(value.get("stream", ""), "stream")
    if stream and response_format not in STREAM_FORMATS:
        raise ApiError(400, f"streaming supports response_format json or text, not {response_format}",
                       param="stream", code="unsupported_value")
    # gpt-transcribe's plural field (LiveKit's openai plugin sends `languages[]` for it): this model
    # decodes one language, so the first one listed stands for `language` when that is not given
    languages = fields.get("languages[]", []) + fields.get("languages", [])
    language = value.get("language") or next((code for code in languages if code), None)
    return TranscriptionForm(upload[1], upload[0], value["model"], language,
                             value.get("prompt") or None, response_format, granularities, stream)


# ---- responses -----------------------------------------------------------------------------------------

def full_text(finals: Sequence[Final]) -> str:
    return join_texts([f.text for f in finals])


def _segment(index: int, final: Final) -> dict[str, Any]:
    text = final.text
    compressed = len(zlib.compress(text.encode())) if text else 1
    return {"id": index, "seek": int(round(final.start * 100)), "start": final.start, "end": final.end,
            "text": text, "tokens": [], "temperature": 0.0, "avg_logprob": 0.0,
            "compression_ratio": round(len(text.encode()) / compressed, 4), "no_speech_prob": 0.0}


def response_body(form: TranscriptionForm, finals: Sequence[Final], words: Sequence[TokenTime], duration: float,
                  language: str) -> str:
    """The body of a non-streaming answer in `form.response_format`. `finals` carry the model's tokens (the
    subtitles split long ones at them, as for live streams); `words` are every final's words, in order."""
    text = full_text(finals)
    usage = {"type": "duration", "seconds": round(duration, 3)}
    if form.response_format == "text":
        return text + "\n"
    if form.response_format == "srt":
        return to_srt(finals)
    if form.response_format == "vtt":
        return to_vtt(finals)
    if form.response_format == "json":
        return json.dumps({"text": text, "usage": usage}, ensure_ascii=False)
    body: dict[str, Any] = {"task": "transcribe", "language": LANGUAGE_NAMES.get(language, language),
                            "duration": round(duration, 3), "text": text}
    if "segment" in form.granularities or not form.granularities:
        body["segments"] = [_segment(i, f) for i, f in enumerate(finals)]
    if "word" in form.granularities:
        body["words"] = [{"word": w.text.strip(), "start": w.start, "end": w.end} for w in words if w.text.strip()]
    body["usage"] = usage
    return json.dumps(body, ensure_ascii=False)


def sse(event: dict[str, Any]) -> str:
    """One server-sent event as OpenAI sends them: a data line holding the JSON event, then a blank line."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


def delta_event(delta: str) -> str:
    return sse({"type": "transcript.text.delta", "delta": delta})


def done_event(text: str) -> str:
    return sse({"type": "transcript.text.done", "text": text})  # its usage is in tokens: we bill none


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(model)]}


def model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "unipad"}
