"""Realtime session settings (server/realtime_events.py): both update shapes, and our VAD's mapping."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.segmenter_options import SegmenterOptions, validate_options
from server.realtime_events import (EAGERNESS_SILENCE_MS, EventError, SessionConfig, TurnDetection, apply_update,
                                    segmenter_options, session_object, vad_mode)

LANGUAGES = {"auto": 0, "en": 4, "zh": 3}


def test_ga_and_beta_updates_set_the_same_settings():
    ga = apply_update(SessionConfig(), {"type": "session.update", "session": {"type": "transcription", "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 16000},
                  "transcription": {"model": "gpt-4o-transcribe", "language": "en", "prompt": "digits"},
                  "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}}}, LANGUAGES)
    assert ga == SessionConfig(16000, "gpt-4o-transcribe", "en", "digits", TurnDetection(800, 300, 0.5))
    beta = apply_update(SessionConfig(), {"type": "transcription_session.update", "session": {
        "input_audio_format": "pcm16", "input_audio_transcription": {"model": "whisper-1", "language": "zh"},
        "turn_detection": None}}, LANGUAGES)
    assert beta == SessionConfig(24000, "whisper-1", "zh", "", None)
    unchanged = apply_update(ga, {"type": "session.update", "session": {"type": "transcription"}}, LANGUAGES)
    assert unchanged == ga


@pytest.mark.parametrize("session, param", [
    ({"type": "realtime"}, "session.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}, "session.audio.input.format.rate"),
    ({"audio": {"input": {"turn_detection": {"type": "near_field_vad"}}}}, "session.audio.input.turn_detection"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": 1}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"audio": {"input": {"turn_detection": {"threshold": 2}}}}, "session.audio.input.turn_detection"),
    ({"audio": {"input": {"transcription": {"language": "fr"}}}}, "session.audio.input.transcription.language"),
    ({"audio": {"input": {"transcription": {"model": 7}}}}, "session.audio.input.transcription.model"),
    ({"audio": {"input": {"transcription": {"languages": ["fr"]}}}}, "session.audio.input.transcription.languages"),
    ({"audio": {"input": {"transcription": {"languages": "en"}}}}, "session.audio.input.transcription.languages"),
    ({"audio": {"input": {"transcription": {"languages": [7]}}}}, "session.audio.input.transcription.languages"),
    ({"audio": {"input": {"transcription": "en"}}}, "session.audio.input.transcription"),
    ({"audio": {"input": "pcm"}}, "session.audio.input"),
    ({"audio": ["pcm"]}, "session.audio"),
])
def test_bad_settings_name_their_parameter(session, param):
    with pytest.raises(EventError) as error:
        apply_update(SessionConfig(), {"type": "session.update", "session": session}, LANGUAGES)
    assert error.value.param == param and error.value.message


def test_the_first_of_languages_is_the_language():
    """gpt-transcribe's plural field, as LiveKit's openai plugin sends it: the first entry is honoured."""
    def language(transcription: dict) -> str:
        update = {"type": "session.update", "session": {"audio": {"input": {"transcription": transcription}}}}
        return apply_update(SessionConfig(), update, LANGUAGES).language
    assert language({"model": "gpt-transcribe", "languages": ["zh", "en"]}) == "zh"
    assert language({"languages": ["", "en"]}) == "en" and language({"languages": []}) == "auto"
    assert language({"language": "en", "languages": ["zh"]}) == "en"  # the singular field wins


def test_server_vad_maps_onto_our_segmenter():
    assert [vad_mode(t) for t in (0.0, 0.1, 0.2, 0.4, 0.5, 0.9)] == [0, 0, 1, 2, 3, 3]
    base = SegmenterOptions()
    options = segmenter_options(base, SessionConfig(turn_detection=TurnDetection(100, 500, 0.2)))
    assert (options.end_silence, options.post_roll, options.pre_roll, options.vad_aggressiveness) == (0.1, 0.1, 0.5, 1)
    assert segmenter_options(base, SessionConfig(turn_detection=None)) == base
    silero = segmenter_options(dataclasses.replace(base, vad="silero"),
                               SessionConfig(turn_detection=TurnDetection(100, 500, 0.7)))
    assert (silero.vad, silero.vad_threshold) == ("silero", 0.7)  # threshold is Silero's own probability
    zero = segmenter_options(base, SessionConfig(turn_detection=TurnDetection(100, 500, 0.0)))
    validate_options(zero)  # a threshold of 0 is a tiny probability, not "every frame"


def turn_detection(config: SessionConfig, data: dict | None) -> TurnDetection | None:
    update = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": data}}}}
    return apply_update(config, update, LANGUAGES).turn_detection


def test_semantic_vad_eagerness_is_our_end_silence():
    """openai-agents' default turn detection, {"type": "semantic_vad"}: eagerness auto, as OpenAI's; each
    eagerness picks the segmenter's end silence (low 1 s, medium and auto 0.5 s, high 0.3 s)."""
    assert EAGERNESS_SILENCE_MS == {"low": 1000, "medium": 500, "auto": 500, "high": 300}
    default = turn_detection(SessionConfig(), {"type": "semantic_vad", "create_response": True})
    assert default == TurnDetection(500, 300, 0.5, "auto")
    base = SegmenterOptions()
    silences = {}
    for eagerness in ("low", "medium", "high", "auto"):
        vad = turn_detection(SessionConfig(), {"type": "semantic_vad", "eagerness": eagerness})
        options = segmenter_options(base, SessionConfig(turn_detection=vad))
        silences[eagerness] = options.end_silence
        assert (options.pre_roll, options.vad_aggressiveness) == (0.3, 3)
    assert silences == {"low": 1.0, "medium": 0.5, "high": 0.3, "auto": 0.5}
    high = SessionConfig(turn_detection=TurnDetection(300, 300, 0.5, "high"))
    assert turn_detection(high, {"type": "semantic_vad"}).eagerness == "high"  # absent: kept
    assert turn_detection(high, {"type": "server_vad"}) == TurnDetection()  # back to server_vad's defaults
    assert session_object("sess", high)["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "high"}


def test_a_huge_language_is_cut_in_the_error():
    huge = "x" * 100_000
    with pytest.raises(EventError) as error:
        apply_update(SessionConfig(), {"type": "session.update", "session": {
            "audio": {"input": {"transcription": {"language": huge}}}}}, LANGUAGES)
    assert len(error.value.message) < 300 and "100000 characters" in error.value.message
