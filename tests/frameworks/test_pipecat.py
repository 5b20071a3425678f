"""pipecat (1.14) against the server as docs/openai.md says to configure it, so the docs cannot drift.

No transport: pipecat's own test harness (pipecat.tests.utils.run_test) pushes audio frames into the
services, and pipecat's Silero VAD (VADProcessor) marks the turns, as a transport's VAD would."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pipecat", reason="pipecat-ai is not installed (pip install -e '.[frameworks]')")

from pipecat.services.openai.stt import OpenAIRealtimeSTTService, OpenAISTTService  # noqa: E402

from bench.framework_drivers import pipecat_transcripts  # noqa: E402
from frameworks_testkit import expected_words, pcm_frames  # noqa: E402
from openai_testkit import DEMO, HELD_OUT, TOKEN, knows_words, sdk, words  # noqa: E402


async def transcribe(service: Any, path: Path = HELD_OUT) -> list[str]:
    """A recording's frames through pipecat's VAD and `service` at 4x real time (as the bench drives it);
    the TranscriptionFrames' texts."""
    return await pipecat_transcripts(service, pcm_frames(path), pace=4.0, quiet=4.0, start_timeout=10.0)


async def test_realtime_service_default_mode(serve_test_server, test_model_dir):
    """OpenAIRealtimeSTTService with base_url ws://HOST:PORT/v1/realtime, its default mode: turn_detection
    off, pipecat's VAD commits each turn; one transcript per turn."""
    async with serve_test_server(token=TOKEN) as url:
        service = OpenAIRealtimeSTTService(api_key=TOKEN, base_url=f"ws://127.0.0.1:{url.port}/v1/realtime",
                                           model="gpt-4o-transcribe")
        texts = await transcribe(service)
    assert len(texts) == 3 and all(t.strip() for t in texts), texts
    if expected_words(test_model_dir):
        assert words(" ".join(texts)) == expected_words(test_model_dir), texts


async def test_realtime_default_mode_says_what_the_upload_says(serve_test_server, test_model_dir):
    """"stop", 0.8 s of pause, a digit string, through pipecat's default mode: however its VAD commits it
    (a commit holding the short word and the digits was decoded as one segment and lost "stop", issue 36),
    the words are the upload's for the same recording."""
    recording = DEMO / "stop_pause.wav"
    async with serve_test_server(token=TOKEN) as url:
        upload = (await sdk(url).audio.transcriptions.create(model="whisper-1", file=recording)).text
        service = OpenAIRealtimeSTTService(api_key=TOKEN, base_url=f"ws://127.0.0.1:{url.port}/v1/realtime",
                                           model="gpt-4o-transcribe")
        texts = await transcribe(service, recording)
    assert texts and all(t.strip() for t in texts), texts
    if knows_words(test_model_dir):
        assert words(" ".join(texts)) == words(upload) == ["stop", "one", "seven", "zero", "two", "oh"], texts


async def test_file_per_segment_service(serve_test_server, test_model_dir):
    """OpenAISTTService with the http base URL: each VAD segment is uploaded as a file."""
    async with serve_test_server(token=TOKEN) as url:
        service = OpenAISTTService(api_key=TOKEN, base_url=f"{url.http}/v1", model="whisper-1")
        texts = await transcribe(service)
    assert len(texts) == 3 and all(t.strip() for t in texts), texts
    if expected_words(test_model_dir):
        assert words(" ".join(texts)) == expected_words(test_model_dir), texts


async def test_file_service_in_real_time_says_what_was_spoken(serve_test_server, test_model_dir):
    """OpenAISTTService with its defaults, in real time as a live pipeline runs it: pipecat's VAD (stop_secs
    0.2) cuts the first of two held-out utterances in two and uploads each piece as it ends
    (tests/fixtures/demo/pipecat_turns.wav). The server hears the second piece after the first
    (server/upload_sequence.py), so the words are the ones spoken; decoded alone, the second piece was
    "pause back start" (with --no-join-uploads it still is)."""
    recording = DEMO / "pipecat_turns.wav"
    spoken = json.loads(recording.with_suffix(".json").read_text())["texts"]
    async with serve_test_server(token=TOKEN) as url:
        service = OpenAISTTService(api_key=TOKEN, base_url=f"{url.http}/v1")
        texts = await pipecat_transcripts(service, pcm_frames(recording), pace=1.0, quiet=2.0, start_timeout=10.0)
    assert len(texts) > len(spoken), texts  # pipecat cut an utterance
    if knows_words(test_model_dir):
        assert words(" ".join(texts)) == words(" ".join(spoken)), texts
