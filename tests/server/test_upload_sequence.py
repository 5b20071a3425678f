"""Which earlier upload a new one continues (server/upload_sequence.py): by client and by real-time timing."""
from __future__ import annotations

import numpy as np

from pipeline.segmenter import SegmentFinished
from pipeline.segmenter_options import SegmenterOptions
from pipeline.trim import CONTEXT_SECONDS, Continuation, prepared

from server.upload_sequence import ARRIVAL_EARLY, ARRIVAL_LATE, KEPT_SECONDS, MAX_KEPT, Upload, UploadSequences

KEY = ("127.0.0.1", "Bearer t", "whisper-1", "auto")


def kept(key=KEY, arrival: float = 100.0, end: float = 2.0) -> Upload:
    return Upload(key, arrival, end, Continuation(SegmenterOptions()))


def test_an_upload_sent_as_long_after_the_last_one_as_it_lasts_continues_it():
    uploads = UploadSequences()
    assert uploads.arrived(KEY, 100.0) is None  # the client's first
    first = kept()
    uploads.keep(first)
    assert uploads.arrived(KEY, 101.5) == 100.0
    assert uploads.continued(KEY, 101.5, 1.5, 100.0) is first
    assert uploads.continued(KEY, 101.5, 1.5, 100.0) is None  # continued once
    for arrival in (101.5 + ARRIVAL_LATE - 0.01, 101.5 - ARRIVAL_EARLY + 0.01):  # the network's delay; sent late
        uploads.keep(first)
        assert uploads.continued(KEY, arrival, 1.5, 100.0) is first


def test_a_batch_sent_faster_than_real_time_or_audio_not_sent_between_continues_nothing():
    uploads = UploadSequences()
    uploads.keep(kept())
    assert uploads.continued(KEY, 100.2, 1.5, 100.0) is None  # the next file right after the answer
    assert uploads.continued(KEY, 103.0, 1.5, 100.0) is None  # 1.5 s between them that the client did not send
    assert len(uploads) == 1


def test_only_the_clients_previous_upload_may_be_continued():
    """A batch client sending a file every 0.6 s: the file sent three before the 1.8 s one fits its timing,
    but files came between them (it was heard after that one, and its first words were lost)."""
    uploads = UploadSequences()
    for n in range(4):
        previous = uploads.arrived(KEY, 100.0 + 0.6 * n)
        uploads.keep(kept(arrival=100.0 + 0.6 * n))
    assert previous == 100.0 + 0.6 * 2
    assert uploads.continued(KEY, 100.0 + 0.6 * 3, 1.8, previous) is None
    # still running when the next one arrived (a client sending two at once): not yet continuable
    uploads = UploadSequences()
    uploads.arrived(KEY, 100.0)
    previous = uploads.arrived(KEY, 101.5)
    uploads.keep(kept())
    assert previous == 100.0 and uploads.continued(KEY, 101.5, 1.5, None) is None


def test_another_client_or_another_stream_of_the_same_one_continues_nothing():
    uploads = UploadSequences()
    uploads.arrived(KEY, 100.0)
    uploads.keep(kept())
    for other in (("127.0.0.2",) + KEY[1:], KEY[:1] + ("Bearer u",) + KEY[2:], KEY[:2] + ("other",) + KEY[3:]):
        assert uploads.arrived(other, 101.5) is None
        assert uploads.continued(other, 101.5, 1.5, None) is None
    # a second stream of the same client sent a piece in between: which one this follows is unknown
    uploads.arrived(KEY, 100.5)
    uploads.keep(kept(arrival=100.5))
    assert uploads.continued(KEY, 101.5, 1.5, uploads.arrived(KEY, 101.5)) is None


def test_old_uploads_are_forgotten_and_the_kept_ones_bounded():
    uploads = UploadSequences()
    uploads.arrived(KEY, 100.0)
    uploads.keep(kept())
    later = 100.0 + KEPT_SECONDS + 1
    assert uploads.continued(KEY, later, KEPT_SECONDS + 1, uploads.arrived(KEY, later)) is None
    assert len(uploads) == 0
    uploads.arrived(KEY, 199.0)
    for n in range(MAX_KEPT + 10):  # as many other clients: the first one's last arrival is dropped
        uploads.keep(kept(arrival=200.0 + n / 1000))
        uploads.arrived((f"10.0.{n // 256}.{n % 256}",) + KEY[1:], 200.0 + n / 1000)
    assert len(uploads) == MAX_KEPT and uploads.arrived(KEY, 201.0) is None


def test_what_is_kept_between_uploads_is_only_what_a_context_can_reach():
    options = SegmenterOptions()
    continuation = Continuation(options)
    audio = np.full(16000 * 20, 0.1, np.float32)
    prepared(SegmentFinished(0, 0.3, 19.8, audio, audio_start=0.0), options, continuation)
    tail = continuation.tail()
    assert len(tail.previous.audio) == CONTEXT_SECONDS * 16000
    assert tail.previous.audio_start == 20.0 - CONTEXT_SECONDS and tail.previous.end == 19.8
    assert tail.said is continuation.said  # its words, once decoded, reach the next upload's context
