"""Voice activity segmentation: 16 kHz samples in, speech segments (and partial-decode ticks) out.

Sans-I/O: `Segmenter.feed(samples)` returns events, `finish()` flushes. Time is counted in samples fed,
never read from a clock, so a file and a live microphone segment identically.

The audio is cut into 30 ms frames (VAD_FRAME) that a frame VAD (pipeline/vad.py: webrtcvad or Silero)
scores from 0 to 1; a frame is voiced at `vad_threshold` or more, or once a segment is open at
HOLD_MARGIN less (Silero's own hysteresis: speech that fades a little does not end a segment):
- idle: a ring buffer keeps the last frames (pre-roll plus the start window; memory is bounded while
  silent). When `start_frames` of the last `start_window` frames are voiced, a segment opens at the first
  voiced frame of that window, its audio reaching `pre_roll` further back.
- a segment is *confirmed* once it holds `min_speech` seconds of voiced frames: only then is
  SpeechStarted sent, so coughs and clicks that end earlier vanish without any event; one that falls
  silent for `false_start_silence` before that is dropped too (speech after it starts a segment anew).
- its speech starts at the first voiced frame, unless the segment opened on a steady sound (webrtcvad
  takes steady noise after digital silence for speech) that then steps up: speech starts at the step,
  the audio `pre_roll` before it. Only known once the step comes, so SpeechStarted may be earlier.
- it ends after `end_silence` seconds without a voiced frame; `end` is where the last voiced frame ends,
  and the audio keeps `post_roll` seconds after it.
- at `finish(cut=True)` (a client's commit, more audio may follow) speech still going on in the last frame
  is a segment however short: the commit split a word, and dropping its start lost the word.
- it never grows beyond `max_segment_seconds` of audio: at the limit it is cut after the quietest frame
  (lowest RMS) of its last `cut_search` seconds, and the rest carries on as the next segment.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from .audio import VAD_FRAME, samples_to_seconds
from .segmenter_options import FRAME_SECONDS, HOLD_MARGIN, MIN_HOLD, SegmenterOptions, validate_options
from .vad import frame_vad

# ---- events --------------------------------------------------------------------------------------------
# Times are seconds from the start of the stream. `audio` is float32 mono at SAMPLE_RATE, a copy the
# receiver owns; `audio_start` is the time of audio[0] (pass it as the decoder's offset).

@dataclass(frozen=True)
class SpeechStarted:
    segment: int  # 0, 1, 2 ... per stream
    start: float  # where speech starts


@dataclass(frozen=True)
class PartialDue:
    segment: int
    start: float  # where speech starts, or the window's start once the segment outgrew partial_window
    end: float  # the end of the audio received so far
    audio: np.ndarray = field(repr=False, compare=False)
    audio_start: float | None = None  # None: same as start
    opens: bool = False  # its audio begins with the first sample the segmenter was fed: nothing before it

    def __post_init__(self) -> None:
        if self.audio_start is None:
            object.__setattr__(self, "audio_start", self.start)


@dataclass(frozen=True)
class SegmentFinished:
    segment: int
    start: float  # where speech starts
    end: float  # where speech ends (the audio goes on for up to post_roll)
    audio: np.ndarray = field(repr=False, compare=False)  # pre-roll + speech + post-roll
    audio_start: float | None = None  # None: same as start
    # A client's commit ended the segment inside its speech here, and the audio goes on past it only so that
    # the word the commit cut is heard whole: words that start after it are the next segment's (before_cut).
    cut: float | None = None
    opens: bool = False  # its audio begins with the first sample the segmenter was fed: nothing before it

    def __post_init__(self) -> None:
        if self.audio_start is None:
            object.__setattr__(self, "audio_start", self.start)


Event = Union[SpeechStarted, PartialDue, SegmentFinished]


def level_dbfs(energy: np.ndarray) -> np.ndarray:
    """Frames' RMS energies in dBFS; digital zeros at -100."""
    return 20 * np.log10(np.maximum(energy, 1e-5))


def frame_count(seconds: float) -> int:
    """Whole VAD frames that cover `seconds` (rounded up, with a little slack for float error)."""
    return math.ceil(seconds / FRAME_SECONDS - 1e-9)


class Segmenter:
    """Turns a stream of 16 kHz float32 samples into segment events. One per stream; not thread-safe."""

    def __init__(self, options: SegmenterOptions | None = None, start_frame: int = 0, first_segment: int = 0) -> None:
        """`start_frame`, `first_segment`: where a resumed stream goes on (its stream time in VAD frames, its
        next segment number); a new stream starts at 0 and 0."""
        self.options = options = options or SegmenterOptions()
        validate_options(options)
        self._vad = frame_vad(options.vad, options.vad_aggressiveness)
        self._hold_threshold = max(options.vad_threshold - HOLD_MARGIN, MIN_HOLD)
        self._pre_roll = frame_count(options.pre_roll)
        self._end_frames = frame_count(options.end_silence)
        self._post_frames = int(options.post_roll / FRAME_SECONDS + 1e-9)  # at most post_roll
        self._min_voiced = frame_count(options.min_speech)
        self._false_start_frames = frame_count(options.false_start_silence)
        self._steady_frames = max(2, frame_count(options.steady_lead))
        self._max_frames = int(options.max_segment_seconds / FRAME_SECONDS + 1e-9)
        self._cut_frames = frame_count(options.cut_search)
        self._partial_frames = frame_count(options.partial_interval) if options.partial_interval > 0 else 0
        self._window_frames = min(int(options.partial_window / FRAME_SECONDS + 1e-9), self._max_frames)  # at most
        # Idle: (frame index, samples, voiced, energy) of the latest frames, for the trigger and the pre-roll.
        self._ring: collections.deque = collections.deque(maxlen=options.start_window + self._pre_roll)
        self._ring_voiced = 0  # voiced frames among the ring's last start_window (the trigger, kept per frame)
        # The open segment, preallocated once: its samples, per-frame voiced flags and RMS energies.
        self._audio = np.zeros(self._max_frames * VAD_FRAME, np.float32)
        self._voiced = np.zeros(self._max_frames, bool)
        self._energy = np.zeros(self._max_frames, np.float32)
        self._voiced_count = 0  # of self._voiced[:self._n]
        self._pending = np.zeros(0, np.float32)  # < one frame of samples carried to the next feed
        self._frames = start_frame  # frames processed since the stream started
        self._origin = start_frame  # the first frame fed: audio from there has nothing before it
        self._segment = first_segment  # number of the next announced segment
        self._open = False
        self._finished = False
        self._partial_due = False

    # -- public ----------------------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        """Seconds of audio processed so far (whole frames)."""
        return self._frames * FRAME_SECONDS

    def feed(self, samples: np.ndarray) -> list[Event]:
        """Push float32 [n] samples at SAMPLE_RATE (any n); return the events they complete."""
        if self._finished:
            raise RuntimeError("Segmenter.feed() after finish()")
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._pending.size:
            samples = np.concatenate([self._pending, samples])
        whole = len(samples) // VAD_FRAME * VAD_FRAME
        self._pending = samples[whole:].copy()
        frames = samples[:whole].reshape(-1, VAD_FRAME)
        if not len(frames):
            return []
        scores = self._vad.scores(frames)
        # np.mean's own sum and division, without its Python layer (a fifth of this method's time, per message)
        energy = np.sqrt(np.add.reduce(np.square(frames, dtype=np.float32), axis=1) / VAD_FRAME)
        events: list[Event] = []
        self._partial_due = False
        for i in range(len(frames)):
            voiced = scores[i] >= (self._hold_threshold if self._open else self.options.vad_threshold)
            self._step(frames[i], bool(voiced), float(energy[i]), events)
        if self._partial_due and self._open and self._confirmed:
            events.append(self._partial())
        return events

    def finish(self, cut: bool = False) -> list[Event]:
        """End of stream: close the open segment (the sub-frame remainder joins its audio). `cut`: a client
        cut the audio here (a Realtime commit) and more may follow, so speech still going on in the last
        frame is a segment however short: it is a word the cut split, and the sound after the cut completes
        it (server/openai_realtime.py). Dropped as too short, its onset was lost to both sides (issue 36)."""
        if self._finished:
            return []
        self._finished = True
        events: list[Event] = []
        if cut and self._speaking_at_end():
            if not self._open:
                self._open_from_ring()
            self._confirm(events)
        if self._open:
            tail = self._pending[: len(self._audio) - self._n * VAD_FRAME]  # never beyond the limit
            speaking = self._silence == 0
            self._close(events, tail=tail if speaking else None)
        self._pending = np.zeros(0, np.float32)
        self._ring.clear()
        self._ring_voiced = 0
        return events

    # -- per frame ---------------------------------------------------------------------------------------

    def _step(self, frame: np.ndarray, voiced: bool, energy: float, events: list[Event]) -> None:
        index = self._frames
        self._frames += 1
        if not self._open:
            window = self.options.start_window
            if len(self._ring) >= window:  # the frame that leaves the window
                self._ring_voiced -= self._ring[-window][2]
            self._ring.append((index, frame, voiced, energy))
            self._ring_voiced += voiced
            if self._ring_voiced >= self.options.start_frames:
                self._open_from_ring()
                self._maybe_confirm(events)
            return
        if self._n == self._max_frames:
            self._at_limit(events)
            if not self._open:  # the segment ended in a pause: this frame starts the idle path again
                self._frames -= 1
                self._step(frame, voiced, energy, events)
                return
        self._append(frame, voiced, energy)
        if voiced:
            self._silence = 0
            self._voiced_since_partial = True
            self._maybe_confirm(events)
        else:
            self._silence += 1
            if self._silence >= self._end_frames or (not self._confirmed and self._silence >= self._false_start_frames):
                self._close(events)
                return
        if self._confirmed and self._partial_frames and self._voiced_since_partial:
            if self._n - self._last_partial >= self._partial_frames:
                self._partial_due = True

    def _open_from_ring(self) -> None:
        ring = list(self._ring)
        window = ring[-self.options.start_window:]
        first = next(k for k, (_, _, v, _) in enumerate(window) if v) + len(ring) - len(window)
        begin = max(0, first - self._pre_roll)
        self._first_frame = ring[begin][0]  # stream frame index of the segment's audio[0]
        self._n = 0
        self._confirmed = False
        for _, frame, voiced, energy in ring[begin:]:
            self._append(frame, voiced, energy)
        self._ring.clear()
        self._ring_voiced = 0
        self._open = True
        self._reset_segment_state()

    def _reset_segment_state(self) -> None:
        voiced = np.flatnonzero(self._voiced[: self._n])
        self._voiced_count = len(voiced)  # kept by _append from here on (_maybe_confirm reads it every frame)
        self._silence = self._n - 1 - int(voiced[-1]) if len(voiced) else self._n
        self._last_partial = 0
        self._voiced_since_partial = len(voiced) > 0
        self._lead_scan: tuple[int, float | None, int] | None = None  # _after_steady_lead's progress
        self._lead_onset: int | None = None  # ... and its answer, once one frame stood apart from the lead

    def _append(self, frame: np.ndarray, voiced: bool, energy: float) -> None:
        self._audio[self._n * VAD_FRAME:(self._n + 1) * VAD_FRAME] = frame
        self._voiced[self._n] = voiced
        self._voiced_count += voiced
        self._energy[self._n] = energy
        self._n += 1

    def _maybe_confirm(self, events: list[Event]) -> None:
        if self._voiced_count >= self._min_voiced:
            self._confirm(events)

    def _confirm(self, events: list[Event]) -> None:
        if not self._confirmed:
            self._confirmed = True
            events.append(SpeechStarted(self._segment, self._speech_start()))

    def _speaking_at_end(self) -> bool:
        """Whether the last frame fed was voiced."""
        if self._open:
            return self._silence == 0
        return bool(self._ring) and self._ring[-1][2]

    # -- times -----------------------------------------------------------------------------------------

    def _time(self, local_frame: int) -> float:
        """Stream time of the start of the open segment's frame `local_frame`."""
        return round((self._first_frame + local_frame) * FRAME_SECONDS, 6)  # 0.03 * k is never exact

    def _speech_start(self) -> float:
        return self._time(self._onset()[1])

    def _onset(self) -> tuple[int, int]:
        """The open segment's first voiced frame and the frame where speech starts: that one, or the step
        up that ends a steady lead (see `steady_lead_db`)."""
        voiced = np.flatnonzero(self._voiced[: self._n])
        first = int(voiced[0]) if len(voiced) else 0
        return first, self._after_steady_lead(first)

    def _after_steady_lead(self, first: int) -> int:
        if not self.options.steady_lead_db:
            return first
        # An open segment's frames are only ever appended, so the scan goes on from where the last call left
        # it, and its first frame apart from the lead decides for good: each partial would otherwise redo the
        # whole segment (a tenth of the sans-I/O path, bench streamcost).
        if self._lead_scan is None or self._lead_scan[0] != first:  # a segment cut at the limit found its speech
            self._lead_scan, self._lead_onset = (first, None, first + 1), None
        if self._lead_onset is not None:
            return self._lead_onset
        _, reference, at = self._lead_scan  # at: the next frame to look at
        # The lead's level from the frames after the first (which may straddle the start of the noise).
        if reference is None:
            if self._n - at < self._steady_frames:
                return first
            reference = float(np.median(level_dbfs(self._energy[at: at + self._steady_frames])))
        level = level_dbfs(self._energy[at: self._n])
        apart = np.flatnonzero(np.abs(level - reference) > self.options.steady_lead_db)
        self._lead_scan = (first, reference, self._n)
        if not len(apart):
            return first  # steady so far
        step = at + int(apart[0])
        # steady too briefly, or it fell quieter: not a noise lead
        self._lead_onset = first if step - first - 1 < self._steady_frames or level[apart[0]] < reference else step
        return self._lead_onset

    def _opens(self, local_frame: int) -> bool:
        """Whether audio from the open segment's frame `local_frame` on begins with the first frame fed."""
        return self._first_frame + local_frame == self._origin

    def _audio_begin(self, first: int, onset: int) -> int:
        """The first frame of audio to send: `pre_roll` before a moved onset, else where the audio starts."""
        return max(0, onset - self._pre_roll) if onset > first else 0

    # -- ending and cutting ------------------------------------------------------------------------------

    def _close(self, events: list[Event], tail: np.ndarray | None = None) -> None:
        """Finish the open segment at its last voiced frame (+ post-roll); drop it if never confirmed."""
        voiced = np.flatnonzero(self._voiced[: self._n])
        last = int(voiced[-1]) + 1 if len(voiced) else self._n  # frames up to the end of speech
        keep = min(self._n, last + self._post_frames)
        if self._confirmed:
            first, onset = self._onset()
            begin = self._audio_begin(first, onset)
            audio = self._audio[begin * VAD_FRAME: keep * VAD_FRAME]
            end = self._time(last)
            if tail is not None and len(tail):  # stream ended mid-speech: keep the last few samples too
                audio = np.concatenate([audio, tail])
                end += samples_to_seconds(len(tail))
            events.append(SegmentFinished(self._segment, self._time(onset), end, audio.copy(), self._time(begin),
                                          opens=self._opens(begin)))
            self._segment += 1
        self._to_idle()

    def _to_idle(self) -> None:
        """Seed the ring with the segment's last frames (pre-roll for the next one, never re-triggering it)."""
        start = max(0, self._n - self._ring.maxlen)
        for k in range(start, self._n):
            frame = self._audio[k * VAD_FRAME:(k + 1) * VAD_FRAME].copy()
            self._ring.append((self._first_frame + k, frame, False, float(self._energy[k])))
        self._ring_voiced = 0  # the ring was emptied when the segment opened, and these frames never count
        self._open = False
        self._partial_due = False  # a tick owed to this segment is not owed to the next one

    def _at_limit(self, events: list[Event]) -> None:
        """The open segment is full. End it if speech has paused, else cut it at its quietest recent frame."""
        if self._silence > 0 or not self._confirmed:
            self._close(events)
            return
        lo = self._n - self._cut_frames
        # The quietest 90 ms (smoothed RMS), the latest one on ties, so segments stay near full length.
        smooth = np.convolve(self._energy[lo: self._n], np.full(3, 1 / 3, np.float32), mode="same")
        quiet = self._n - 1 - int(np.argmin(smooth[::-1]))  # the cut falls after this frame
        head = quiet + 1
        voiced = np.flatnonzero(self._voiced[:head])
        end = self._time(int(voiced[-1]) + 1) if len(voiced) else self._time(head)
        first, onset = self._onset()
        onset = min(onset, head - 1)
        begin = self._audio_begin(first, onset)
        events.append(SegmentFinished(self._segment, self._time(onset), end,
                                      self._audio[begin * VAD_FRAME: head * VAD_FRAME].copy(), self._time(begin),
                                      opens=self._opens(begin)))
        self._segment += 1
        # The rest becomes the next segment, with no overlap: it was heard once and is decoded once.
        rest = self._n - head
        self._audio[: rest * VAD_FRAME] = self._audio[head * VAD_FRAME: self._n * VAD_FRAME]
        self._voiced[:rest] = self._voiced[head: self._n]
        self._energy[:rest] = self._energy[head: self._n]
        self._first_frame += head
        self._n = rest
        self._confirmed = False
        self._partial_due = False
        self._reset_segment_state()
        self._maybe_confirm(events)

    # -- partials --------------------------------------------------------------------------------------

    def _partial(self) -> PartialDue:
        self._last_partial = self._n
        self._voiced_since_partial = False
        voiced, onset = self._onset()
        first = max(self._audio_begin(voiced, onset), self._n - self._window_frames)
        audio = self._audio[first * VAD_FRAME: self._n * VAD_FRAME].copy()
        start = max(self._time(onset), self._time(first))
        return PartialDue(self._segment, start, self._time(self._n), audio, self._time(first), self._opens(first))
