"""What the model hears of a segment: its speech with the pre-roll the model expects, never more silence.

Silence in the audio is not padding. Container padding is masked exactly (the graph gets the valid length),
but leading silence is heard, and a model that learned speech starting within the segmenter's pre-roll adds
words to a longer one (issue 25: 0.5 s of it gave 18-22 % WER). So every door applies this one rule before
a segment reaches the model: audio more than `pre_roll` seconds before the speech or more than `post_roll`
seconds after it is cut (SegmenterOptions: 0.3 s and 0.2 s by default, the shape of the segments the
segmenter cuts from a live stream).

- Segments the segmenter cut (live streams, uploads, FunASR, Realtime server VAD) know where their speech
  is; only a client's larger pre-roll (Realtime `prefix_padding_ms`) is cut from them (`for_model`).
- A whole buffer (a Realtime commit without turn detection) goes through the segmenter first, so that
  what counts as speech has one definition; a buffer without any is no segment at all (`speech_in`), and
  its transcript is empty, as OpenAI's is.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar

import numpy as np

from .audio import SAMPLE_RATE
from .segmenter import PartialDue, SegmentFinished, Segmenter, SegmenterOptions

Cut = TypeVar("Cut", SegmentFinished, PartialDue)


def trim_to_speech(audio: np.ndarray, audio_start: float, start: float, end: float, pre_roll: float,
                   post_roll: float) -> tuple[np.ndarray, float]:
    """`audio` (whose first sample is at `audio_start`) cut to [start - pre_roll, end + post_roll], as far as
    it reaches; returns the cut audio (a view) and the time of its first sample. Times in seconds."""
    first = max(0, int(round((start - pre_roll - audio_start) * SAMPLE_RATE)))
    last = min(len(audio), max(first, int(round((end + post_roll - audio_start) * SAMPLE_RATE))))
    return audio[first:last], audio_start + first / SAMPLE_RATE


def for_model(event: Cut, options: SegmenterOptions) -> Cut:
    """A segment (or partial window) with its audio trimmed to `options`' pre-roll and post-roll."""
    audio, audio_start = trim_to_speech(event.audio, event.audio_start, event.start, event.end, options.pre_roll,
                                        options.post_roll)
    if len(audio) == len(event.audio):
        return event
    return dataclasses.replace(event, audio=audio, audio_start=round(audio_start, 6))


def speech_in(audio: np.ndarray, options: SegmenterOptions, offset: float = 0.0,
              segment: int = 0) -> SegmentFinished | None:
    """A whole buffer (float32 at SAMPLE_RATE, its first sample at `offset`) as one segment: from the first
    speech the segmenter finds in it, less the pre-roll, to the end of the last, plus the post-roll. None
    when the segmenter finds no speech."""
    segmenter = Segmenter(dataclasses.replace(options, partial_interval=0.0))
    found = [e for e in segmenter.feed(audio) + segmenter.finish() if isinstance(e, SegmentFinished)]
    if not found:
        return None
    first, last = found[0], found[-1]
    # The segmenter's own bounds (its pre- and post-roll in whole VAD frames): the audio an upload's segment has.
    begin = int(round(first.audio_start * SAMPLE_RATE))
    cut = audio[begin:int(round(last.audio_start * SAMPLE_RATE)) + len(last.audio)]
    return SegmentFinished(segment, round(first.start + offset, 6), round(last.end + offset, 6), cut,
                           round(first.audio_start + offset, 6))
