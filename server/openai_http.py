"""OpenAI's speech-to-text HTTP API on the stream port: POST /v1/audio/transcriptions, GET /v1/models.

An upload is decoded block by block as it is segmented (server/audio_file.py: any format, rate and channel
count soundfile reads; never the whole file at once), by the upload machinery every door shares
(server/uploads.py: the same VAD and worker as live streams, BATCH jobs, one session against
--max-sessions, an upload continuing the same client's previous one heard after it).
The shapes live in server/openai_shapes.py; POST bodies reach us through server/http_body.py. Errors are
OpenAI's error object with the status its clients expect.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import h11
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from pipeline.audio import SAMPLE_RATE
from pipeline.errors import AudioFormatError, ProtocolError

from .audio_file import audio_blocks, no_samples, open_audio
from .http import client_address, json_response, note_client_address, request_token, response, token_refusal
from .http_body import BODY_TIMEOUT, BodyTooLarge, HttpExchange, HttpRequest
from .openai_shapes import (CONTENT_TYPES, ApiError, TranscriptionForm, delta_event, done_event, full_text,
                            model_object, models_body, parse_form, response_body, sse)
from .protocol import STREAM_PATH, Final, TokenTime
from .realtime_events import REALTIME_PATH
from .uploads import MAX_UPLOAD_BYTES, FileTranscription, UploadError, invalid_file, unless_client_leaves

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"  # not served: answered with why (docs/openai.md)
MODELS_PATH = "/v1/models"
FEED_SECONDS = 10  # an upload is decoded and segmented 10 s at a time, off the event loop
DEFAULT_LANGUAGE = "auto"


def error_response(error: ApiError) -> Response:
    return json_response(error.status, error.body())


def authorize(app: Server, connection: ServerConnection, request: Request) -> None:
    """The token policy for API requests: OpenAI's clients always send `Authorization: Bearer`; a missing
    or wrong token is 401, an address in its cooldown 429 (server/access.py)."""
    if app.config.token is None:
        return
    refused = token_refusal(app, connection, request_token(request), "an API request")
    if refused is not None and refused[0] == 429:
        raise ApiError(429, f"too many failed authentications; retry in {refused[1]:.0f} s", code="rate_limit_exceeded")
    if refused is not None:
        raise ApiError(401, "Incorrect API key provided (send the server's --token as the API key)",
                       code="invalid_api_key")


def check_origin(app: Server, headers: Any) -> None:
    """Browsers send Origin: with --allowed-origin set, other origins may not use the API."""
    origin = headers.get("Origin")
    if origin is not None and app.config.allowed_origins and origin not in app.config.allowed_origins:
        raise ApiError(403, f"origin {origin!r} is not allowed", code="origin_not_allowed")


def check_path(method: str, path: str) -> None:
    """404 for any path but the transcriptions endpoint, saying why for translations."""
    if path == TRANSLATIONS_PATH:
        raise ApiError(404, "Translation is not supported: this server only transcribes, in the language "
                       f"spoken (POST {TRANSCRIPTIONS_PATH})", code="unsupported_endpoint")
    if path != TRANSCRIPTIONS_PATH:  # OpenAI's words, then where a mistyped path probably meant to go
        raise ApiError(404, f"Invalid URL ({method} {path}); use {STREAM_PATH} to stream (WebSocket) or "
                       f"POST {TRANSCRIPTIONS_PATH} to upload a file")


def get_response(app: Server, connection: ServerConnection, request: Request) -> Response:
    """A GET under /v1/ that no other door claims: /v1/models and /v1/models/<id>, else OpenAI's 404 or 405
    (websockets' process_request answers these)."""
    path = urlsplit(request.path).path
    if request.headers.get("Upgrade", "").lower() == "websocket":  # e.g. /v1/streamx: the hint `/foo` gets
        return response(404, f"no WebSocket endpoint at {path}; use {STREAM_PATH} "
                             f"(or {REALTIME_PATH} for OpenAI Realtime)\n")
    try:
        check_origin(app, request.headers)
        authorize(app, connection, request)
        if path == MODELS_PATH:
            return json_response(200, models_body(app.model_name))
        if path == f"{MODELS_PATH}/{app.model_name}":
            return json_response(200, model_object(app.model_name))
        if path.startswith(MODELS_PATH + "/"):
            raise ApiError(404, f"The model '{path[len(MODELS_PATH) + 1:]}' does not exist", param="model",
                           code="model_not_found")
        check_path("GET", path)
        raise ApiError(405, f"GET is not allowed on {path}; use POST")
    except ApiError as exc:
        return error_response(exc)


async def handle(app: Server, exchange: HttpExchange, request: HttpRequest) -> None:
    """Any request other than a GET on the stream port (server/http_body.py)."""
    path = request.path.split("?", 1)[0]
    note_client_address(app, exchange.connection, request.headers)
    try:
        check_path(request.method, path)
        if request.method != "POST":
            raise ApiError(405, f"{request.method} is not allowed on {path}; use POST")
        check_origin(app, request.headers)
        authorize(app, exchange.connection, Request(request.path, request.headers))
        await unless_client_leaves(exchange, OpenAIFile(app, exchange).run(request), log, "openai")
    except ApiError as exc:
        await answer_error(exchange, exc)
    except UploadError as exc:  # from the shared upload machinery: OpenAI's error object
        await answer_error(exchange, ApiError(exc.status, exc.message, "server_error" if exc.status >= 500 else
                                              "invalid_request_error", exc.param, exc.code))
    except h11.RemoteProtocolError as exc:
        await answer_error(exchange, ApiError(400, f"malformed HTTP request: {exc}"))
    except (ConnectionError, asyncio.TimeoutError):
        log.info("openai request from %s: the client went away", client_address(exchange.connection))
    except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
        log.exception("openai request: internal error")
        await answer_error(exchange, ApiError(500, f"internal error: {type(exc).__name__}", type="server_error"))


async def answer_error(exchange: HttpExchange, error: ApiError) -> None:
    """The error response; once an event stream has begun, its last event instead (`data: {"error": ...}`,
    which the SDK raises as APIError), so the client learns why instead of seeing a cut-off stream."""
    if exchange.streaming:
        await exchange.send_part(sse(error.body()))
        await exchange.end_stream()
        return
    await exchange.respond(error.status, json.dumps(error.body()) + "\n", "application/json")


class OpenAIFile(FileTranscription):
    """One POST /v1/audio/transcriptions: the upload machinery (server/uploads.py), OpenAI's form and answers."""

    async def run(self, request: HttpRequest) -> None:
        length = request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"request body of {int(length)} bytes; the limit is {MAX_UPLOAD_BYTES} bytes",
                           code="file_too_large")
        # Counted like a stream from before its body is read: uploads in flight hold at most --max-sessions
        # bodies (each up to MAX_UPLOAD_BYTES), however many clients send one slowly.
        with self.admitted(functools.partial(ApiError, 503, type="server_error", code="overloaded")):
            await self._run_admitted(request)

    async def _run_admitted(self, request: HttpRequest) -> None:
        try:
            body = await self.exchange.read_body(MAX_UPLOAD_BYTES)
        except BodyTooLarge:
            raise ApiError(413, f"request body over the limit of {MAX_UPLOAD_BYTES} bytes",
                           code="file_too_large") from None
        except asyncio.TimeoutError:  # answered, not just closed: the client may retry (OpenAI's SDK does)
            raise ApiError(408, f"the request body stalled: nothing arrived for {BODY_TIMEOUT:g} s",
                           code="request_timeout") from None
        form = parse_form(request.headers.get("Content-Type", ""), body)
        language = form.language or DEFAULT_LANGUAGE
        if self.app.config.join_uploads:
            self.arrival = asyncio.get_running_loop().time()
            self.sequence_key = (client_address(self.exchange.connection), request.headers.get("Authorization"),
                                 form.model, language)
            self.previous_arrival = self.app.uploads.arrived(self.sequence_key, self.arrival)
        try:
            self.app.engine.language_id(language)
        except ProtocolError as exc:
            raise ApiError(400, str(exc), param="language", code="unsupported_language") from None
        if form.prompt and self.app.engine.family.prompt:  # its prompt's context; the CTC models take none
            try:
                self.hotwords = self.app.hotword_graph((), form.prompt)
            except ProtocolError as exc:
                raise ApiError(400, str(exc), param="prompt", code="invalid_prompt") from None
        try:
            audio = await asyncio.to_thread(open_audio, form.file, form.filename)
        except AudioFormatError as exc:
            raise invalid_file(exc) from None
        await self._transcribe(form, audio, language)

    async def _transcribe(self, form: TranscriptionForm, audio: Any, language: str) -> None:
        """`audio`: the open_audio() file, decoded FEED_SECONDS at a time as the segmenter takes it."""
        blocks = audio_blocks(audio, form.filename, FEED_SECONDS)
        finals: list[Final] = []
        words: list[TokenTime] = []
        overloaded = functools.partial(ApiError, 503, type="server_error", code="overloaded")
        async with contextlib.aclosing(self.segment_results(blocks, language, overloaded)) as results:
            async for final, final_words, _ in results:
                before = full_text(finals)
                finals.append(final)
                words += final_words
                if form.stream and full_text(finals) != before:
                    if not before:  # the first text: the event stream begins
                        await self._start_events()
                    await self.exchange.send_part(delta_event(full_text(finals)[len(before):]))
        if not self._samples:  # a header promising frames that are not there
            raise invalid_file(no_samples(form.filename))
        duration = self._samples / SAMPLE_RATE
        if form.stream:
            if not full_text(finals):
                await self._start_events()
            await self.exchange.send_part(done_event(full_text(finals)))
            await self.exchange.end_stream()
            return
        detected = next((f.language for f in finals if f.language), None) or language
        await self.exchange.respond(200, response_body(form, finals, words, duration, detected),
                                    CONTENT_TYPES[form.response_format])

    async def _start_events(self) -> None:
        await self.exchange.start_stream(200, "text/event-stream; charset=utf-8")
