"""openai-agents (0.24, agents.voice) against the server as docs/openai.md says to configure it.

OpenAI's own voice pipeline with its defaults: VoicePipeline over a StreamedAudioInput, whose STT session
(OpenAISTTModel, model gpt-transcribe) opens /v1/realtime?intent=transcription with turn_detection
{"type": "semantic_vad"} and 24 kHz PCM16; only the base URL and the key are ours. The workflow (an agent
and its LLM, in an app) just keeps each turn's transcript and says nothing, so no speech is synthesised
(bench/framework_drivers.py drives it, for this test and for `python -m bench frameworks` alike)."""
from __future__ import annotations

import pytest

pytest.importorskip("agents.voice", reason="openai-agents is not installed (.ci/run installs it: see there)")

from bench.framework_drivers import agents_chunks, agents_turns  # noqa: E402
from frameworks_testkit import expected_words, pcm_frames  # noqa: E402
from openai_testkit import TOKEN, words  # noqa: E402


async def test_voice_pipeline_defaults(serve_test_server, test_model_dir):
    """VoicePipeline(workflow, config=VoicePipelineConfig(model_provider=OpenAIVoiceModelProvider(
    base_url="http://HOST:PORT/v1", api_key=...))): semantic_vad's default eagerness (auto: 0.5 s of
    silence) ends each of the three turns; the input's end commits and clears the buffer."""
    async with serve_test_server(token=TOKEN) as url:
        texts, events = await agents_turns(f"{url.http}/v1", TOKEN, agents_chunks(pcm_frames()), pace=4.0)
    assert not [e for e in events if e.type == "voice_stream_event_error"], events
    assert len(texts) == 3 and all(t.strip() for t in texts), texts
    if expected_words(test_model_dir):
        assert words(" ".join(texts)) == expected_words(test_model_dir), texts
