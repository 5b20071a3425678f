"""Deepgram's own clients against the server, with their defaults and only the base URL and key changed,
configured as docs/deepgram.md says (the snippets are read out of the doc and run here, so it cannot drift):
deepgram-sdk 7 (live and pre-recorded), livekit-plugins-deepgram 1.8 (stream() and recognize()) and pipecat's
DeepgramSTTService (1.14). No room, no transport, no cloud: audio frames are pushed into the services."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepgram", reason="deepgram-sdk is not installed (pip install -e '.[frameworks]')")
pytest.importorskip("livekit.plugins.deepgram", reason="livekit-plugins-deepgram is not installed")
pytest.importorskip("pipecat.services.deepgram.stt", reason="pipecat-ai[deepgram] is not installed")

from livekit.agents import stt as agents_stt  # noqa: E402
from livekit.agents import utils  # noqa: E402

from bench.framework_drivers import livekit_events, livekit_finals, livekit_frames  # noqa: E402
from frameworks_testkit import FRAME_MS, ROOT, expected_words, pcm_frames  # noqa: E402
from openai_testkit import TOKEN, words  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK imports websockets.legacy
DOC = ROOT / "docs" / "deepgram.md"


def snippet(name: str) -> str:
    """The Python block of docs/deepgram.md under the comment `# <name>`."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"```python\n# {re.escape(name)}\n(.*?)```", text, re.S)
    assert match, f"docs/deepgram.md has no ```python block starting with '# {name}'"
    return match.group(1)


def build(name: str, url: Any, **names: Any) -> dict[str, Any]:
    """Run a doc snippet with HOST:PORT and the key filled in; its variables."""
    code = snippet(name).replace("127.0.0.1:8765", f"127.0.0.1:{url.port}").replace('"YOUR_TOKEN"', repr(TOKEN))
    scope: dict[str, Any] = dict(names)
    exec(compile(code, str(DOC), "exec"), scope)  # noqa: S102 - our own documentation
    return scope


def audio_frames() -> list[Any]:
    return livekit_frames(pcm_frames())


def check_texts(texts: list[str], model_dir: Path) -> None:
    assert len(texts) == 3 and all(t.strip() for t in texts), texts
    if expected_words(model_dir):
        assert words(" ".join(texts)) == expected_words(model_dir), texts


async def test_sdk_live_and_prerecorded(serve_test_server, test_model_dir):
    """deepgram-sdk's AsyncDeepgramClient with a custom environment: listen.v1.connect() with interim results
    (several per utterance, finals with words), CloseStream -> Metadata; media.transcribe_file()."""
    from deepgram.core.events import EventType
    from deepgram.listen.v1.types import ListenV1Metadata, ListenV1Results

    async with serve_test_server(token=TOKEN) as url:
        client = build("deepgram-sdk", url)["client"]
        got: list[Any] = []
        async with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate="16000",
                                            interim_results="true", utterance_end_ms="1000") as connection:
            connection.on(EventType.MESSAGE, got.append)
            listening = asyncio.ensure_future(connection.start_listening())
            for chunk in pcm_frames():
                await connection.send_media(chunk)
                await asyncio.sleep(FRAME_MS / 4000)
            await connection.send_close_stream()
            await asyncio.wait_for(listening, 30)
        results = [m for m in got if isinstance(m, ListenV1Results)]
        finals = [m for m in results if m.is_final]
        check_texts([m.channel.alternatives[0].transcript for m in finals], test_model_dir)
        assert len(results) > len(finals), "interim results were asked for"
        assert all(m.speech_final and m.channel.alternatives[0].words for m in finals)
        assert isinstance(got[-1], ListenV1Metadata) and got[-1].channels == 1
        assert [type(m).__name__ for m in got].count("ListenV1UtteranceEnd") == 3

        wav = (ROOT / "tests" / "fixtures" / "demo" / "multi.wav").read_bytes()
        answer = await client.listen.v1.media.transcribe_file(request=wav, model="nova-3", utterances=True)
        transcript = answer.results.channels[0].alternatives[0].transcript
        assert len(answer.results.utterances) == 3
        if expected_words(test_model_dir):
            assert words(transcript) == expected_words(test_model_dir)
        assert answer.metadata.model_info[answer.metadata.models[0]]["arch"] == "nova-3"


async def test_livekit_stream_and_recognize(serve_test_server, test_model_dir):
    """livekit-plugins-deepgram's STT(base_url=...) with its defaults (nova-3, en-US, interim results,
    endpointing 25 ms, vad_events, filler_words, ...): stream() gives interim and final transcripts and one
    END_OF_SPEECH per turn; recognize() posts a WAV."""
    async with serve_test_server(token=TOKEN) as url:
        async with utils.http_context.open():
            stt = build("livekit", url)["stt"]
            events = await livekit_events(
                stt.stream(), pcm_frames(), pace=4.0, quiet=30.0, end_first=False,
                done=lambda events: sum(e.type == agents_stt.SpeechEventType.END_OF_SPEECH for e in events) >= 3)
            kinds = [e.type for e in events]
            finals = livekit_finals(events)
            assert kinds.count(agents_stt.SpeechEventType.END_OF_SPEECH) == 3, kinds
            assert agents_stt.SpeechEventType.INTERIM_TRANSCRIPT in kinds
            # LiveKit's 25 ms endpointing is raised to MIN_ENDPOINTING_MS, so no turn is cut into fragments
            check_texts(finals, test_model_dir)

            event = await stt.recognize(audio_frames())
            assert event.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT
            if expected_words(test_model_dir):
                assert words(event.alternatives[0].text) == expected_words(test_model_dir)


async def test_pipecat_service(serve_test_server, test_model_dir):
    """pipecat's DeepgramSTTService(base_url=...) with its defaults: a TranscriptionFrame per turn."""
    from pipecat.frames.frames import InputAudioRawFrame, InterimTranscriptionFrame, TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.tests.utils import SleepFrame, run_test

    async with serve_test_server(token=TOKEN) as url:
        service = build("pipecat", url)["stt"]
        frames: list[Any] = [item for chunk in pcm_frames()
                             for item in (InputAudioRawFrame(audio=chunk, sample_rate=16000, num_channels=1),
                                          SleepFrame(sleep=FRAME_MS / 4000))]
        down, _ = await run_test(Pipeline([service]), frames_to_send=frames + [SleepFrame(sleep=2.0)],
                                 start_timeout=10.0)
    check_texts([f.text for f in down if isinstance(f, TranscriptionFrame)], test_model_dir)
    assert any(isinstance(f, InterimTranscriptionFrame) for f in down)
