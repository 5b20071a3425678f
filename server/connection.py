"""One WebSocket stream on STREAM_PATH: Unipad's messages (server/protocol.py) over the shared machinery
of server/streaming.py (receiving, backpressure, jobs, sending, closing), which also turns errors into
close codes.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from pipeline.errors import AudioFormatError, ProtocolError, UnipadError
from pipeline.stream import StreamSession

from .http import check_handshake_token
from .protocol import (CLOSE_GOING_AWAY, CLOSE_NORMAL, Done, Error, Final, Partial, Ready, Start, Stop, TokenTime, encode,
                       parse_client_message)
from .streaming import FLOOD_BURST, FLOOD_RATE, MAX_FINALS_IN_FLIGHT  # noqa: F401 - re-exported (tests)
from .streaming import StreamConnection, check_text_size
from .worker import Job

if TYPE_CHECKING:
    from .server import Server


def check_handshake(app: Server, connection: ServerConnection, request: Request) -> Response | None:
    """The stream's handshake: the token policy, where a missing token may still come in `start`."""
    return check_handshake_token(app, connection, request, "a stream")


class Connection(StreamConnection):
    """Handles one WebSocket on STREAM_PATH from the handshake to the close."""

    log = logging.getLogger(__name__)

    def __init__(self, app: Server, ws: ServerConnection) -> None:
        super().__init__(app, ws)
        self.start: Start | None = None
        self._segments = 0
        self._hotwords: Any = None  # ContextGraph of the server's and the stream's hotwords

    async def _serve(self) -> None:
        first = await self._next_message()
        if first is None:  # the server is shutting down before this stream started
            await self._close(CLOSE_GOING_AWAY, "server shutting down")
            return
        if isinstance(first, bytes):
            raise ProtocolError("audio before start: send a start message first", code="bad_order")
        message = self._parse(first)
        if isinstance(message, Stop):
            raise ProtocolError("stop before start: send a start message first", code="bad_order")
        self._check_token(message.token, "in start")
        self.app.engine.language_id(message.language)  # ProtocolError bad_start for a language it lacks
        self._hotwords = self.app.hotword_graph(message.hotwords or ())  # ProtocolError bad_start
        self.start = message
        options = self.app.segmenter_options
        if not message.partials:  # no partial windows to cut and copy for a client that ignores them
            options = dataclasses.replace(options, partial_interval=0.0)
        resume = message.resume
        try:
            self.session = StreamSession(message.audio_format, options, start_time=resume.time if resume else 0.0,
                                         first_segment=resume.segment if resume else 0)
        except AudioFormatError as exc:
            raise ProtocolError(str(exc), code="unsupported_audio") from None
        if resume is not None:  # numbering and times go on from the client's; nothing else is kept
            self._segments = resume.segment
            self.app.metrics.sessions_resumed.inc()
            self.log.info("session %s resumes stream %s at %.2f s, segment %d", self.id, resume.session,
                          resume.time, resume.segment)
        self._put(Ready(session=self.id, model=self.app.model_name, provider=self.app.provider))
        code = await self._stream()
        if code == CLOSE_GOING_AWAY and message.resumable:
            # Draining: send the finals of the segments already closed, but leave the open one uncut; the
            # client re-sends its audio to another server (a resume), where it ends as it would have here.
            await self._until_closed(self._finals_sent.wait())
            await self._close(code, "server shutting down; resume elsewhere")
            return
        await self._handle(self.session.finish())
        await self._until_closed(self._finals_sent.wait())
        self._put(Done(segments=self._segments))
        await self._close(code, "server shutting down" if code == CLOSE_GOING_AWAY else "")

    async def _stream(self) -> int:
        """Receive audio until `stop` (returns CLOSE_NORMAL) or server shutdown (CLOSE_GOING_AWAY)."""
        assert self.session is not None
        while True:
            message = await self._next_message()
            if message is None:
                return CLOSE_GOING_AWAY
            self._check_flood(self.session.received_seconds)
            if isinstance(message, str):
                if isinstance(self._parse(message), Stop):
                    return CLOSE_NORMAL
                raise ProtocolError("start sent twice: one start per stream", code="bad_order")
            await self._feed_audio(message)

    def _parse(self, text: str) -> Start | Stop:
        check_text_size(text, "; send audio as binary")
        return parse_client_message(text)

    # ---- the wire format of results -------------------------------------------------------------------

    def _error(self, code: str, message: str) -> Error:
        return Error(code=code, message=message)

    def _job_options(self) -> dict[str, Any]:
        assert self.start is not None
        return {"deliver": self._on_result, "language": self.start.language, "itn": self.start.itn,
                "hotwords": self._hotwords, "punctuate": True}

    def _count_final(self) -> None:
        self._segments += 1

    def _partial_item(self, job: Job, transcript: Any) -> Partial:
        return Partial(job.segment, transcript.text, job.start, job.end)

    def _on_final(self, job: Job, transcript: Any, error: UnipadError | None) -> None:
        if error is not None:
            message: Any = Error(code=error.code, message=str(error), segment=job.segment)
        else:
            message = Final(
                segment=job.segment, text=transcript.punctuated_text, start=job.start, end=job.end,
                language=transcript.language, emotion=transcript.emotion, event=transcript.event,
                tokens=[TokenTime(t.text, t.start, t.end) for t in transcript.tokens],
            )
        self._put(message, arrived=job.arrived)

    def _render(self, message: Any) -> str:
        return encode(message)

    def _sent(self, message: Any) -> None:
        if isinstance(message, Error):
            self.app.metrics.errors.labels(message.code).inc()
        elif isinstance(message, Partial):
            self.app.metrics.partials.inc()
