"""OpenAI's speech-to-text HTTP API on the stream port: POST /v1/audio/transcriptions, GET /v1/models.

An upload is decoded block by block as it is segmented (server/audio_file.py: any format, rate and channel
count soundfile reads; never the whole file at once), cut by the same VAD
(StreamSession, no partials) and decoded by the same worker as live streams, as BATCH jobs: after every
waiting final, taking turns with partials (server/worker.py), at most FILE_JOBS_IN_FLIGHT at a time, so a
long file neither starves live streams nor fills the queue. It counts as one session against
--max-sessions while it runs. An upload that continues the same client's previous one in real time (a live
client's VAD cut both from one stream) is heard after the end of that one (server/upload_sequence.py).
The shapes live in server/openai_shapes.py; POST bodies reach us through server/http_body.py. Errors are
OpenAI's error object with the status its clients expect.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import uuid
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

import h11
import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from pipeline.audio import SAMPLE_RATE, AudioFormat
from pipeline.errors import AudioFormatError, OverloadError, ProtocolError, UnipadError
from pipeline.segmenter import SegmentFinished
from pipeline.stream import StreamSession
from pipeline.trim import Continuation, prepared, shifted, sound_end

from .audio_file import audio_blocks, no_samples, open_audio
from .http import client_address, json_response, note_client_address, request_token, token_refusal
from .http_body import BODY_TIMEOUT, BodyTooLarge, HttpExchange, HttpRequest
from .openai_shapes import (CONTENT_TYPES, ApiError, TranscriptionForm, delta_event, done_event, full_text,
                            model_object, models_body, parse_form, response_body, sse)
from .protocol import STREAM_PATH, Final, TokenTime
from .upload_sequence import Upload
from .worker import BATCH, Job

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"  # not served: answered with why (docs/openai.md)
MODELS_PATH = "/v1/models"
MAX_UPLOAD_BYTES = 25 << 20  # OpenAI's own limit for this endpoint (25 MB); larger bodies get 413
FILE_JOBS_IN_FLIGHT = 2  # an upload's segments queued or in inference at once (the worker stays busy)
FEED_SECONDS = 10  # an upload is decoded and segmented 10 s at a time, off the event loop
JOB_TIMEOUT = 120.0  # seconds one segment may wait for the worker before the request fails (503)
DEFAULT_LANGUAGE = "auto"
Segment = tuple[Final, list[TokenTime]]  # a segment's final and its words


def invalid_file(exc: AudioFormatError) -> ApiError:
    return ApiError(400, f"Invalid file format: {exc}", param="file", code="invalid_file")


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


def get_response(app: Server, connection: ServerConnection, request: Request, path: str) -> Response:
    """GET /v1/models and /v1/models/<id> (websockets' process_request answers these)."""
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
        work = asyncio.ensure_future(FileTranscription(app, exchange).run(request))
        lost = exchange.connection.connection_lost_waiter
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client went away: stop decoding its file (run() cancels its jobs)
            work.cancel()
            log.info("openai request from %s: the client went away", client_address(exchange.connection))
            return
        work.result()
    except ApiError as exc:
        await answer_error(exchange, exc)
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


class FileTranscription:
    """One upload from its body to its answer; admitted like a stream, its jobs cancelled when it ends."""

    def __init__(self, app: Server, exchange: HttpExchange) -> None:
        self.app = app
        self.exchange = exchange
        self.id = uuid.uuid4().hex[:12]
        self._slots = asyncio.Semaphore(FILE_JOBS_IN_FLIGHT)
        self._samples = 0  # of the upload decoded so far, at SAMPLE_RATE
        self.hotwords: Any = None  # the ContextGraph (Qwen3Context) its segments decode with; None: the server's
        # The client (address, credentials, model, language) whose earlier upload this one may continue, and when
        # it arrived (server/upload_sequence.py); None: it continues none (the Deepgram door, --no-join-uploads).
        self.sequence_key: Hashable | None = None
        self.arrival = 0.0
        self.previous_arrival: float | None = None  # the same client's upload before it (the one it may continue)

    async def run(self, request: HttpRequest) -> None:
        length = request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"request body of {int(length)} bytes; the limit is {MAX_UPLOAD_BYTES} bytes",
                           code="file_too_large")
        # Counted like a stream from before its body is read: uploads in flight hold at most --max-sessions
        # bodies (each up to MAX_UPLOAD_BYTES), however many clients send one slowly.
        try:
            self.app.admit(self)  # type: ignore[arg-type]
        except OverloadError as exc:
            raise ApiError(503, str(exc), type="server_error", code="overloaded") from None
        try:
            await self._run_admitted(request)
        finally:
            self.app.release(self)  # type: ignore[arg-type]
            self.app.worker.cancel_session(self.id)

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
            async for final, final_words in results:
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

    async def segment_results(self, blocks: Iterator[Any], language: str,
                              timed_out: Callable[[str], Exception]) -> AsyncIterator[Segment]:
        """Each segment's (final, words), in order, as the worker delivers them, while the blocks are segmented
        and submitted (_submit_segments); `timed_out(message)` is raised when one takes longer than
        JOB_TIMEOUT, the producer's own error after the last. Run it under contextlib.aclosing: leaving early
        cancels the segments still queued (after a failure their results would go unread)."""
        pending: asyncio.Queue[asyncio.Future[Segment] | None] = asyncio.Queue()
        producer = asyncio.ensure_future(self._submit_segments(blocks, language, pending))
        try:
            while (future := await pending.get()) is not None:
                try:
                    result = await asyncio.wait_for(future, JOB_TIMEOUT)
                except asyncio.TimeoutError:
                    raise timed_out(f"no result from the model within {JOB_TIMEOUT:g} s; retry later") from None
                self._slots.release()
                yield result
            await producer  # its error, if any
        finally:
            producer.cancel()
            while not pending.empty():
                if (left := pending.get_nowait()) is not None:
                    left.cancel()

    async def _submit_segments(self, blocks: Iterator[Any], language: str, pending: asyncio.Queue[Any]) -> None:
        """Decode and segment the upload block by block (off the loop) and submit each segment,
        FILE_JOBS_IN_FLIGHT at most at once; queue each one's future in order, then None. An upload that
        continues an earlier one (server/upload_sequence.py) is placed after it on its timeline."""
        try:
            options = dataclasses.replace(self.app.segmenter_options, partial_interval=0.0)
            session = StreamSession(AudioFormat(SAMPLE_RATE, "f32le", 1), options)
            # a cut at the segment length limit falls inside speech: hear the end of the one before
            continuation = Continuation(options) if self.app.engine.family.word_times else None
            joining = continuation is not None and self.sequence_key is not None
            block = await asyncio.to_thread(next, blocks, None)
            following = None if block is None else await asyncio.to_thread(next, blocks, None)
            # Where the upload starts on its timeline, and its samples up to its last sound: a client's digital
            # silence after it (pipecat appends 0.5 s to each piece) is not part of the stream it was cut from.
            offset, sound = 0.0, 0
            while block is not None:
                if joining:
                    block_sound = sound_end(block)
                    sound = self._samples + block_sound if block_sound else sound
                    if not self._samples and following is None:  # a whole upload in one block: its length is known
                        earlier = self.app.uploads.continued(self.sequence_key, self.arrival, sound / SAMPLE_RATE,
                                                             self.previous_arrival)
                        if earlier is not None:
                            continuation, offset = earlier.continuation, earlier.end
                            log.debug("an upload from %s continues the one before it", self.sequence_key[0])
                events = await asyncio.to_thread(self._feed, block, session)
                await self._submit_each(events, language, continuation, offset, pending)
                block, following = following, (None if following is None else await asyncio.to_thread(next, blocks, None))
            await self._submit_each(session.finish(), language, continuation, offset, pending)
            if joining:
                self.app.uploads.keep(Upload(self.sequence_key, self.arrival, round(offset + sound / SAMPLE_RATE, 6),
                                             continuation.tail()))
        except AudioFormatError as exc:  # found while decoding (a NaN sample)
            raise invalid_file(exc) from None
        finally:
            pending.put_nowait(None)

    async def _submit_each(self, events: list[Any], language: str, continuation: Continuation | None, offset: float,
                           pending: asyncio.Queue[Any]) -> None:
        for event in events:
            if isinstance(event, SegmentFinished):
                await self._slots.acquire()
                pending.put_nowait(self._submit(shifted(event, offset) if offset else event, language, continuation,
                                                offset))

    def _feed(self, block: np.ndarray, session: StreamSession) -> list[Any]:
        """One block of the file through the segmenter (on a thread)."""
        self._samples += len(block)
        return session.feed(block.astype("<f4").tobytes())

    def _submit(self, event: SegmentFinished, language: str, continuation: Continuation | None,
                offset: float = 0.0) -> asyncio.Future[Segment]:
        """`event` on the upload's timeline (`offset` s from the upload's start); its answer in the upload's time."""
        future: asyncio.Future[Segment] = asyncio.get_running_loop().create_future()
        event, context, said = prepared(event, self.app.segmenter_options, continuation)

        def deliver(job: Job, transcript: Any, error: UnipadError | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(ApiError(500, f"inference failed: {error}", type="server_error",
                                              code=error.code))
                return

            def back(t: float) -> float:  # the timeline's seconds -> the upload's
                return round(t - offset, 6) if offset else t
            future.set_result((Final(  # the model's tokens, as a live stream's final has them
                segment=job.segment, text=transcript.text, start=back(job.start), end=back(job.end),
                language=transcript.language, emotion=transcript.emotion, event=transcript.event,
                tokens=[TokenTime(t.text, back(t.start), back(t.end)) for t in transcript.tokens]),
                [TokenTime(w.text, back(w.start), back(w.end)) for w in transcript.words]))

        self.app.worker.submit(Job(session=self.id, kind=BATCH, segment=event.segment, start=event.start,
                                   end=event.end, audio_start=event.audio_start, audio=event.audio,
                                   deliver=deliver, language=language,
                                   hotwords=self.hotwords or self.app.server_hotword_graph,
                                   context=context, said=said))
        return future
