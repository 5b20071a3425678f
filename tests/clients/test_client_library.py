"""clients/client.py against a real server: iteration, callbacks, audio types, errors as exceptions."""
from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
import soxr
import websockets
from client_testkit import knows_words, normalise

from clients.client import (ClientError, ConnectError, ServerError, StreamClosedError, connect, stream_endpoint, stream_url,
                            to_pcm)
from pipeline.audio import SAMPLE_RATE
from server.protocol import CLOSE_TRY_AGAIN, Done, Final, Partial

CHUNK = 0.1  # seconds per send


def chunks(audio: np.ndarray, rate: int) -> list[np.ndarray]:
    step = int(rate * CHUNK)
    return [audio[i:i + step] for i in range(0, len(audio), step)]


def check_finals(finals: list[Final], speech, model_dir) -> None:
    """One final per utterance, in order, inside the audio; word for word with the demo model."""
    assert [f.segment for f in finals] == list(range(len(speech.utterances)))
    for final, utterance in zip(finals, speech.utterances):
        assert 0 <= final.start < final.end <= speech.duration + 0.1
        assert final.start <= utterance["end"] and final.end >= utterance["start"]  # overlaps its speech
    if knows_words(model_dir):
        assert [normalise(f.text) for f in finals] == [normalise(u["text"]) for u in speech.utterances]


async def test_iteration_yields_typed_results_then_done(serve_test_server, speech, test_model_dir):
    async with serve_test_server(partial_interval=0.3) as url:
        async with connect(url, sample_rate=SAMPLE_RATE) as stream:
            assert stream.ready.sample_rate == SAMPLE_RATE and stream.session

            async def collect() -> list:
                return [result async for result in stream]

            results = asyncio.create_task(collect())
            for chunk in chunks((speech.audio * 32767).astype(np.int16), SAMPLE_RATE):  # int16 numpy
                await stream.send(chunk)
                await asyncio.sleep(0)  # let partials through now and then
            done = await stream.stop()
            results = await results
    assert isinstance(done, Done) and done.segments == len(speech.utterances)
    assert results[-1] == done
    assert all(isinstance(r, (Partial, Final)) for r in results[:-1])
    finals = [r for r in results if isinstance(r, Final)]
    assert finals == stream.finals
    check_finals(finals, speech, test_model_dir)
    for i, partial in enumerate(results):  # a partial never follows its segment's final
        if isinstance(partial, Partial):
            assert not any(f.segment == partial.segment for f in results[:i] if isinstance(f, Final))


async def test_callbacks_with_resampled_float_audio(serve_test_server, speech, test_model_dir):
    audio48 = soxr.resample(speech.audio, SAMPLE_RATE, 48000).astype(np.float32)
    partials: list[Partial] = []
    finals: list[Final] = []

    async def on_partial(partial: Partial) -> None:  # a coroutine callback
        partials.append(partial)

    async with serve_test_server(partial_interval=0.3) as url:
        async with connect(url, sample_rate=48000, format="f32le", on_partial=on_partial,
                           on_final=finals.append) as stream:  # a plain callback
            for chunk in chunks(audio48, 48000):
                await stream.send(chunk)
            done = await stream.stop()
    assert done.segments == len(finals) == len(speech.utterances)
    assert finals == stream.finals
    assert all(isinstance(p, Partial) for p in partials)
    check_finals(finals, speech, test_model_dir)


async def test_bytes_and_stereo_arrays_are_sent_as_declared(serve_test_server, speech):
    stereo = np.stack([speech.audio, speech.audio], axis=1)
    async with serve_test_server() as url:
        async with connect(url, sample_rate=SAMPLE_RATE, channels=2, partials=False) as stream:
            half = len(stereo) // 2
            await stream.send(to_pcm(stereo[:half], "s16le", channels=2))  # bytes pass through
            await stream.send(stereo[half:])
            done = await stream.stop()
        with pytest.raises(ValueError, match="channel"):
            to_pcm(speech.audio, "s16le", channels=2)
    assert done.segments == len(speech.utterances)


async def test_a_whole_recording_in_one_send(serve_test_server, speech):
    """Over the server's 1 MiB message limit in one call (a bot handing over a recording): the library sends
    it as several messages, plain or resumable, and every utterance comes back."""
    audio = np.tile(speech.audio, 5)  # 39 s, 1.2 MiB of s16le
    async with serve_test_server(partial_interval=0.0) as url:
        for resume in (None, True):
            async with connect(url, partials=False, resume=resume) as stream:
                await stream.send(audio)
                done = await stream.stop()
            assert done.segments == len(stream.finals) == 5 * len(speech.utterances), resume


def test_to_pcm_scales_and_clips() -> None:
    pcm = np.frombuffer(to_pcm(np.array([0.0, 0.5, -1.0, 2.0], np.float32), "s16le"), "<i2")
    assert pcm.tolist() == [0, 16384, -32768, 32767]
    floats = np.frombuffer(to_pcm(np.array([16384, -32768], np.int16), "f32le"), "<f4")
    assert floats.tolist() == [0.5, -1.0]


def test_token_goes_in_the_query() -> None:
    assert stream_url("ws://h:1/v1/stream", None) == "ws://h:1/v1/stream"
    assert stream_url("ws://h:1/v1/stream?a=1&token=old", "s e/cret") == "ws://h:1/v1/stream?a=1&token=s+e%2Fcret"


@pytest.mark.parametrize("typed, meant", [
    ("127.0.0.1:9000", "ws://127.0.0.1:9000/v1/stream"),
    ("localhost", "ws://localhost:8765/v1/stream"),  # a bare host: the server's default port
    ("[::1]:9000", "ws://[::1]:9000/v1/stream"),
    ("ws://h:1", "ws://h:1/v1/stream"),
    ("ws://h:1/?token=t", "ws://h:1/v1/stream?token=t"),
    ("http://h:1/", "ws://h:1/v1/stream"),  # the page's address, pasted
    ("https://asr.example.org", "wss://asr.example.org/v1/stream"),
    ("wss://h/prefix/v1/stream", "wss://h/prefix/v1/stream"),
    ("ws://h:1/wrong", "ws://h:1/wrong"),  # a path is kept: the server's 404 names the right one
])
def test_url_as_people_type_it(typed: str, meant: str) -> None:
    assert stream_endpoint(typed) == meant


async def test_bare_host_port_streams_and_a_wrong_path_is_refused(serve_test_server, speech):
    async with serve_test_server() as url:
        async with connect(f"127.0.0.1:{url.port}") as stream:
            await stream.send(speech.audio[:SAMPLE_RATE])
            await stream.stop()
        with pytest.raises(ConnectError, match="404.*/v1/stream"):
            await connect(f"ws://127.0.0.1:{url.port}/stream")


async def test_right_token_is_accepted(serve_test_server, speech, test_model_dir):
    async with serve_test_server(token="sesame") as url:
        async with connect(url, token="sesame", partials=False) as stream:
            assert stream.ready.session
            await stream.send(speech.audio)
            done = await stream.stop()
        refused = url.server.metrics.sessions_refused
    assert done.segments == len(speech.utterances)
    check_finals(stream.finals, speech, test_model_dir)
    assert sum(sample.value for metric in refused.collect() for sample in metric.samples
               if sample.name.endswith("_total")) == 0


async def test_wrong_token_is_refused_at_the_handshake(serve_test_server):
    async with serve_test_server(token="sesame") as url:
        with pytest.raises(ConnectError, match="401"):
            await connect(url, token="wrong")


async def test_missing_token_is_a_server_error(serve_test_server):
    async with serve_test_server(token="sesame") as url:
        with pytest.raises(ServerError) as caught:
            await connect(url)
    assert caught.value.code == "unauthorized" and caught.value.message


async def test_unsupported_start_is_a_server_error(serve_test_server):
    async with serve_test_server() as url:
        with pytest.raises(ServerError) as caught:
            async with connect(url, sample_rate=96000):
                pass
    assert caught.value.code == "unsupported_audio" and "sample_rate" in caught.value.message


async def test_full_server_raises_overloaded(serve_test_server, speech):
    async with serve_test_server(max_sessions=1) as url:
        async with connect(url) as first:
            with pytest.raises(ServerError) as caught:
                await connect(url)
            assert caught.value.code == "overloaded"
            await first.send(speech.audio[:SAMPLE_RATE])
            await first.stop()


async def test_unreachable_server_is_a_connect_error():
    with socket.socket() as sock:  # a port that was free a moment ago: nobody listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectError, match="cannot connect"):
        await connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=5)


async def test_abnormal_close_raises_with_code_and_reason(speech):
    """A peer that answers `ready` and then closes with 1013 (no `error` message): the close code and
    reason reach the caller from send/stop and the iteration."""

    async def handler(ws) -> None:
        await ws.recv()
        await ws.send('{"type": "ready", "session": "s", "model": "m", "provider": "p"}')
        await ws.send('{"type": "from_the_future", "x": 1}')  # unknown types are skipped
        await ws.close(CLOSE_TRY_AGAIN, "busy, come back later")

    async with websockets.serve(handler, "127.0.0.1", 0) as peer:
        port = peer.sockets[0].getsockname()[1]
        stream = await connect(f"ws://127.0.0.1:{port}/v1/stream")
        with pytest.raises(StreamClosedError) as caught:
            async for _ in stream:
                pass
        assert caught.value.code == CLOSE_TRY_AGAIN and caught.value.reason == "busy, come back later"
        with pytest.raises(StreamClosedError):
            await stream.send(speech.audio[:1600])
        with pytest.raises(ClientError):
            await stream.stop()


async def test_a_failing_callback_ends_the_stream_and_is_raised(serve_test_server, speech):
    def on_final(final: Final) -> None:
        raise RuntimeError("bug in the bot")

    async with serve_test_server() as url:
        async with connect(url, on_final=on_final) as stream:
            for chunk in chunks(speech.audio, SAMPLE_RATE):
                try:
                    await stream.send(chunk)
                except ClientError:
                    break
            with pytest.raises(ClientError, match="callback") as caught:
                await stream.stop()
    assert isinstance(caught.value.__cause__, RuntimeError)
