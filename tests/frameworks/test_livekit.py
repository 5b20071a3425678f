"""LiveKit Agents (1.8, livekit-plugins-openai) against the server as docs/openai.md says to configure it.

No room, no transport: audio frames go straight into the plugin's STT, as an agent session would push them."""
from __future__ import annotations

import pytest

pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai is not installed "
                    "(pip install -e '.[frameworks]')")

from livekit.agents import stt as agents_stt  # noqa: E402
from livekit.agents import utils  # noqa: E402
from livekit.plugins import openai as lk_openai  # noqa: E402

from bench.framework_drivers import livekit_events, livekit_finals, livekit_frames  # noqa: E402
from frameworks_testkit import expected_words, pcm_frames  # noqa: E402
from openai_testkit import TOKEN, words  # noqa: E402


def audio_frames() -> list:
    return livekit_frames(pcm_frames())


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
            # the last turn's answer comes after the input's end (the stream stays open until closed)
            events = await livekit_events(stt.stream(), pcm_frames(), pace=4.0, quiet=30.0,
                                          done=lambda events: len(livekit_finals(events)) >= 3)
    finals = livekit_finals(events)
    assert len(finals) == 3 and all(t.strip() for t in finals), finals
    if expected_words(test_model_dir):
        assert words(" ".join(finals)) == expected_words(test_model_dir), finals

