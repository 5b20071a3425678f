"""Deepgram pre-recorded transcription on the stream port: POST /v1/listen with the audio as the body.

The body is any format server/audio_file.py reads (WAV, FLAC, OGG, MP3, ...), or raw audio when the query
names an `encoding` (with sample_rate). Segmented and decoded as every door's uploads are (server/uploads.py:
the same VAD, BATCH jobs taking turns with live streams, one session against --max-sessions); with
multichannel=true each channel is its own pass. The answer is Deepgram's response
(server/deepgram_shapes.py); `utterances=true` adds results.utterances. A JSON body naming a `url` is
refused unless the server runs with --fetch-urls: by default it makes no requests to addresses a client
names (a server-side request forgery). Errors are Deepgram's error body.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import uuid
from typing import TYPE_CHECKING, Iterator
from urllib.parse import parse_qs, urlsplit

import h11
import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from pipeline.audio import SAMPLE_RATE
from pipeline.errors import AudioFormatError
from pipeline.json_text import loads_shallow

from .audio_file import BLOCK_SECONDS, file_blocks, mono_blocks, open_audio
from .deepgram_audio import PcmDecoder
from .deepgram_shapes import (LISTEN_PATH, MAX_CHANNELS, TOKEN_SUBPROTOCOL, DeepgramError, ListenOptions, Utterance,
                              parse_listen_query, prerecorded_body, response_metadata, sha256_hex)
from .http import client_address, json_response, note_client_address, token_refusal
from .http_body import BODY_TIMEOUT, BodyTooLarge, HttpExchange, HttpRequest
from .uploads import MAX_UPLOAD_BYTES, FileTranscription, UploadError, unless_client_leaves

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger(__name__)
MAX_JSON_BODY = 64 << 10  # a {"url": ...} request
FETCH_TIMEOUT = 30.0  # seconds a --fetch-urls download may stall


# ---- the handshake -------------------------------------------------------------------------------------


def handshake_key(headers: Headers, query: str) -> str | None:
    """The API key as Deepgram's clients send it: `Authorization: Token KEY` (or Bearer), the browsers'
    `Sec-WebSocket-Protocol: token, KEY`, or ?token=."""
    auth = headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    offered = [p.strip() for v in headers.get_all("Sec-WebSocket-Protocol") for p in v.split(",")]
    if TOKEN_SUBPROTOCOL in offered and offered.index(TOKEN_SUBPROTOCOL) + 1 < len(offered):
        return offered[offered.index(TOKEN_SUBPROTOCOL) + 1]
    return (parse_qs(query).get("token") or [None])[0]


def authorize(app: Server, connection: ServerConnection, headers: Headers, query: str) -> None:
    """The --token policy in Deepgram's words: DeepgramError 401 (wrong or missing key) or 429 (cooldown)."""
    if app.config.token is None:
        return
    refused = token_refusal(app, connection, handshake_key(headers, query), "a deepgram request")
    if refused is not None and refused[0] == 429:
        raise DeepgramError(429, f"too many failed authentications; retry in {refused[1]:.0f} s", "TOO_MANY_REQUESTS")
    if refused is not None:
        raise DeepgramError(401, "Invalid credentials: send the server's --token as the API key "
                            "(Authorization: Token KEY)", "INVALID_AUTH")


def check_handshake(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """Parameters and key, before the WebSocket opens: a Deepgram error body with 400/401/429, or None."""
    request_id = str(uuid.uuid4())
    query = urlsplit(request.path).query
    try:
        options = parse_listen_query(query, app.model.manifest.languages)
        authorize(app, connection, request.headers, query)
    except DeepgramError as exc:
        if exc.status == 400:  # authorize() counts its own refusals
            app.metrics.sessions_refused.labels("bad_request").inc()
        return json_response(exc.status, exc.body(request_id))
    connection.authenticated = True  # type: ignore[attr-defined]
    connection.deepgram = (options, request_id)  # type: ignore[attr-defined]
    return None


def get_response(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """GET /v1/listen: the WebSocket handshake (server/deepgram_live.py), or a 405 for a plain GET."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return check_handshake(app, connection, request)
    error = DeepgramError(405, f"GET {LISTEN_PATH} is a WebSocket (live streaming); POST audio to it to transcribe "
                          "a recording", "METHOD_NOT_ALLOWED")
    return json_response(405, error.body(str(uuid.uuid4())))


async def handle(app: Server, exchange: HttpExchange, request: HttpRequest) -> None:
    """POST /v1/listen (any other method: 405), answered with Deepgram's response or error body."""
    request_id = str(uuid.uuid4())
    note_client_address(app, exchange.connection, request.headers)
    try:
        if request.method != "POST":
            raise DeepgramError(405, f"{request.method} is not allowed on {LISTEN_PATH}; use POST", "METHOD_NOT_ALLOWED")
        query = request.path.partition("?")[2]
        options = parse_listen_query(query, app.model.manifest.languages)
        authorize(app, exchange.connection, request.headers, query)
        await unless_client_leaves(exchange, DeepgramFile(app, exchange, options, request_id).run(request), log,
                                   "deepgram")
    except DeepgramError as exc:
        await _answer(exchange, exc, request_id)
    except UploadError as exc:  # from the shared upload machinery: the same status, Deepgram's body
        await _answer(exchange, DeepgramError(exc.status, exc.message, exc.code or "Bad Request"), request_id)
    except h11.RemoteProtocolError as exc:
        await _answer(exchange, DeepgramError(400, f"malformed HTTP request: {exc}"), request_id)
    except (ConnectionError, asyncio.TimeoutError):
        log.info("deepgram request from %s: the client went away", client_address(exchange.connection))
    except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
        log.exception("deepgram request: internal error")
        await _answer(exchange, DeepgramError(500, f"internal error: {type(exc).__name__}", "INTERNAL_SERVER_ERROR"),
                      request_id)


async def _answer(exchange: HttpExchange, error: DeepgramError, request_id: str) -> None:
    await exchange.respond(error.status, json.dumps(error.body(request_id)) + "\n", "application/json")


class DeepgramFile(FileTranscription):
    """One pre-recorded request: the upload machinery, Deepgram's body."""

    def __init__(self, app: Server, exchange: HttpExchange, options: ListenOptions, request_id: str) -> None:
        super().__init__(app, exchange)
        self.options, self.request_id = options, request_id
        self.punctuate = options.punctuate  # Deepgram punctuates only when asked (punctuate=true)

    async def run(self, request: HttpRequest) -> None:
        # counted like a stream from before its body is read, as every door's upload (server/uploads.py)
        with self.admitted(functools.partial(DeepgramError, 503, code="SERVICE_UNAVAILABLE")):
            body = await self._body(request)
            if request.headers.get("Content-Type", "").split(";")[0].strip().lower() == "application/json":
                body = await self._fetch(_url_of(body))
            channels = await asyncio.to_thread(self._channel_count, body)
            self.hotwords = self.app.lenient_hotword_graph(self.options.hotwords, f"deepgram request {self.id}", log)
            utterances: list[Utterance] = []
            for channel in range(channels if self.options.multichannel else 1):
                self._samples = 0
                blocks = self._blocks(body, channel)
                utterances += await self._channel(blocks, channel)
        utterances.sort(key=lambda u: (u.start, u.channel))
        metadata = response_metadata(request_id=self.request_id, sha256=sha256_hex(body),
                                     duration=self._samples / SAMPLE_RATE, channels=channels,
                                     served=self.app.model_name, requested=self.options.model)
        answer = prerecorded_body(metadata, utterances, channels if self.options.multichannel else 1,
                                  self.options.utterances)
        await self.exchange.respond(200, json.dumps(answer, ensure_ascii=False) + "\n", "application/json")

    async def _body(self, request: HttpRequest) -> bytes:
        try:
            return await self.exchange.read_body(MAX_UPLOAD_BYTES)
        except BodyTooLarge:
            raise DeepgramError(413, f"request body over the limit of {MAX_UPLOAD_BYTES} bytes",
                                "PAYLOAD_TOO_LARGE") from None
        except asyncio.TimeoutError:
            raise DeepgramError(408, f"the request body stalled: nothing arrived for {BODY_TIMEOUT:g} s",
                                "REQUEST_TIMEOUT") from None

    async def _fetch(self, url: str) -> bytes:
        """The audio at `url`, with --fetch-urls; refused without (no requests to addresses clients name)."""
        if not self.app.config.fetch_urls:
            raise DeepgramError(400, f"this server does not fetch audio from URLs ({url[:80]!r}): it makes no "
                                "requests to addresses a client names unless started with --fetch-urls. POST the "
                                "audio itself as the body (Content-Type: audio/wav or application/octet-stream)")
        if urlsplit(url).scheme not in ("http", "https"):
            raise DeepgramError(400, f"url must be http:// or https://, got {url[:80]!r}")
        try:
            return await asyncio.to_thread(_download, url)
        except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
            raise DeepgramError(400, f"could not fetch {url[:80]!r}: {exc}") from None

    def _channel_count(self, body: bytes) -> int:
        if self.options.encoding is not None:
            return self.options.channels
        try:
            channels = open_audio(body, "audio").channels
        except AudioFormatError as exc:
            raise DeepgramError(400, f"failed to process audio: {exc}") from None
        if self.options.multichannel and channels > MAX_CHANNELS:  # each channel is a pass over the whole file
            raise DeepgramError(400, f"multichannel=true takes at most {MAX_CHANNELS} channels; the file has "
                                     f"{channels}")
        return channels

    def _blocks(self, body: bytes, channel: int) -> Iterator[np.ndarray]:
        """One channel (or, without multichannel, all averaged) as float32 blocks at SAMPLE_RATE."""
        rate, raw = self._raw_blocks(body)  # lazily: FileTranscription reads the blocks in a thread
        yield from mono_blocks(rate, raw, channel if self.options.multichannel else None)

    def _raw_blocks(self, body: bytes) -> tuple[int, Iterator[np.ndarray]]:
        """The body's rate and its float32 [frames, channels] blocks at that rate, the last one empty."""
        if self.options.encoding is None:
            file = open_audio(body, "audio")
            return file.samplerate, file_blocks(file)
        rate = self.options.sample_rate or SAMPLE_RATE
        decoder = PcmDecoder(self.options.encoding, self.options.channels)
        step = BLOCK_SECONDS * rate * decoder.frame_bytes
        blocks = (decoder.feed(body[i:i + step]) for i in range(0, len(body), step))
        return rate, itertools.chain(blocks, [np.zeros((0, self.options.channels), np.float32)])

    async def _channel(self, blocks: Iterator[np.ndarray], channel: int) -> list[Utterance]:
        """One channel's segments through the worker, in order."""
        unavailable = functools.partial(DeepgramError, 503, code="SERVICE_UNAVAILABLE")
        out = []
        try:
            async with contextlib.aclosing(self.segment_results(blocks, self.options.language, unavailable)) as results:
                async for final, words, punctuated in results:
                    out.append(Utterance(channel, final.start, final.end, final.text, tuple(words),
                                         None if punctuated is None else tuple(punctuated)))
        except AudioFormatError as exc:
            raise DeepgramError(400, f"failed to process audio: {exc}") from None
        return out


def _url_of(body: bytes) -> str:
    try:
        url = loads_shallow(body).get("url") if len(body) <= MAX_JSON_BODY else None
    except (ValueError, AttributeError):
        url = None
    if not isinstance(url, str):
        raise DeepgramError(400, "Content-Type was application/json, but the body is not a JSON object with a "
                            "string \"url\"")
    return url


def _download(url: str) -> bytes:
    """At most MAX_UPLOAD_BYTES, FETCH_TIMEOUT per read (on a thread)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as answer:  # noqa: S310 - http(s) only, checked
        data = answer.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise OSError(f"more than {MAX_UPLOAD_BYTES} bytes")
    return data
