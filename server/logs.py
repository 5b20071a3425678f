"""The server's log: what an operator reads, at a rate that does not depend on how often it is probed.

    configure_logging(level, format)   the process's handler on stderr: "text" (time level logger: message)
                                       or "json" (one object per line for log collectors: time, level,
                                       logger, message, plus a record's structured `fields`)
    quiet_requests(logger)             websockets' INFO lines ("connection open", "HTTP response sent
                                       (200 OK)", "connection rejected", "connection closed", one or two
                                       per request) become DEBUG: a health probe every few seconds, or the
                                       page's assets, must not flood an INFO log
    StreamLog                          one INFO line when a stream starts (session, client address,
                                       model) and one when it ends (seconds of audio, wall time, segments,
                                       close code); an end by error is a WARNING with its error code
Structured fields travel as `extra={"fields": {...}}`; the text format shows them only through the message.
"""
from __future__ import annotations

import datetime
import json
import logging
import time
from typing import Any

from .http import client_address

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ABNORMAL_CLOSE = 1006  # no close frame (RFC 6455): the TCP connection just ended


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, ms), level, logger, message, then the record's
    `fields` and, with an exception, its traceback as `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        entry: dict[str, Any] = {"time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key, value in getattr(record, "fields", {}).items():
            entry.setdefault(key, value)  # a field never hides the record's own keys
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log records at `level` ("info", ...) and above to stderr, as `log_format` ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


class QuietRequests(logging.Filter):
    """Turns a logger's INFO records into DEBUG ones (dropped unless the logger is enabled for DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_requests(logger: logging.Logger) -> logging.Logger:
    """Add one QuietRequests filter to websockets' `logger` (idempotent); returns the logger."""
    if not any(isinstance(f, QuietRequests) for f in logger.filters):
        logger.addFilter(QuietRequests())
    return logger


class StreamLog:
    """The start and end lines of one stream (server/streaming.py StreamConnection.run), logged under the
    connection's own logger and name ("session" on /v1/stream, "funasr session" on the FunASR port)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.began = time.monotonic()
        self.code: str | None = None  # the error code that ended the stream, if one did
        self.reason = ""  # why it ended, when not with `done` (the error message, "client went away")
        self.bug: BaseException | None = None  # an unexpected exception: its traceback goes with the end line

    def started(self) -> None:
        c = self.connection
        fields = {"event": "stream_start", "session": c.id, "client": self._client(), "model": c.app.model_name}
        c.log.info("%s %s started: client %s, model %s", c.log_name, c.id, fields["client"], fields["model"],
                   extra={"fields": fields})

    def fail(self, code: str, reason: str, bug: BaseException | None = None) -> None:
        self.code, self.reason, self.bug = code, reason, bug

    def ended(self) -> None:
        c = self.connection
        closed = c.ws.protocol.close_sent  # the code this server closed with (or echoed to the client)
        fields = {"event": "stream_end", "session": c.id, "client": self._client(), "model": c.app.model_name,
                  "audio_s": round(c.audio_seconds(), 3),
                  "duration_s": round(time.monotonic() - self.began, 3), "segments": c.segments_finished(),
                  "close": closed.code if closed is not None else _ABNORMAL_CLOSE, "code": self.code}
        how = f"error {self.code}: {self.reason}" if self.code else self.reason or "done"
        level = logging.ERROR if self.bug else logging.WARNING if self.code else logging.INFO
        c.log.log(level, "%s %s ended (%s): %.1f s of audio in %.1f s, %d segments, close %d, client %s",
                  c.log_name, c.id, how, fields["audio_s"], fields["duration_s"], fields["segments"],
                  fields["close"], fields["client"], exc_info=self.bug, extra={"fields": fields})

    def _client(self) -> str:
        return client_address(self.connection.ws)
