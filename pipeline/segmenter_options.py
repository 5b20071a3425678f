"""The segmenter's options (pipeline/segmenter.py), and the checks that name the first one that makes no sense."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .audio import VAD_FRAME, samples_to_seconds
from .json_text import finite_number
from .vad import VADS

FRAME_SECONDS = samples_to_seconds(VAD_FRAME)  # 0.03 s
HOLD_MARGIN = 0.15  # an open segment's frames are voiced down to vad_threshold less this (Silero's default) ...
MIN_HOLD = 0.01  # ... but never at 0, where every frame would be


@dataclass(frozen=True)
class SegmenterOptions:
    vad: str = "webrtc"  # the frame VAD: "webrtc" or "silero" (pipeline/vad.py)
    vad_aggressiveness: int = 3  # webrtcvad 0-3; 3 is as sensitive to espeak speech as 2, with fewer false starts
    vad_threshold: float = 0.5  # Silero's speech probability that makes a frame voiced (webrtc's is 0 or 1)
    start_frames: int = 3  # voiced frames among the last `start_window` that open a segment ...
    start_window: int = 10  # ... (300 ms): a hysteresis against single noisy frames
    pre_roll: float = 0.3  # seconds of audio kept before the first voiced frame (soft onsets)
    end_silence: float = 0.5  # seconds without a voiced frame that end a segment
    post_roll: float = 0.2  # seconds of audio kept after the last voiced frame (at most end_silence)
    min_speech: float = 0.2  # voiced seconds a segment needs before it is announced; shorter ones are dropped
    # Silence that drops a segment not yet announced (a click, a cough, webrtcvad's first frames of a noisy
    # stream, which it takes for speech): speech after it opens a segment of its own, so the gap never
    # reaches the model as leading silence (issue 25).
    false_start_silence: float = 0.3
    # A segment that opens on a steady sound (its frames within this many dB of their median for at least
    # `steady_lead` seconds) and then steps up by more starts at the step: webrtcvad takes steady room
    # noise after digital silence (a muted microphone, a gap a client filled with zeros) for speech for up
    # to a second, and that lead would reach the model (issue 25). 0 disables the rule.
    steady_lead_db: float = 6.0
    steady_lead: float = 0.15
    max_segment_seconds: float = 30.0  # the largest audio a segment may hold (the engine's largest container)
    cut_search: float = 3.0  # where to look, back from the limit, for the quietest frame to cut at
    partial_interval: float = 0.5  # seconds of new audio between PartialDue events; 0 disables partials
    partial_window: float = 15.0  # a partial covers at most the last this-many seconds (<= max_segment_seconds)


def validate_options(options: SegmenterOptions) -> None:
    """Raise ValueError naming the first option that makes no sense."""
    o = options
    checks = [
        (o.vad in VADS, f"vad must be one of {', '.join(VADS)}, got {o.vad!r}"),
        (isinstance(o.vad_threshold, (int, float)) and 0 < o.vad_threshold <= 1,
         f"vad_threshold must be a number above 0 and at most 1, got {o.vad_threshold!r}"),
        (o.vad_aggressiveness in (0, 1, 2, 3) and not isinstance(o.vad_aggressiveness, bool),
         f"vad_aggressiveness must be 0, 1, 2 or 3, got {o.vad_aggressiveness!r}"),
        (isinstance(o.start_window, int) and o.start_window >= 1, f"start_window must be an integer >= 1, got {o.start_window!r}"),
        (isinstance(o.start_frames, int) and 1 <= o.start_frames <= o.start_window,
         f"start_frames must be an integer from 1 to start_window ({o.start_window}), got {o.start_frames!r}"),
    ]
    for name in ("pre_roll", "end_silence", "post_roll", "min_speech", "false_start_silence", "steady_lead_db",
                 "steady_lead", "max_segment_seconds",
                 "cut_search", "partial_interval", "partial_window"):
        value = getattr(o, name)
        checks.append((finite_number(value) and value >= 0,
                       f"{name} must be a finite number >= 0, got {value!r}"))
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if o.end_silence < FRAME_SECONDS:
        raise ValueError(f"end_silence must be at least one VAD frame ({FRAME_SECONDS} s), got {o.end_silence}")
    if o.false_start_silence < FRAME_SECONDS:
        raise ValueError(f"false_start_silence must be at least one VAD frame ({FRAME_SECONDS} s), "
                         f"got {o.false_start_silence}")
    if o.post_roll > o.end_silence:
        raise ValueError(f"post_roll ({o.post_roll} s) cannot exceed end_silence ({o.end_silence} s)")
    if o.max_segment_seconds < 1.0:
        raise ValueError(f"max_segment_seconds must be at least 1 s, got {o.max_segment_seconds}")
    if o.pre_roll + o.start_window * FRAME_SECONDS > o.max_segment_seconds / 2:
        raise ValueError("pre_roll plus the start window must fit in half of max_segment_seconds")
    if not FRAME_SECONDS <= o.cut_search <= o.max_segment_seconds / 2:
        raise ValueError(f"cut_search must be from {FRAME_SECONDS} s to half of max_segment_seconds, got {o.cut_search}")
    if o.partial_interval and o.partial_window < FRAME_SECONDS:  # above max_segment_seconds it is clipped
        raise ValueError(f"partial_window must be at least {FRAME_SECONDS} s, got {o.partial_window}")


def fit_to_container(options: SegmenterOptions, largest: float, cut: bool = False) -> SegmenterOptions:
    """The one rule between the segmenter and the engine: the largest container (seconds) holds a whole
    segment, else every longer utterance would fail its inference. A model whose export fixes its largest
    container (Family.export_container: Qwen3-ASR, e.g. 8 s for its tiny geometry) is served by cutting
    segments and partial windows to it (`cut`); containers a user chose smaller are refused (ValueError)."""
    if largest >= options.max_segment_seconds:
        return options
    if not cut:
        raise ValueError(f"the largest must hold a whole segment ({options.max_segment_seconds:g} s of audio), "
                         f"got {largest:g} s")
    return replace(options, max_segment_seconds=largest, partial_window=min(options.partial_window, largest))
