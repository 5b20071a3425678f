"""The FunASR runtime protocol on --funasr-port, driven by a client written from FunASR's protocol description
(runtime/docs/websocket_protocol.md): plain `websockets` with subprotocols=["binary"], no Unipad code."""
from __future__ import annotations

import asyncio
import io
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr
import websockets

from pipeline.audio import SAMPLE_RATE
from pipeline.transcript import join_texts
from server.funasr_protocol import (
    FunasrConfig,
    ResultWriter,
    SegmentResult,
    Word,
    final_message,
    parse_control,
    tagged_text,
    timestamp_string,
)
from server_testkit import wav16

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "models" / "demo"
DEMO_RECORDING = ROOT / "tests" / "fixtures" / "demo" / "multi"  # .wav, .json: words the demo model knows
TOLERANCE_MS = 300  # how far a segment's start/end may be from where the speech really is
CHUNK_MS = 60  # chunk_size [5, 10, 5] with chunk_interval 10: FunASR's clients send 60 ms per message
TAGS = re.compile(r"^(?:<\|[^|<>]+\|>)*<\|(withitn|woitn)\|>")


def knows_words(model_dir: Path) -> bool:
    """The trained demo model is served: check texts word for word; else (tiny random graph) structure only."""
    return Path(model_dir).resolve() == DEMO_MODEL.resolve() and (DEMO_MODEL / "manifest.json").is_file()


@pytest.fixture
def recording(speech, test_model_dir) -> Any:
    """Three utterances with their texts and times (`.audio` float32 at SAMPLE_RATE, `.utterances`): the
    demo model's held-out fixture when it is served (texts are checked), else tests/fixtures/three_utterances."""
    if not knows_words(test_model_dir):
        return speech
    audio, rate = soundfile.read(DEMO_RECORDING.with_suffix(".wav"), dtype="float32")
    assert rate == SAMPLE_RATE
    sidecar = json.loads(DEMO_RECORDING.with_suffix(".json").read_text(encoding="utf-8"))
    return SimpleNamespace(audio=audio, utterances=sidecar["speech"])


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w']+", " ", TAGS.sub("", text).lower()).split())


def words_of(text: str) -> list[str]:
    """The words as a reader sees them: segments glued without a space ("eighteight") stay one word."""
    untagged = re.sub(r"<\|[^|<>]*\|>", "", text)  # SenseVoice's tags, wherever a text's message began
    return re.sub(r"[^\w' ]+", "", untagged.lower()).split()


def funasr_client_prints(messages: list[dict]) -> str:
    """What FunASR's funasr_wss_client.py shows for these messages: online texts appended; a 2pass-online
    text appended to the segment's online text, which the segment's 2pass-offline text then replaces."""
    offline, online, shown = "", "", ""
    for message in messages:
        if message["mode"] == "2pass-online":
            online += message["text"]
            shown = offline + online
        elif message["mode"] == "2pass-offline":
            online = ""
            offline += message["text"]
            shown = offline
        else:
            shown += message["text"]
    return shown


def pcm16(audio: np.ndarray) -> bytes:
    return np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2").tobytes()


def funasr_url(url: Any, query: str = "") -> str:
    return f"ws://127.0.0.1:{url.server.funasr_port}/{query}"


def check_result(message: dict, wav_name: str, mode: str) -> None:
    """The fields every FunASR client reads, with FunASR's types."""
    assert message["mode"] == mode and message["wav_name"] == wav_name, message
    assert isinstance(message["text"], str) and isinstance(message["is_final"], bool)
    stamps = json.loads(message["timestamp"])  # a string holding [[start_ms, end_ms], ...]
    assert all(isinstance(a, int) and isinstance(b, int) and 0 <= a <= b for a, b in stamps), stamps
    assert isinstance(message["stamp_sents"], list)
    for sentence in message["stamp_sents"]:
        assert {"text_seg", "punc", "start", "end", "ts_list"} <= set(sentence)


def split_results(messages: list[dict], mode: str, wav_name: str) -> list[dict]:
    """The segments' results of an input; only its last message has is_final: true, and when every result
    went out before the client's end, that last message is an empty one (as FunASR's servers send)."""
    assert [m["is_final"] for m in messages] == [False] * (len(messages) - 1) + [True], messages
    finals = [m for m in messages if m["mode"] == mode and "start_time" in m]
    if messages[-1] is not finals[-1]:
        assert messages[-1] == {"mode": mode, "wav_name": wav_name, "text": "", "is_final": True}
    for final in finals:
        check_result(final, wav_name, mode)
    return finals


def check_segment_times(starts_ends: list[tuple[int, int]], utterances: list[dict]) -> None:
    assert len(starts_ends) == len(utterances)
    for (start, end), u in zip(starts_ends, utterances):
        assert abs(start - u["start"] * 1000) <= TOLERANCE_MS and abs(end - u["end"] * 1000) <= TOLERANCE_MS


async def read_to_close(ws: Any) -> list[dict]:
    """Every message until the server closes (with any close code)."""
    messages = []
    try:
        async for message in ws:
            messages.append(json.loads(message))
    except websockets.ConnectionClosed:
        pass
    return messages


async def read_until_final(ws: Any, messages: list[dict], timeout: float = 60) -> None:
    """Collect messages until the one with is_final: true (the last of an input)."""
    async def read() -> None:
        while not (messages and messages[-1].get("is_final")):
            messages.append(json.loads(await ws.recv()))
    await asyncio.wait_for(read(), timeout)


async def stream_at_real_time(url: Any, first: dict, data: bytes) -> list[dict]:
    """Send `first`, then `data` in 60 ms chunks at real-time pace and the end; every message until is_final."""
    step = SAMPLE_RATE * CHUNK_MS // 1000 * 2
    messages: list[dict] = []
    async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
        assert ws.subprotocol == "binary"
        await ws.send(json.dumps(first))
        reader = asyncio.ensure_future(read_until_final(ws, messages))
        began = time.monotonic()
        for n, i in enumerate(range(0, len(data), step)):
            await asyncio.sleep(max(0.0, began + n * CHUNK_MS / 1000 - time.monotonic()))
            await ws.send(data[i:i + step])
        await ws.send(json.dumps({"is_speaking": False}))
        await reader
    return messages


async def test_2pass_and_online_real_time_streams(serve_test_server, recording, test_model_dir):
    """Microphone-like clients (60 ms chunks at real-time pace, partials on) in 2pass and online mode at once:
    2pass sends partials, then each segment's final in place of them; online texts are appended. What
    FunASR's client prints reads as separate words in both modes (nothing lost, nothing glued)."""
    first = {"mode": "2pass", "wav_name": "three", "wav_format": "pcm", "audio_fs": SAMPLE_RATE,
             "is_speaking": True, "chunk_size": [5, 10, 5], "chunk_interval": 10,
             "hotwords": json.dumps({"window": 20}), "itn": True, "encoder_chunk_look_back": 4}
    data = pcm16(recording.audio)
    async with serve_test_server(funasr_port=0, partial_interval=0.3) as url:
        messages, online = await asyncio.gather(stream_at_real_time(url, first, data),
                                                stream_at_real_time(url, {**first, "mode": "online"}, data))
    finals = split_results(messages, "2pass-offline", "three")
    check_segment_times([(f["start_time"], f["end_time"]) for f in finals], recording.utterances)
    modes = [m["mode"] for m in messages]
    assert set(modes) == {"2pass-online", "2pass-offline"}
    finals_at = [j for j, m in enumerate(messages) if m["mode"] == "2pass-offline" and "start_time" in m]
    assert "2pass-online" in modes[:finals_at[-1]]  # live text (per segment once two partials agree)
    shown_2pass = funasr_client_prints(messages)
    assert all(m["text"] and m["wav_name"] == "three" for m in messages if m["mode"] == "2pass-online")
    assert {m["mode"] for m in online} == {"online"} and online[-1]["is_final"] is True
    assert [m["is_final"] for m in online[:-1]] == [False] * (len(online) - 1)
    shown = "".join(m["text"] for m in online)  # what FunASR's client prints
    if knows_words(test_model_dir):
        assert [normalise(f["text"]) for f in finals] == [normalise(u["text"]) for u in recording.utterances]
        spoken = words_of(" ".join(u["text"] for u in recording.utterances))
        assert words_of(shown) == spoken and words_of(shown_2pass) == spoken  # no words glued at segment ends
    else:
        assert shown.strip() and shown_2pass.strip()


async def test_offline_files_on_one_connection(serve_test_server, recording, test_model_dir):
    """The offline file service: a WAV file, then a FLAC file on the same connection; one result each."""
    results = []
    async with serve_test_server(funasr_port=0) as url:
        async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
            for name, fmt in (("three.wav", "WAV"), ("three.flac", "FLAC")):
                file = io.BytesIO()
                soundfile.write(file, recording.audio, SAMPLE_RATE, format=fmt, subtype="PCM_16")
                body = file.getvalue()
                await ws.send(json.dumps({"mode": "offline", "wav_name": name, "wav_format": name.split(".")[1],
                                          "is_speaking": True, "itn": False}))
                for i in range(0, len(body), 64 * 1024):
                    await ws.send(body[i:i + 64 * 1024])
                await ws.send(json.dumps({"is_speaking": False}))
                messages: list[dict] = []
                await read_until_final(ws, messages)
                assert len(messages) == 1, messages
                results.append(messages[0])
    for result, name in zip(results, ("three.wav", "three.flac")):
        check_result(result, name, "offline")
        assert result["is_final"] is True
        check_segment_times([(s["start"], s["end"]) for s in result["stamp_sents"]], recording.utterances)
        assert (result["start_time"], result["end_time"]) == (result["stamp_sents"][0]["start"],
                                                              result["stamp_sents"][-1]["end"])
        if knows_words(test_model_dir):
            assert normalise(result["text"]) == " ".join(normalise(u["text"]) for u in recording.utterances)
    assert results[0]["text"] == results[1]["text"]


async def test_client_without_mode_gets_one_tagged_result(serve_test_server, recording, test_model_dir):
    """FunASR's C++ file client: no mode, no subprotocol, PCM in 200 KB blocks, svs_itn: one result per file,
    with SenseVoice's tags on each segment's text."""
    data = pcm16(recording.audio)
    async with serve_test_server(funasr_port=0) as url:
        async with websockets.connect(funasr_url(url)) as ws:
            assert ws.subprotocol is None
            await ws.send(json.dumps({"chunk_size": [5, 10, 5], "chunk_interval": 10, "wav_name": "demo",
                                      "wav_format": "pcm", "audio_fs": SAMPLE_RATE, "itn": True, "svs_itn": True,
                                      "is_speaking": True}))
            for i in range(0, len(data), 204800):
                await ws.send(data[i:i + 204800])
            await ws.send(json.dumps({"is_speaking": False}))
            messages: list[dict] = []
            await read_until_final(ws, messages)
    assert len(messages) == 1
    check_result(messages[0], "demo", "offline")
    sentences = messages[0]["stamp_sents"]
    check_segment_times([(s["start"], s["end"]) for s in sentences], recording.utterances)
    assert messages[0]["text"].count("<|withitn|>") == len(recording.utterances)
    assert TAGS.match(messages[0]["text"])
    if knows_words(test_model_dir):
        assert messages[0]["text"].startswith("<|en|>")


async def test_offline_segments_48k_with_end_ack(serve_test_server, recording, test_model_dir):
    """offline mode streaming PCM at 48 kHz: one result per segment, then the is_end acknowledgement."""
    audio48 = soxr.resample(recording.audio, SAMPLE_RATE, 48000).astype(np.float32)
    data = pcm16(audio48)
    async with serve_test_server(funasr_port=0) as url:
        async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
            await ws.send(json.dumps({"mode": "offline", "wav_name": "mic", "audio_fs": 48000,
                                      "svs_lang": "auto", "svs_itn": False, "is_speaking": True}))
            for i in range(0, len(data), 9601):  # odd sizes: FunASR clients treat PCM as a byte stream
                await ws.send(data[i:i + 9601])
            await ws.send(json.dumps({"is_speaking": False, "is_end": True}))
            messages: list[dict] = []
            await read_until_final(ws, messages)
            ack = json.loads(await ws.recv())
    assert ack == {"mode": "offline", "wav_name": "mic", "text": "", "is_final": True, "is_end": True}
    finals = split_results(messages, "offline", "mic")
    assert all(TAGS.match(m["text"]).group(1) == "woitn" for m in finals)
    check_segment_times([(m["start_time"], m["end_time"]) for m in finals], recording.utterances)
    if knows_words(test_model_dir):
        assert [normalise(m["text"]) for m in finals] == [normalise(u["text"]) for u in recording.utterances]
        assert words_of(funasr_client_prints(finals)) == words_of(" ".join(u["text"] for u in recording.utterances))
    assert all(m["text"].startswith(" ", len(TAGS.match(m["text"]).group(0))) for m in finals[1:] if m["text"])


BAD_STARTS = {
    # name: (frames, error code, close code)
    "malformed_json": (['{"mode": "2pass", '], "invalid_json", 1007),
    "not_an_object": (['["2pass"]'], "invalid_json", 1007),
    "deeply_nested": (["[" * 50_000], "invalid_json", 1007),  # a RecursionError, not a 1011 close
    "unknown_mode": (['{"mode": "3pass"}'], "bad_start", 1008),
    "audio_first": ([b"\x00\x00" * 960], "bad_order", 1008),
    "bad_audio_fs": (['{"mode": "2pass", "audio_fs": 44}'], "unsupported_audio", 1003),
    "bad_chunk_size": (['{"mode": "online", "chunk_size": "5,x,5"}'], "bad_start", 1008),
    "bad_is_speaking": (['{"mode": "2pass", "is_speaking": "yes"}'], "bad_start", 1008),
    "unknown_language": (['{"mode": "2pass", "svs_lang": "xx"}'], "bad_start", 1008),
    "file_in_2pass": (['{"mode": "2pass", "wav_format": "mp3"}'], "unsupported_audio", 1003),
    # 64 KB whose header says 1 Hz: decoded whole, 9 hours at 16 kHz (2 GB); refused before decoding
    "file_at_1_hz": (['{"mode": "offline", "wav_format": "wav"}', wav16(np.zeros(32000), rate=1),
                      '{"is_speaking": false}'], "unsupported_audio", 1003),
    "undecodable_file": (['{"mode": "offline", "wav_format": "mp4"}', b"not an mp4 file" * 64,
                          '{"is_speaking": false}'], "unsupported_audio", 1003),
}


async def test_malformed_first_messages_get_an_error_and_a_close(serve_test_server):
    async with serve_test_server(funasr_port=0) as url:
        for name, (frames, code, close) in BAD_STARTS.items():
            async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
                for frame in frames:
                    await ws.send(frame)
                messages = await read_to_close(ws)
            assert len(messages) == 1, (name, messages)
            error = messages[0]
            assert error["code"] == code and error["is_final"] is False and error["is_end"] is True, (name, error)
            assert error["text"] == f"ERROR. {error['error']}" and error["wav_name"], (name, error)
            assert ws.close_code == close, (name, ws.close_code)
        assert error["text"].startswith("ERROR. Cannot decode the mp4 file")
        assert error["text"].endswith("bytes): Format not recognised."), error  # libsndfile's reason, no object repr
        async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
            await ws.send('{"mode": "2pass", "wav_format": "mp3"}')
            reply = json.loads(await ws.recv())
        assert reply["text"] == "ERROR. Real-time transcription service ONLY SUPPORT PCM stream."


async def test_token_and_admission_control(serve_test_server):
    """FunASR streams share --max-sessions with the Unipad endpoint and need the --token when it is set."""
    async with serve_test_server(funasr_port=0, max_sessions=1, token="s3cret") as url:
        async with websockets.connect(funasr_url(url)) as ws:
            await ws.send('{"mode": "2pass"}')
            refused = await read_to_close(ws)
        assert refused[0]["code"] == "unauthorized" and ws.close_code == 1008
        async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as first:
            await first.send('{"mode": "2pass", "wav_name": "a", "token": "s3cret"}')
            async with websockets.connect(funasr_url(url, "?token=s3cret")) as second:
                full = await read_to_close(second)
            assert full[0]["code"] == "overloaded" and second.close_code == 1013
            await first.send('{"is_speaking": false}')
            assert json.loads(await first.recv()) == {"mode": "2pass-offline", "wav_name": "a", "text": "",
                                                     "is_final": True}


async def test_shutdown_mid_stream_sends_the_last_result(serve_test_server, recording):
    """On SIGTERM an open FunASR stream gets the final of the audio it sent (is_final: true), then 1001."""
    cut = int((recording.utterances[1]["start"] + recording.utterances[1]["end"]) / 2 * SAMPLE_RATE)
    data = pcm16(recording.audio[:cut])
    async with serve_test_server(funasr_port=0) as url:
        async with websockets.connect(funasr_url(url), subprotocols=["binary"]) as ws:
            await ws.send(json.dumps({"mode": "2pass", "wav_name": "cut", "is_speaking": True}))
            for i in range(0, len(data), 1920):
                await ws.send(data[i:i + 1920])
            messages: list[dict] = []
            while not any(m["mode"] == "2pass-offline" for m in messages):  # the first segment is through
                messages.append(json.loads(await ws.recv()))
            url.server.request_shutdown()
            messages += await read_to_close(ws)
    finals = split_results(messages, "2pass-offline", "cut")
    assert len(finals) == 2 and finals[-1] is messages[-1]  # the cut segment was still open: it ends the input
    assert abs(finals[1]["start_time"] - recording.utterances[1]["start"] * 1000) <= TOLERANCE_MS
    assert ws.close_code == 1001


# ---- the message layer alone -----------------------------------------------------------------------------

def test_parse_control_keeps_state_and_tolerates_unknown_keys():
    control = parse_control('{"mode": "online", "chunk_size": "8, 8, 4", "audio_fs": 8000, "extra": 1, '
                            '"is_speaking": true}', FunasrConfig())
    config = control.config
    assert (config.mode, config.chunk_size, config.audio_fs, config.unknown) == ("online", (8, 8, 4), 8000, ("extra",))
    assert not control.end and not config.tags and config.use_itn and config.partial_mode == "online"
    end = parse_control('{"is_finished": true, "wav_name": "b"}', config)
    assert end.end and not end.ack and end.config.mode == "online" and end.config.wav_name == "b"
    assert parse_control('{"is_speaking": false, "is_end": true}', config).ack
    tagged = parse_control('{"svs_itn": false}', FunasrConfig()).config
    assert tagged.tags and not tagged.use_itn and tagged.whole_input and tagged.final_mode == "offline"


def test_results_in_funasr_shapes():
    config = FunasrConfig(mode="2pass", wav_name="w", tags=True)
    result = SegmentResult(0, "Hello world.", 0.6, 1.5, (Word("Hello", 0.6, 0.9), Word("world.", 0.96, 1.5)),
                           "en", "NEUTRAL", "Speech")
    assert tagged_text(result, config) == "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hello world."
    assert timestamp_string(result.words) == "[[600,900],[960,1500]]"
    message = final_message(config, [result], is_final=True)
    assert message["mode"] == "2pass-offline" and (message["start_time"], message["end_time"]) == (600, 1500)
    assert message["stamp_sents"] == [{"text_seg": "Hello world", "punc": ".", "start": 600, "end": 1500,
                                       "ts_list": [[600, 900], [960, 1500]]}]
    assert join_texts(["你好。", "再见。", "Hi.", "", "There."]) == "你好。再见。Hi. There."
    # FunASR's punctuated text opens with a blank before a Latin word: no second one
    assert join_texts(["你好。", " Now, now.", "Ok.", " Hi."]) == "你好。 Now, now. Ok. Hi."


def test_online_texts_are_deltas():
    """FunASR's clients append online texts: partials send what two agree on (never the last word), and a
    segment's final sends the rest of its text after what was sent, keeping what was sent."""
    online = ResultWriter(FunasrConfig(mode="online", wav_name="m"))
    texts = [online.partial(0, "please"), online.partial(0, "please open"), online.partial(0, "please open the"),
             online.partial(0, "please"), online.final(SegmentResult(0, "please open the window", 0.5, 2.0), False),
             online.partial(1, "seven"), online.final(SegmentResult(1, "seven", 3.0, 4.0), True)]
    assert [t and t["text"] for t in texts] == [None, "please", " open", None, " the window", None,
                                                " seven"]
    assert [t and t["mode"] for t in texts if t] == ["online"] * 4 and texts[-1]["is_final"] is True
    assert online.final(SegmentResult(2, "", 5.0, 6.0), False) is None  # nothing new, not the last
    # The final revises a sent word ("close" -> "closed"): what was sent stays, the rest follows it.
    revised = [online.partial(3, "close the"), online.partial(3, "close the door"),
               online.final(SegmentResult(3, "closed the door now", 6.0, 7.0), False)]
    assert [t and t["text"] for t in revised] == [None, " close the", " door now"]
    two_pass = ResultWriter(FunasrConfig(mode="2pass", wav_name="m"))
    assert two_pass.partial(0, "hi") is None and two_pass.partial(0, "hi there")["mode"] == "2pass-online"
    assert two_pass.partial(1, "there") is None and two_pass.partial(1, "there now")["text"] == "there"
    first = two_pass.final(SegmentResult(0, "hi there", 0.0, 1.0), False)
    final = two_pass.final(SegmentResult(1, "their now", 1.0, 2.0), True)  # the second pass corrects "there"
    assert final["mode"] == "2pass-offline" and final["text"] == " their now" and final["is_final"] is True
    assert funasr_client_prints([first, final]) == "hi there their now"
    assert two_pass.partial(2, "再见") is None and two_pass.partial(2, "再见 吧")["text"] == "再见"  # no space: CJK
    tagged = ResultWriter(FunasrConfig(mode="offline", wav_name="m", tags=True))
    texts = [tagged.final(SegmentResult(n, t, n, n + 1.0, language="en"), False)["text"] for n, t in enumerate(
        ["one", "", "two", "你好"])]
    assert texts == ["<|en|><|withitn|>one", "<|en|><|withitn|>", "<|en|><|withitn|> two", "<|en|><|withitn|>你好"]
