"""What the model hears of a segment: its speech with the pre-roll the model expects, never more silence.

Silence in the audio is not padding. Container padding is masked exactly (the graph gets the valid length),
but leading silence is heard, and a model that learned speech starting within the segmenter's pre-roll adds
words to a longer one (issue 25: 0.5 s of it gave 18-22 % WER). So every door applies this one rule before
a segment reaches the model: audio more than `pre_roll` seconds before the speech or more than `post_roll`
seconds after it is cut (SegmenterOptions: 0.3 s and 0.2 s by default, the shape of the segments the
segmenter cuts from a live stream). Nor does it hear digital silence that ends in the room before the
speech (zeros, then noise, then the words: a muted microphone, a client's gap; `_room_after`), or that
follows the room after it (a client's zeros after a turn, a noise gate closing; `_room_before`). A segment
whose speech starts at the stream's first sample is heard after STREAM_START_LEAD of zeros (times before
the stream's start are clamped to it in the decoders).

- Segments the segmenter cut (live streams, uploads, FunASR, Realtime server VAD) know where their speech
  is; only a client's larger pre-roll (Realtime `prefix_padding_ms`) is cut from them (`for_model`).
- A whole buffer (a Realtime commit without turn detection) is cut by the segmenter as an upload is
  (`segments_in`), so the same audio gives the same segments, and words, however a client cut it; a
  buffer without speech is no segment at all, and its transcript is empty, as OpenAI's is.
- A segment that begins less than JOIN_SILENCE after the previous one ended continues that utterance: a
  client's VAD committed at a short pause (pipecat's default stop_secs is 0.2 s) or our segmenter cut at
  its length limit. Alone, such a fragment is often one short word the model gets wrong ("two" heard as
  "oh"); so the model hears up to CONTEXT_SECONDS of the previous segment before it (`Continuation`).
  Its transcript then drops the leading words that align with the previous segment's words in that
  context (pipeline.decoding.after_context): aligned by word edit distance, not timed, because CTC spikes
  come early by a model's own offset and the word at a cut straddles it, and not counted, because the two
  decodings of the context may differ by a word ("next next" once, "next" again: a count then dropped a
  word of the new segment); but never a word timed well past the context, for heard again the context
  may lose a short word it had.
  Where the door has the audio as it came (Realtime commits: `heard`), the context is that sound; else it
  is the previous segment's copy, the pause neither kept filled with silence. The words said are those of
  the previous segment and, until they reach back to the context's start, of the ones it continued (`Said`).
- A Realtime commit that ends inside speech is heard with some of the audio after it (SegmentFinished.cut,
  server/openai_realtime.py), and keeps only the words that began before it (decoding.before_cut).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .audio import SAMPLE_RATE
from .transcript import TokenTiming
from .segmenter import FRAME_SECONDS, PartialDue, SegmentFinished, Segmenter, SegmenterOptions

Cut = TypeVar("Cut", SegmentFinished, PartialDue)
# A shorter pause lies inside one utterance. Pauses between the words of one are mostly under 0.25 s (where
# pipecat committed inside our digit strings: 0-0.24 s); with 0.5 s, two recordings committed back to back
# were heard as one utterance, and the join cost 1.9 points of WER (docs/history.md, "Doors").
JOIN_SILENCE = 0.3
CONTEXT_SECONDS = 2.0  # of the previous segment heard before one that continues it
# A sound that begins this long before the VAD's first voiced frame is not that speech's own onset (a
# fricative's precedes it by less): digital silence before such a sound is cut from what the model hears.
ONSET_LAG = 0.1
NOISE_LEAD, QUIET_BELOW_PEAK = 0.15, 20.0  # ... and so is a sound this long this far under the speech's peak
# Digital silence: zeros, or the +-1 LSB a resampler leaves of them (LiveKit's, 16 -> 24 kHz), resampled again.
DIGITAL_SILENCE = 2 / 32768
SOUND_SCAN_BLOCK = 4096  # samples sound_end looks at a time, from the end
MAX_SAID_CHAIN = 8  # finals back that a context's words are looked for in (each at least a VAD frame long)
# Zeros the model hears before a segment whose speech starts at the first sample of what was fed (a file cut
# tight, a microphone opened mid-word, a client's commit of one utterance). Measured on the demo model, 200
# held-out recordings whose speech starts at their first sample, clean, pink and room noise
# (docs/history.md, "Doors"): the
# errors depend on where the onset falls in the frontend's 60 ms frames: with 0, 15, 20, 30, 45, 60, 90,
# 150 and 300 ms of zeros before it, 301, 242, 218, 196, 258, 346, 217, 216 and 304 errors in all (9 cells).
STREAM_START_LEAD = 0.03


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
    # Digital silence that ends in a sound before the speech (a muted microphone, a client's zeros, then the
    # room): the model never learned zeros followed by noise, and wrote a word at the step ("oh", "back").
    speech = int((event.start - audio_start) * SAMPLE_RATE)  # the VAD's first voiced frame may straddle the step
    sound = np.flatnonzero(np.abs(audio[:max(0, speech + round(FRAME_SECONDS * SAMPLE_RATE))]) > DIGITAL_SILENCE)
    if len(sound) and sound[0] > 0 and _room_after(audio, int(sound[0]), speech):
        audio, audio_start = audio[int(sound[0]):], audio_start + int(sound[0]) / SAMPLE_RATE
    elif len(sound) and sound[0] > (keep := round(STREAM_START_LEAD * SAMPLE_RATE)):
        # Zeros that end in the speech itself: the model hears STREAM_START_LEAD of them, where it does best,
        # not the pre-roll's 0.3 s (the recordings of one stream after its gaps of zeros: 11 words more per
        # 200 than their uploads).
        cut = int(sound[0]) - keep
        audio, audio_start = audio[cut:], audio_start + cut / SAMPLE_RATE
    # The mirror at the end: the room, then digital silence (zeros after a turn, a noise gate closing). Noise
    # that stops dead was as new to the model, which wrote a word there ("back", "four five": 200 recordings
    # in babble at -50 dBFS, one stream with 1 s of zeros between them, 45 errors against their uploads' 28;
    # at -40 dBFS each committed with 1 s of zeros after it, 103 against 90).
    last = sound_end(audio) or len(audio)
    speech, speech_end = (int(round((t - audio_start) * SAMPLE_RATE)) for t in (event.start, event.end))
    if last < len(audio) and _room_before(audio, last, speech, speech_end):
        audio = audio[:last]
    if len(audio) == len(event.audio):
        return event
    return dataclasses.replace(event, audio=audio, audio_start=round(audio_start, 6))


def prepared(event: Cut, options: SegmenterOptions,
             continuation: Continuation | None = None) -> tuple[Cut, Context | None, Said | None]:
    """What the model hears of a segment or partial, at every door: `for_model`'s audio; for a final that
    continues the segment before it, that one's context first (`continuation`, whose Context and Said come
    back); else, when the speech starts where the audio the segmenter was fed does, STREAM_START_LEAD of
    zeros before it (after a context, zeros would split one utterance)."""
    event = for_model(event, options)
    context = said = None
    if continuation is not None:
        event, context, said = continuation.next(event)
    if context is None and event.opens and event.start - event.audio_start < ONSET_LAG and len(event.audio):
        lead = round(STREAM_START_LEAD * SAMPLE_RATE)
        sound = np.flatnonzero(np.abs(event.audio[:lead]) > DIGITAL_SILENCE)  # only a shorter lead is topped up
        pad = lead - (int(sound[0]) if len(sound) else min(lead, len(event.audio)))
        if pad > 0:  # up to STREAM_START_LEAD of zeros before the first sound
            event = dataclasses.replace(event, audio=np.concatenate([np.zeros(pad, np.float32), event.audio]),
                                        audio_start=round(event.audio_start - pad / SAMPLE_RATE, 6))
    return event, context, said


def sound_end(audio: np.ndarray) -> int:
    """Samples of `audio` up to its last sound, digital silence after it not counted (0: it has none).
    Looked for from the end, a block at a time: a partial's window (up to 15 s) mostly sounds to its last
    sample, and the whole-buffer scan was a sixteenth of the event loop's time at 256 streams."""
    end = len(audio)
    while end > 0:
        begin = max(0, end - SOUND_SCAN_BLOCK)
        sound = np.flatnonzero(np.abs(audio[begin:end]) > DIGITAL_SILENCE)
        if len(sound):
            return begin + int(sound[-1]) + 1
        end = begin
    return 0


def _room_after(audio: np.ndarray, first: int, speech: int) -> bool:
    """Whether the sound from sample `first` on (after digital silence) is the room before the speech: it
    begins more than ONSET_LAG before the VAD heard speech, or it stays QUIET_BELOW_PEAK dB under the
    speech's peak for NOISE_LEAD s (webrtcvad, coming out of zeros, often hears the room's first frames as
    speech; a fricative onset is as quiet, but briefer)."""
    return first <= speech - ONSET_LAG * SAMPLE_RATE or _quiet_at_first(audio[first:first + 2 * SAMPLE_RATE])


def _room_before(audio: np.ndarray, last: int, speech: int, speech_end: int) -> bool:
    """Whether the sound up to sample `last` (digital silence after it) is the room after the speech: the
    room was heard before the speech too (NOISE_LEAD s of sound before the VAD's first voiced frame), the
    sound ends more than ONSET_LAG after the VAD's last voiced frame, or its last NOISE_LEAD s stay
    QUIET_BELOW_PEAK dB under the speech's peak (webrtcvad hears babble as speech up to the zeros; a word's
    fading end is briefer). After speech that came out of digital silence, zeros are what the model learned."""
    if np.count_nonzero(np.abs(audio[:max(0, speech)]) > DIGITAL_SILENCE) >= NOISE_LEAD * SAMPLE_RATE:
        return True
    if last >= speech_end + ONSET_LAG * SAMPLE_RATE:
        return True
    return _quiet_at_first(audio[max(0, last - 2 * SAMPLE_RATE):last][::-1])


def _quiet_at_first(span: np.ndarray) -> bool:
    """Whether `span`'s first NOISE_LEAD s stay QUIET_BELOW_PEAK dB under its peak (levels of 10 ms)."""
    window = SAMPLE_RATE // 100
    levels = np.sqrt(np.mean(np.square(span[:len(span) // window * window].reshape(-1, window)), axis=1))
    if not len(levels):
        return False
    loud = np.flatnonzero(levels >= levels.max() * 10 ** (-QUIET_BELOW_PEAK / 20))
    return int(loud[0]) * window >= NOISE_LEAD * SAMPLE_RATE


def segments_in(audio: np.ndarray, options: SegmenterOptions, offset: float = 0.0,
                cut: bool = False) -> list[SegmentFinished]:
    """A whole buffer (float32 at SAMPLE_RATE, its first sample at `offset`) cut as an upload of it is: the
    segmenter's segments, numbered from 0, times shifted by `offset`; [] when it finds no speech. A buffer
    that holds two utterances with a pause is two segments, as in the upload: decoded as one, the pause
    heard as speech, a short word before it was lost (issue 36). `cut`: a client's commit ended the buffer,
    and speech going on at its end is a segment however short (Segmenter.finish)."""
    segmenter = Segmenter(dataclasses.replace(options, partial_interval=0.0))
    found = [e for e in segmenter.feed(audio) + segmenter.finish(cut) if isinstance(e, SegmentFinished)]
    return [shifted(e, offset) for e in found] if offset else found


def shifted(event: SegmentFinished, offset: float) -> SegmentFinished:
    """`event` with its times `offset` seconds later (on a stream's timeline)."""
    return dataclasses.replace(event, start=round(event.start + offset, 6), end=round(event.end + offset, 6),
                               audio_start=round(event.audio_start + offset, 6),
                               cut=None if event.cut is None else round(event.cut + offset, 6))


@dataclass
class Said:
    """A final's words, filled in once its transcript is made (None until then, or when it failed), and
    what the final it continued said (its context reaches back past a short final into the one before)."""
    words: tuple[TokenTiming, ...] | None = None
    before: Said | None = None

    def since(self, start: float) -> tuple[TokenTiming, ...] | None:
        """This final's words and, until they reach back to `start`, those of the finals it continued (None:
        this one failed). Without them, a word said two finals back and heard again in a context came back
        ("hide" after an item that said nothing but the end of it)."""
        if self.words is None:
            return None
        words, earlier = list(self.words), self.before
        for _ in range(MAX_SAID_CHAIN):
            if earlier is None or earlier.words is None or (words and words[0].start < start):
                break
            words[:0] = earlier.words
            earlier = earlier.before
        return tuple(words)


@dataclass(frozen=True)
class Context:
    """The previous segment's end heard before a segment: stream seconds [start, end) of its audio, and what
    that segment said. Its words there are dropped from this transcript (pipeline.decoding.after_context)."""
    start: float
    end: float
    previous: Said


class Continuation:
    """One stream's finals in order: each becomes what the model hears of it, with the end of the previous
    one before it when it continues that utterance. Times are the stream's; `forget()` when the audio
    between two segments was discarded (a cleared buffer), so they no longer follow each other."""

    def __init__(self, options: SegmenterOptions) -> None:
        self.options = options
        self.previous: SegmentFinished | None = None
        self.said = Said()
        self._received = np.zeros(0, np.float32)  # the stream's latest audio as it came (see `heard`) ...
        self._received_start = 0.0  # ... and the stream time of its first sample

    def forget(self) -> None:
        self.previous = None
        self._received = np.zeros(0, np.float32)

    def tail(self) -> Continuation:
        """A copy that keeps only what the next segment's context can reach (CONTEXT_SECONDS of the last
        segment and of the audio received), for keeping between requests (server/upload_sequence.py)."""
        kept = Continuation(self.options)
        kept.said = self.said
        keep = round(CONTEXT_SECONDS * SAMPLE_RATE)
        if self.previous is not None:
            drop = max(0, len(self.previous.audio) - keep)
            kept.previous = dataclasses.replace(self.previous, audio=self.previous.audio[drop:].copy(),
                                                audio_start=round(self.previous.audio_start + drop / SAMPLE_RATE, 6))
        drop = max(0, len(self._received) - keep)
        kept._received = self._received[drop:].copy()
        kept._received_start = self._received_start + drop / SAMPLE_RATE
        return kept

    def heard(self, audio: np.ndarray, audio_start: float) -> None:
        """The stream's audio from `audio_start` on, as received (a whole Realtime commit), so that the
        context of the next segment is the sound that preceded it, not the previous segment's trimmed
        copy: a client's commit falls anywhere, inside a word too, and a gap of zeros there changes it."""
        end = self._received_start + len(self._received) / SAMPLE_RATE
        if len(self._received) and abs(audio_start - end) < 0.5 / SAMPLE_RATE:
            audio = np.concatenate([self._received, audio])
            audio_start = self._received_start
        keep = int((CONTEXT_SECONDS + self.options.max_segment_seconds) * SAMPLE_RATE)
        self._received_start = audio_start + max(0, len(audio) - keep) / SAMPLE_RATE
        self._received = np.asarray(audio[-keep:], np.float32)

    def next(self, segment: SegmentFinished) -> tuple[SegmentFinished, Context | None, Said]:
        """`segment` (already trimmed by for_model) as the model hears it, its context (None: it has
        none), and where its own words go once decoded (for the segment after it)."""
        previous, said = self.previous, self.said
        self.previous, self.said = segment, Said()
        room = self.options.max_segment_seconds - len(segment.audio) / SAMPLE_RATE
        seconds = min(CONTEXT_SECONDS, room)
        if previous is None or round(segment.start - previous.end, 6) >= JOIN_SILENCE or seconds < FRAME_SECONDS:
            return segment, None, self.said
        begin = max(previous.audio_start, segment.audio_start - seconds)
        received = self._received_between(begin, segment.audio_start)
        if received is not None:
            heard, gap = received, np.zeros(0, np.float32)
        else:
            first = int(round((begin - previous.audio_start) * SAMPLE_RATE))
            last = int(round((segment.audio_start - previous.audio_start) * SAMPLE_RATE))
            heard = previous.audio[first:min(last, len(previous.audio))]
            # The pause between them that neither segment kept (at most JOIN_SILENCE less both rolls) is silence.
            gap = np.zeros(max(0, last - first - len(heard)), np.float32)
        if not len(heard):
            return segment, None, self.said
        audio = np.concatenate([heard, gap, segment.audio]).astype(np.float32, copy=False)
        joined = dataclasses.replace(segment, audio=audio, audio_start=round(begin, 6))
        self.said.before = said
        last = said
        for _ in range(MAX_SAID_CHAIN - 1):  # the chain is no longer than since() reads
            last = last.before if last is not None else None
        if last is not None:
            last.before = None
        return joined, Context(round(begin, 6), segment.start, said), self.said

    def _received_between(self, begin: float, end: float) -> np.ndarray | None:
        """The audio received from `begin` to `end` (stream seconds), or None where it was not all kept."""
        first = int(round((begin - self._received_start) * SAMPLE_RATE))
        last = int(round((end - self._received_start) * SAMPLE_RATE))
        if not len(self._received) or first < 0 or last > len(self._received) or last <= first:
            return None
        return self._received[first:last]
