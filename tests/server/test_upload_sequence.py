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
    first = kept()
    uploads.keep(first)
    assert uploads.continued(KEY, 101.5, 1.5) is first
    assert uploads.continued(KEY, 101.5, 1.5) is None  # continued once
    uploads.keep(first)
    assert uploads.continued(KEY, 101.5 + ARRIVAL_LATE - 0.01, 1.5) is first  # the network's delay
    uploads.keep(first)
    assert uploads.continued(KEY, 101.5 - ARRIVAL_EARLY + 0.01, 1.5) is first  # the last one sent late


def test_a_batch_sent_faster_than_real_time_or_audio_not_sent_between_continues_nothing():
    uploads = UploadSequences()
    uploads.keep(kept())
    assert uploads.continued(KEY, 100.2, 1.5) is None  # the next file right after the answer
    assert uploads.continued(KEY, 103.0, 1.5) is None  # 1.5 s between them that the client did not send
    assert len(uploads) == 1


def test_another_client_or_two_that_fit_continue_nothing():
    uploads = UploadSequences()
    uploads.keep(kept())
    for other in (("127.0.0.2",) + KEY[1:], KEY[:1] + ("Bearer u",) + KEY[2:], KEY[:2] + ("other",) + KEY[3:]):
        assert uploads.continued(other, 101.5, 1.5) is None
    uploads.keep(kept(arrival=100.05))  # a second stream of the same client: which one this follows is unknown
    assert uploads.continued(KEY, 101.5, 1.5) is None


def test_old_uploads_are_forgotten_and_the_kept_ones_bounded():
    uploads = UploadSequences()
    uploads.keep(kept())
    assert uploads.continued(KEY, 100.0 + KEPT_SECONDS + 1, KEPT_SECONDS + 1) is None
    assert len(uploads) == 0
    for n in range(MAX_KEPT + 10):
        uploads.keep(kept(arrival=200.0 + n / 1000))
    assert len(uploads) == MAX_KEPT


def test_what_is_kept_between_uploads_is_only_what_a_context_can_reach():
    options = SegmenterOptions()
    continuation = Continuation(options)
    audio = np.full(16000 * 20, 0.1, np.float32)
    prepared(SegmentFinished(0, 0.3, 19.8, audio, audio_start=0.0), options, continuation)
    tail = continuation.tail()
    assert len(tail.previous.audio) == CONTEXT_SECONDS * 16000
    assert tail.previous.audio_start == 20.0 - CONTEXT_SECONDS and tail.previous.end == 19.8
    assert tail.said is continuation.said  # its words, once decoded, reach the next upload's context
