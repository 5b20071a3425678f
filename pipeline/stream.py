"""One client stream, sans-I/O: PCM bytes in, segment events out (decode, resample, segment).

The server's connection layer owns one `StreamSession` per WebSocket; it moves bytes and schedules, and
this object does the rest without sockets, asyncio or clocks. Buffering is bounded: a sub-frame remainder,
the resampler's filter state and the segmenter's fixed-size segment buffer (max_segment_seconds).
"""
from __future__ import annotations

from .audio import AudioFormat, Resampler, check_format, decode_pcm
from .segmenter import FRAME_SECONDS, Event, Segmenter, SegmenterOptions


class StreamSession:
    """`feed(bytes)` -> events, `finish()` -> the last events. Raises AudioFormatError on malformed PCM.

    After an AudioFormatError the session is still consistent (the bad message was not consumed), but
    the protocol treats it as fatal: the server closes the stream.
    """

    def __init__(self, fmt: AudioFormat, options: SegmenterOptions | None = None, start_time: float = 0.0,
                 first_segment: int = 0) -> None:
        """`start_time` (a multiple of the 30 ms VAD frame) and `first_segment`: where a resumed stream goes
        on, so its segment numbers and times continue the stream it resumes."""
        check_format(fmt)
        self.format = fmt
        self.start_time = start_time
        self.segmenter = Segmenter(options, start_frame=round(start_time / FRAME_SECONDS), first_segment=first_segment)
        self._resampler = Resampler(fmt.sample_rate)
        self._received_frames = 0  # sample frames (one per channel group) at the client's rate
        self._finished = False

    @property
    def options(self) -> SegmenterOptions:
        return self.segmenter.options

    @property
    def received_seconds(self) -> float:
        """Seconds of audio received so far, at the client's rate (for real-time-rate checks)."""
        return self._received_frames / self.format.sample_rate

    @property
    def stream_seconds(self) -> float:
        """The stream time the audio received so far reaches (start_time + received_seconds)."""
        return self.start_time + self.received_seconds

    @property
    def processed_seconds(self) -> float:
        """Seconds of audio the segmenter has judged (lags received_seconds by < 30 ms + filter delay)."""
        return self.segmenter.seconds

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, data: bytes) -> list[Event]:
        """Push one binary message of whole PCM sample frames; return the events it completes."""
        if self._finished:
            raise RuntimeError("StreamSession.feed() after finish()")
        samples = decode_pcm(data, self.format)
        self._received_frames += len(samples)
        return self.segmenter.feed(self._resampler.process(samples))

    def finish(self) -> list[Event]:
        """End of audio: flush the resampler and close the open segment."""
        if self._finished:
            return []
        self._finished = True
        events = self.segmenter.feed(self._resampler.flush())
        return events + self.segmenter.finish()
