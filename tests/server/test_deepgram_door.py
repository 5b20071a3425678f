"""The Deepgram door: its pure parts (query, G.711, WAV header) and, against one real server per test, what
the clients in tests/frameworks/test_deepgram_clients.py do not send: other encodings, WAV, multichannel, Finalize,
the browsers' key, and bad input answered in Deepgram's own form without costing another stream anything."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import warnings
from typing import Any

import numpy as np
import pytest
import soundfile
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from pipeline.audio import SAMPLE_RATE
from server.deepgram_audio import ALAW, MULAW, read_wav_header
from server.deepgram_shapes import MIN_ENDPOINTING_MS, DeepgramError, parse_listen_query

from openai_testkit import HELD_OUT, TOKEN, knows_words, post, raw_exchange, words
from server_testkit import wav16

LANGUAGES = ("auto", "en")
# what livekit-plugins-deepgram 1.8.9 sends by default (stt.py _connect_ws)
LIVEKIT_QUERY = ("model=nova-3&punctuate=true&smart_format=false&no_delay=true&interim_results=true&encoding=linear16"
                 "&vad_events=true&sample_rate=16000&channels=1&endpointing=25&filler_words=true"
                 "&profanity_filter=false&numerals=false&mip_opt_out=false&language=en-US")


# ---- pure ------------------------------------------------------------------------------------------------


def test_query_defaults_and_mapping():
    options = parse_listen_query(LIVEKIT_QUERY, LANGUAGES)
    assert (options.model, options.language, options.encoding, options.sample_rate) == ("nova-3", "en", "linear16", 16000)
    assert options.interim_results and options.vad_events and options.endpointing_ms == MIN_ENDPOINTING_MS
    assert "smart_format" in options.ignored and "filler_words" in options.ignored
    options = parse_listen_query("keywords=seven:2&keywords=stop:-3&keyterm=play%20music&endpointing=false", LANGUAGES)
    assert [(h.text, h.boost) for h in options.hotwords] == [("seven", 3.0), ("play music", 1.5)]
    assert not options.speech_final and parse_listen_query("", LANGUAGES).language == "auto"


@pytest.mark.parametrize("query, says", [
    ("encoding=opus&sample_rate=16000", "encoding='opus' is not supported"),
    ("encoding=linear16", "needs sample_rate"),
    ("encoding=linear16&sample_rate=4000", "sample_rate='4000'"),
    ("interim_results=yes", "interim_results='yes': expected true or false"),
    ("language=fr", "language='fr' is not supported"),
    ("channels=0", "channels='0'"),
    ("sample_rate=" + "1" * 5000, "expected an integer from"),  # past int()'s 4300 digits: was a 500
    ("channels=\u0662", "expected an integer from 1 to 8"),  # an Arabic-Indic 2, which int() would take
])
def test_query_errors(query, says):
    with pytest.raises(DeepgramError, match=says) as caught:
        parse_listen_query(query, LANGUAGES)
    assert caught.value.status == 400


def test_g711_tables_match_audioop():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # gone in 3.13: the tables replace it
    everything = bytes(range(256))
    assert np.array_equal(np.frombuffer(audioop.ulaw2lin(everything, 2), "<i2"), MULAW)
    assert np.array_equal(np.frombuffer(audioop.alaw2lin(everything, 2), "<i2"), ALAW)


def wav_bytes(audio: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def test_wav_header_from_the_first_bytes():
    data = wav_bytes(np.zeros((80, 2), np.float32), 8000, "ULAW")
    assert read_wav_header(data[:30]) is None  # the data chunk has not begun: wait for more
    header = read_wav_header(data)
    assert (header.encoding, header.sample_rate, header.channels) == ("mulaw", 8000, 2)
    with pytest.raises(Exception, match="look Ogg"):
        read_wav_header(b"OggS" + bytes(40))


# ---- end to end ----------------------------------------------------------------------------------------


def recording() -> np.ndarray:
    audio, rate = soundfile.read(HELD_OUT, dtype="float32")
    assert rate == SAMPLE_RATE
    return np.concatenate([audio, np.zeros(SAMPLE_RATE, np.float32)])


def to_linear16(audio: np.ndarray) -> bytes:
    return np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2").tobytes()


def to_mulaw(audio: np.ndarray) -> bytes:
    """float32 -> mu-law bytes, by the nearest entry of the decode table."""
    order = np.argsort(MULAW)
    pcm = np.round(audio * 32767).astype(np.int32)
    index = np.clip(np.searchsorted(MULAW[order], pcm), 0, 255)
    below = np.clip(index - 1, 0, 255)
    nearer = np.where(np.abs(MULAW[order][below] - pcm) < np.abs(MULAW[order][index] - pcm), below, index)
    return order[nearer].astype(np.uint8).tobytes()


async def stream(port: int, query: str, data: bytes, chunk: int, headers: dict[str, str] | None = None,
                 subprotocols: list[str] | None = None, finalize_at: int | None = None) -> tuple[list[Any], int]:
    """Send `data` in `chunk`-byte messages, then CloseStream; every message received and the close code."""
    uri = f"ws://127.0.0.1:{port}/v1/listen?{query}"
    got: list[Any] = []
    async with websockets.connect(uri, additional_headers=headers or {"Authorization": f"Token {TOKEN}"},
                                  subprotocols=subprotocols) as ws:
        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):  # the server may close first (an error)
                async for message in ws:
                    got.append(json.loads(message))

        reader = asyncio.ensure_future(read())
        with contextlib.suppress(ConnectionClosed):
            for n, i in enumerate(range(0, len(data), chunk)):
                if n == finalize_at:
                    await ws.send(json.dumps({"type": "Finalize"}))
                await ws.send(data[i:i + chunk])
                await asyncio.sleep(0.001)
            await ws.send(json.dumps({"type": "CloseStream"}))
        await asyncio.wait_for(reader, 60)
    return got, ws.close_code


def finals(messages: list[Any], channel: int = 0) -> list[str]:
    return [m["channel"]["alternatives"][0]["transcript"] for m in messages
            if m["type"] == "Results" and m["is_final"] and m["channel_index"][0] == channel
            and m["channel"]["alternatives"][0]["transcript"]]


def check_heard(texts: list[str], model_dir: Any) -> None:
    assert len(texts) == 3, texts
    if knows_words(model_dir):
        speech = json.loads(HELD_OUT.with_suffix(".json").read_text())["speech"]
        assert words(" ".join(texts)) == words(" ".join(u["text"] for u in speech)), texts


async def test_encodings_wav_multichannel_and_browser_key(serve_test_server, test_model_dir):
    """mu-law; WAV without `encoding` (header read from the first message); two channels as two
    streams; the key as a browser's subprotocol; Finalize mid-utterance gives a from_finalize final."""
    audio = recording()
    async with serve_test_server(token=TOKEN) as url:
        # at 16 kHz: the demo model, trained on wideband espeak, loses words in 8 kHz telephone audio
        got, code = await stream(url.port, "encoding=mulaw&sample_rate=16000", to_mulaw(audio), 320)
        assert code == 1000 and got[-1]["type"] == "Metadata"
        check_heard(finals(got), test_model_dir)

        got, code = await stream(url.port, "", wav_bytes(audio, SAMPLE_RATE), 640, headers={},
                                 subprotocols=["token", TOKEN])
        assert code == 1000
        check_heard(finals(got), test_model_dir)

        quiet = np.zeros_like(audio)
        both = np.stack([audio, quiet], axis=1)
        got, code = await stream(url.port, "encoding=linear16&sample_rate=16000&channels=2&multichannel=true",
                                 to_linear16(both.reshape(-1)), 1280)
        check_heard(finals(got, 0), test_model_dir)
        assert finals(got, 1) == [] and got[-1]["channels"] == 2
        assert {tuple(m["channel_index"]) for m in got if m["type"] == "Results"} <= {(0, 2), (1, 2)}
        got, code = await stream(url.port, "multichannel=true", wav_bytes(both[:, ::-1], SAMPLE_RATE), 1280)
        assert code == 1000 and got[-1]["channels"] == 2  # a WAV's header gives its channels, not the query
        check_heard(finals(got, 1), test_model_dir)
        assert finals(got, 0) == []

        first_end = json.loads(HELD_OUT.with_suffix(".json").read_text())["speech"][0]["end"]
        cut = int((first_end - 0.2) * SAMPLE_RATE) * 2 // 640  # the 640-byte message inside the first utterance
        got, _ = await stream(url.port, "encoding=linear16&sample_rate=16000", to_linear16(audio), 640,
                              finalize_at=cut)
        flagged = [m for m in got if m["type"] == "Results" and m["from_finalize"]]
        assert len(flagged) == 1 and flagged[0]["is_final"] and not flagged[0]["speech_final"]


async def test_bad_input_answered_in_deepgram_form(serve_test_server, test_model_dir):
    """Each mistake is answered clearly (HTTP 400/401 with err_code and err_msg before the stream opens, an
    Error message and a close code after), while a good stream runs beside them untouched."""
    audio = recording()
    async with serve_test_server(token=TOKEN) as url:
        good = asyncio.ensure_future(stream(url.port, "encoding=linear16&sample_rate=16000", to_linear16(audio), 640))
        for query, headers, status, says in [
            ("encoding=opus&sample_rate=16000", None, 400, "encoding='opus' is not supported"),
            ("encoding=linear16&sample_rate=96000", None, 400, "sample_rate='96000'"),
            ("encoding=linear16&sample_rate=16000", {"Authorization": "Token wrong"}, 401, "Invalid credentials"),
        ]:
            with pytest.raises(InvalidStatus) as caught:
                await stream(url.port, query, b"", 1, headers=headers)
            body = json.loads(caught.value.response.body)
            assert caught.value.response.status_code == status and says in body["err_msg"], body
            assert set(body) == {"err_code", "err_msg", "request_id"}

        got, code = await stream(url.port, "", b"OggS" + bytes(4000), 1000)  # no encoding, not WAV
        assert code == 1003 and got[-1]["type"] == "Error" and "must be WAV" in got[-1]["description"]
        got, code = await stream(url.port, "encoding=linear16&sample_rate=16000", b"", 1)
        assert code == 1000 and [m["type"] for m in got] == ["Metadata"]

        status, body = await post(url.port, "/v1/listen", b'{"url": "http://169.254.169.254/"}',
                                  {"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"})
        assert status == 400 and "does not fetch audio from URLs" in body["err_msg"]
        status, body = await post(url.port, "/v1/listen", b"not audio", {"Authorization": f"Token {TOKEN}"})
        assert status == 400 and "failed to process audio" in body["err_msg"]
        status, body = await post(url.port, "/v1/listen", wav16(np.zeros(32000), rate=1),
                                  {"Authorization": f"Token {TOKEN}"})
        assert status == 400 and "sample rate is 1 Hz" in body["err_msg"], body
        nine = io.BytesIO()
        soundfile.write(nine, np.zeros((1600, 9), np.int16), SAMPLE_RATE, format="WAV")
        status, body = await post(url.port, "/v1/listen?multichannel=true", nine.getvalue(),
                                  {"Authorization": f"Token {TOKEN}"})
        assert status == 400 and "at most 8 channels; the file has 9" in body["err_msg"], body
        status, body = await post(url.port, "/v1/listen?model=x", b"", {"Authorization": "Bearer wrong"})
        assert status == 401 and body["err_code"] == "INVALID_AUTH"
        status, body = await post(url.port, "/v1/listen", b'{"url": ' + b"[" * 30000 + b"}",
                                  {"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"})
        assert status == 400 and "string \"url\"" in body["err_msg"]  # was a RecursionError: a 500
        # a body declared over the limit is refused before the client that waits for 100 Continue sends it
        head = (f"POST /v1/listen HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {TOKEN}\r\n"
                "Expect: 100-continue\r\nContent-Length: 30000000\r\n\r\n")
        status, answer = await raw_exchange(url.port, head)
        assert status == 413 and b"over the limit" in answer
        got, code = await good
    assert code == 1000
    check_heard(finals(got), test_model_dir)


async def test_messages_sent_faster_than_their_answers_are_read(serve_test_server, test_model_dir):
    """300 mistakes (one a type of 60,000 characters), 100 Finalize and 50 KeepAlive written at once, then the
    audio: every mistake answered with its SchemaError, then the transcript. The connection reads no further
    while half its outbox waits; a burst once overflowed it (an internal error, 1011, every answer lost)."""
    audio = recording()
    deep = "[" * 60000  # JSON nested past any protocol's depth: refused unparsed (was a RecursionError)
    async with serve_test_server(token=TOKEN) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/listen?encoding=linear16&sample_rate=16000"
        async with websockets.connect(uri, additional_headers={"Authorization": f"Token {TOKEN}"}) as ws:
            for _ in range(298):
                await ws.send("not json")
            await ws.send(deep)
            await ws.send(json.dumps({"type": "x" * 60000}))  # quoted back in 64 characters, not 60,000
            for kind in ["Finalize"] * 100 + ["KeepAlive"] * 50:
                await ws.send(json.dumps({"type": kind}))
            pcm = to_linear16(audio)
            for i in range(0, len(pcm), 640):
                await ws.send(pcm[i:i + 640])
            await ws.send(json.dumps({"type": "CloseStream"}))
            got = [json.loads(message) async for message in ws]
        assert ws.close_code == 1000 and got[-1]["type"] == "Metadata"
    errors = [m for m in got if m["type"] == "Error"]
    assert len(errors) == 300 and {m["variant"] for m in errors} == {"SchemaError"}
    assert max(len(m["description"]) + len(m["message"]) for m in errors) < 400
    check_heard(finals(got), test_model_dir)


async def test_keepalive_holds_a_silent_stream_open(serve_test_server, monkeypatch):
    """KeepAlive exists to hold a stream that sends no audio open, where the flood policy's allowance (in
    seconds of audio) does not grow: one a second is not counted, more are (a burst of 3 here; the 1000
    real clients get once ended a stream after 83 minutes of KeepAlive every 5 s)."""
    import server.streaming

    monkeypatch.setattr(server.streaming, "FLOOD_BURST", 3)
    async with serve_test_server(token=TOKEN) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/listen?encoding=linear16&sample_rate=16000"
        async with websockets.connect(uri, additional_headers={"Authorization": f"Token {TOKEN}"}) as ws:
            keepalive = json.dumps({"type": "KeepAlive"})
            for _ in range(5):  # more than the burst, a second apart
                await ws.send(keepalive)
                await asyncio.sleep(1.05)
            with pytest.raises(asyncio.TimeoutError):  # the stream is open: no Error, no close
                await asyncio.wait_for(ws.recv(), 0.3)
            with contextlib.suppress(ConnectionClosed):
                for _ in range(10):  # faster: counted past one a second, and the burst runs out
                    await ws.send(keepalive)
                    await asyncio.sleep(0.05)
            got = []
            with contextlib.suppress(ConnectionClosed):  # iterating raises at a close with an error code
                async for message in ws:
                    got.append(json.loads(message))
    assert ws.close_code == 1008 and got[-1]["type"] == "Error" and "messages" in got[-1]["description"]


async def test_url_fetched_only_with_fetch_urls(serve_test_server, test_model_dir):
    """--fetch-urls: a JSON body's url is fetched (here from a local HTTP server) and transcribed."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HELD_OUT.parent))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined] - nothing into pytest's output
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    try:
        async with serve_test_server(token=TOKEN, fetch_urls=True) as url:
            body = json.dumps({"url": f"http://127.0.0.1:{files.server_port}/{HELD_OUT.name}"}).encode()
            status, answer = await post(url.port, "/v1/listen?utterances=true", body,
                                        {"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"})
            assert status == 200, answer
            check_heard([u["transcript"] for u in answer["results"]["utterances"]], test_model_dir)
            status, answer = await post(url.port, "/v1/listen", b'{"url": "file:///etc/passwd"}',
                                        {"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"})
            assert status == 400 and "http:// or https://" in answer["err_msg"]
    finally:
        files.shutdown()
