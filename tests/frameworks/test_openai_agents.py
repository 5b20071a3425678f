"""openai-agents (0.24, agents.voice) against the server as docs/openai.md says to configure it.

OpenAI's own voice pipeline with its defaults: VoicePipeline over a StreamedAudioInput, whose STT session
(OpenAISTTModel, model gpt-transcribe) opens /v1/realtime?intent=transcription with turn_detection
{"type": "semantic_vad"} and 24 kHz PCM16; only the base URL and the key are ours. The workflow (an agent
and its LLM, in an app) just keeps each turn's transcript and says nothing, so no speech is synthesised."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import soxr

pytest.importorskip("agents.voice", reason="openai-agents is not installed (.ci/run installs it: see there)")

from agents.voice import (OpenAIVoiceModelProvider, StreamedAudioInput, VoicePipeline,  # noqa: E402
                          VoicePipelineConfig, VoiceWorkflowBase)

from frameworks_testkit import FRAME_MS, expected_words, pcm_frames  # noqa: E402
from openai_testkit import TOKEN, words  # noqa: E402

AGENTS_RATE = 24000  # what StreamedAudioInput's session declares (audio/pcm, rate 24000)


class KeepTranscripts(VoiceWorkflowBase):
    """A workflow that answers nothing: each transcribed turn is kept."""

    def __init__(self) -> None:
        self.turns: list[str] = []

    async def run(self, transcription: str) -> AsyncIterator[str]:
        self.turns.append(transcription)
        return
        yield  # an async generator with nothing to say


def audio_chunks() -> list[np.ndarray]:
    """The recording (and its trailing second of silence) at 24 kHz, as int16 arrays of 20 ms."""
    audio = np.frombuffer(b"".join(pcm_frames()), np.int16).astype(np.float32) / 32768
    audio = (np.clip(soxr.resample(audio, 16000, AGENTS_RATE), -1, 1) * 32767).astype(np.int16)
    step = AGENTS_RATE * FRAME_MS // 1000
    return [audio[i:i + step] for i in range(0, len(audio) - step + 1, step)]


async def test_voice_pipeline_defaults(serve_test_server, test_model_dir):
    """VoicePipeline(workflow, config=VoicePipelineConfig(model_provider=OpenAIVoiceModelProvider(
    base_url="http://HOST:PORT/v1", api_key=...))): semantic_vad's default eagerness (auto: 0.5 s of
    silence) ends each of the three turns; the input's end commits and clears the buffer."""
    async with serve_test_server(token=TOKEN) as url:
        workflow = KeepTranscripts()
        pipeline = VoicePipeline(workflow=workflow, config=VoicePipelineConfig(
            model_provider=OpenAIVoiceModelProvider(base_url=f"{url.http}/v1", api_key=TOKEN),
            tracing_disabled=True))  # traces would be uploaded to OpenAI's platform
        audio = StreamedAudioInput()
        result = await pipeline.run(audio)
        for chunk in audio_chunks():
            await audio.add_audio(chunk)
            await asyncio.sleep(FRAME_MS / 4000)  # real-time pace is not needed
        await audio.add_audio(None)  # the end of the input: the session's last commit
        events = [event async for event in result.stream()]
    assert not [e for e in events if e.type == "voice_stream_event_error"], events
    texts = workflow.turns
    assert len(texts) == 3 and all(t.strip() for t in texts), texts
    if expected_words(test_model_dir):
        assert words(" ".join(texts)) == expected_words(test_model_dir), texts
