"""LiveKit Agents (1.8, livekit-plugins-openai) against the server as docs/openai.md says to configure it.

No room, no transport: audio frames go straight into the plugin's STT, as an agent session would push them."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai is not installed "
                    "(pip install -e '.[frameworks]')")

from livekit import rtc  # noqa: E402
from livekit.agents import stt as agents_stt  # noqa: E402
from livekit.agents import utils  # noqa: E402
from livekit.plugins import openai as lk_openai  # noqa: E402

from frameworks_testkit import FRAME_MS, expected_words, pcm_frames  # noqa: E402
from openai_testkit import TOKEN, words  # noqa: E402


def audio_frames() -> list[rtc.AudioFrame]:
    return [rtc.AudioFrame(chunk, sample_rate=16000, num_channels=1, samples_per_channel=len(chunk) // 2)
            for chunk in pcm_frames()]


async def test_recognize_posts_the_buffer(serve_test_server, test_model_dir):
    """openai.STT(base_url=http://HOST:PORT/v1): recognize() uploads the buffer as a file; languages=["en"]
    goes out as gpt-transcribe's plural field and is honoured."""
    async with serve_test_server(token=TOKEN) as url:
        stt = lk_openai.STT(base_url=f"{url.http}/v1", api_key=TOKEN, model="gpt-4o-transcribe")
        event = await stt.recognize(audio_frames())
        assert event.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT
        text = event.alternatives[0].text
        assert text.strip()
        if expected_words(test_model_dir):
            assert words(text) == expected_words(test_model_dir)
        plural = lk_openai.STT(base_url=f"{url.http}/v1", api_key=TOKEN, model="gpt-transcribe", language=["xx"])
        with pytest.raises(Exception, match="xx"):  # sent as languages[]: an unknown language is refused
            await plural.recognize(audio_frames())


async def test_realtime_stream(serve_test_server, test_model_dir):
    """openai.STT(..., use_realtime=True): the stream runs over /v1/realtime with LiveKit's default server_vad
    (prefix_padding_ms 600); one final transcript per turn."""
    async with serve_test_server(token=TOKEN) as url:
        async with utils.http_context.open():  # the plugin's WebSocket session, outside a job
            stt = lk_openai.STT(base_url=f"{url.http}/v1", api_key=TOKEN, model="gpt-4o-transcribe",
                                use_realtime=True)
            stream = stt.stream()
            finals: list[str] = []

            async def read() -> None:
                async for event in stream:
                    if event.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT:
                        finals.append(event.alternatives[0].text)

            reader = asyncio.ensure_future(read())
            for frame in audio_frames():
                stream.push_frame(frame)
                await asyncio.sleep(FRAME_MS / 4000)
            stream.end_input()
            for _ in range(300):  # the last turn's answer (the stream stays open until closed)
                if len(finals) >= 3:
                    break
                await asyncio.sleep(0.1)
            await stream.aclose()
            reader.cancel()
    assert len(finals) == 3 and all(t.strip() for t in finals), finals
    if expected_words(test_model_dir):
        assert words(" ".join(finals)) == expected_words(test_model_dir), finals

