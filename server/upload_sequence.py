"""Uploads that one live stream was cut into: which earlier upload a new one continues. Pure; no I/O.

A client that cuts a live stream with its own VAD and uploads each piece (pipecat's OpenAISTTService, a
SegmentedSTTService: it uploads each turn its Silero VAD marks, and that VAD stops at 0.2 s pauses) sends
one utterance as several requests: a short word alone, or a word whose first sound ended the previous
upload ("f" + "our seven eight": "two" + "oh seven eight"), is then misheard (issue 36: 143 errors against
the whole uploads' 42 in 2944 words). The pieces follow each other in real time: the client sends each one
when its VAD stops, so the time between two uploads is the second one's length. An upload that arrives as
long after the previous one from the same client as its own sound lasts continues it, and is heard as a
Realtime commit is, after the end of the previous one (pipeline/trim.py Continuation), placed right after
it on one timeline. Only the client's previous upload, the last to arrive before it, may be continued, and
only once it is finished. Uploads sent faster than real time never match, nor do pieces with audio between
them the client did not send (its pre-buffer of silence ran over), nor a batch of files sent one after
another (an earlier file than the last one could fit the timing: a client sending a file every 0.6 s had
its 1.5 s files heard after the one sent three before, and lost their first words; the last one fits only
where the server answers as slowly as the files last), nor two streams from one address and key, whose
uploads interleave: each piece then stands alone.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass

from pipeline.trim import Continuation

# How far the time between two uploads may fall from the second one's length: earlier when the previous
# upload was sent late (the client waited for the answer before it, which our answer times make rare), later
# by the network and by digital silence the piece ended in (not counted in its length: a client's own
# appended zeros are not stream). Kept tight: a batch of files sent one after another with a quick turnaround
# fits only where a file's sound is no longer than that turnaround and the early slack.
ARRIVAL_EARLY = 0.1
ARRIVAL_LATE = 0.5
KEPT_SECONDS = 40.0  # an upload may be continued this long after it arrived (a piece is at most ~30 s)
MAX_KEPT = 256  # uploads kept for continuation at once, oldest dropped first (each holds ~4 s of audio)


@dataclass
class Upload:
    """A finished upload that a later one may continue: when it arrived (seconds, a monotonic clock), where
    its sound ended on its stream's timeline, and that stream's finals (their tails only)."""

    key: Hashable
    arrival: float
    end: float
    continuation: Continuation


class UploadSequences:
    """The uploads kept for continuation, each under its client's key (server/openai_http.py: address,
    Authorization, model and language), in the order they finished."""

    def __init__(self) -> None:
        self._kept: deque[Upload] = deque()
        self._last: OrderedDict[Hashable, float] = OrderedDict()  # each client's latest arrival, oldest first

    def __len__(self) -> int:
        return len(self._kept)

    def arrived(self, key: Hashable, arrival: float) -> float | None:
        """Note that an upload of `key` arrived; the arrival of the one before it from that client (None: none
        within KEPT_SECONDS). Every upload of a client that may join is noted once its form is read, whatever
        becomes of it."""
        previous = self._last.pop(key, None)
        self._last[key] = arrival
        while self._last and (len(self._last) > MAX_KEPT or arrival - next(iter(self._last.values())) > KEPT_SECONDS):
            self._last.popitem(last=False)
        return previous if previous is not None and arrival - previous <= KEPT_SECONDS else None

    def continued(self, key: Hashable, arrival: float, seconds: float, previous: float | None) -> Upload | None:
        """The kept upload that an upload of `key` with `seconds` of sound, arriving at `arrival`, continues
        (taken: it is continued once), or None. Only `previous` (from `arrived`: the client's last upload
        before this one) may be it, once finished, and only if this one came as long after it as it lasts."""
        self._expire(arrival)
        if previous is None:
            return None
        upload = next((u for u in self._kept if u.key == key and u.arrival == previous), None)
        if upload is None or not -ARRIVAL_EARLY <= arrival - previous - seconds <= ARRIVAL_LATE:
            return None
        self._kept.remove(upload)
        return upload

    def keep(self, upload: Upload) -> None:
        self._expire(upload.arrival)
        self._kept.append(upload)
        while len(self._kept) > MAX_KEPT:
            self._kept.popleft()

    def _expire(self, now: float) -> None:  # from the oldest finished (a long upload may finish late: kept longer)
        while self._kept and now - self._kept[0].arrival > KEPT_SECONDS:
            self._kept.popleft()
