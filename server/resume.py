"""The `resume` of a start message: a client continues a stream that a drained, failed or unreachable
server left unfinished, on any server (docs/protocol.md, "Resuming a stream").

The server keeps nothing for resumption: the client carries what matters, its stream's identity, the next
segment number and the stream time its re-sent audio starts at (the end of the last final it received).
So a resume can only continue the caller's own numbering and times, and this module only checks that
what it carries is well-formed and consistent. Pure: no asyncio, no sockets.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ProtocolError, quoted
from pipeline.json_text import finite_number
from pipeline.segmenter import FRAME_SECONDS

MAX_RESUME_TIME = 1e7  # seconds (115 days): beyond it a stream time is nonsense, not a long meeting
GRID_TOLERANCE = 0.0006  # the wire rounds times to 1 ms: a grid time may be off by half of that
_SESSION = re.compile(r"[A-Za-z0-9_-]{1,64}")  # whole (fullmatch): "$" would let a newline end it
_FIELDS = ("session", "segment", "time")


@dataclass(frozen=True)
class Resume:
    session: str  # the stream's identity: the session id of the `ready` that began it
    segment: int  # the number of the next segment (one more than the last final received)
    time: float  # stream seconds of the first re-sent sample: the end of the last final, on the VAD frame grid

    @property
    def frame(self) -> int:
        return round(self.time / FRAME_SECONDS)


def _bad(message: str) -> ProtocolError:
    return ProtocolError(f"resume: {message}", code="bad_resume")


def parse_resume(data: Any) -> Resume:
    """A start's `resume` object -> Resume; ProtocolError `bad_resume` naming what is wrong."""
    if isinstance(data, Resume):
        return data
    if not isinstance(data, dict):
        raise _bad(f"must be an object with {', '.join(_FIELDS)}")
    unknown = set(data) - set(_FIELDS)
    if unknown:
        raise _bad(f"unknown field(s) {', '.join(sorted(unknown))}")
    missing = [name for name in _FIELDS if name not in data]
    if missing:
        raise _bad(f"missing field(s) {', '.join(missing)}")
    session, segment, time = data["session"], data["segment"], data["time"]
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise _bad("session must be the stream's session id (1-64 letters, digits, '_' or '-')")
    if not finite_number(time):
        raise _bad(f"time must be a number of seconds, got {quoted(time)}")
    if not 0 <= time <= MAX_RESUME_TIME:
        raise _bad(f"time must be from 0 to {MAX_RESUME_TIME:g} s, got {time!r}")
    frame = round(time / FRAME_SECONDS)
    if abs(frame * FRAME_SECONDS - time) > GRID_TOLERANCE:
        raise _bad(f"time {time!r} is not on the {FRAME_SECONDS * 1000:g} ms frame grid: resume at the end "
                   "of the last final received")
    # Each segment needs at least one frame of its own: no stream reaches more segments than frames.
    if not isinstance(segment, int) or isinstance(segment, bool) or not 0 <= segment <= frame:
        raise _bad(f"segment must be an integer from 0 to {frame} (one per 30 ms of stream time), got {segment!r}")
    return Resume(session=session, segment=segment, time=round(frame * FRAME_SECONDS, 6))
