"""Hotwords through the server: per stream (`start`'s field), server-wide (--hotwords FILE), on the FunASR
port (its word-weight JSON), and every bad value refused with bad_start. The audio is the demo model's
save/send blend (tests/fixtures/make_hotword_fixture.py), where greedy decoding may hear either word."""
from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile
import websockets

from pipeline.audio import SAMPLE_RATE, load_audio
from server.cli import main as cli_main
from server.protocol import CLOSE_POLICY
from server_testkit import pcm16, run_stream, send_and_collect
from fixtures.make_hotword_fixture import BLEND_BOOST
from pipeline.hotwords import FUNASR_DEFAULT_WEIGHT, FUNASR_WEIGHT_PER_BOOST

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "models" / "demo"
BLEND_WEIGHT = BLEND_BOOST * FUNASR_WEIGHT_PER_BOOST  # FunASR's weight for the blend's boost
pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "manifest.json").is_file(), reason="needs the demo model")


@pytest.fixture(scope="module")
def blend() -> np.ndarray:
    silence = np.zeros(SAMPLE_RATE, np.float32)
    return np.concatenate([silence, load_audio(ROOT / "tests/fixtures/demo/save_send_blend.wav"), silence])


async def final_texts(url, audio, **start) -> list[str]:
    result = await run_stream(url, audio, start=start)
    assert not result.of("error"), result.messages
    return [m["text"] for m in result.of("final")]


async def test_stream_and_server_hotwords(serve_test_server, blend, tmp_path):
    hotwords = tmp_path / "hotwords.txt"
    hotwords.write_text("# the server's list\nturn on the music\t2\n", encoding="utf-8")
    async with serve_test_server(DEMO_MODEL, hotwords=hotwords, partial_interval=0.0) as url:
        [greedy] = await final_texts(url, blend)
        assert greedy in ("save message", "send message")
        for word in ("save", "send"):
            result = await run_stream(url, blend, start={"hotwords": [{"text": word, "boost": BLEND_BOOST}]})
            final = result.of("final")[0]
            assert final["text"] == f"{word} message" and final["language"] == "en"
            assert [t["text"] for t in final["tokens"]] == [f" {word}", " message"]
        other = "send" if greedy.startswith("save") else "save"
        assert await final_texts(url, blend, hotwords=[{"text": other, "boost": 0.1}]) == [greedy]  # too weak
    hotwords.write_text(f"{other}\t{BLEND_BOOST}\n", encoding="utf-8")
    async with serve_test_server(DEMO_MODEL, hotwords=hotwords, partial_interval=0.0) as url:
        assert await final_texts(url, blend) == [f"{other} message"]  # the server's list alone
        # a stream's own boost for a word of the server's list replaces the server's
        assert await final_texts(url, blend, hotwords=[{"text": other, "boost": 0.1}]) == [greedy]
        # the server's list applies to the OpenAI endpoints too, whose requests bring no hotwords
        assert await openai_texts(url, blend) == [f"{other} message"] * 2


async def openai_texts(url, audio: np.ndarray) -> list[str]:
    """The transcript of `audio` by an OpenAI file upload (the SDK) and by a Realtime session (server VAD)."""
    wav = io.BytesIO()
    soundfile.write(wav, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    client = openai.AsyncOpenAI(base_url=f"{url.http}/v1", api_key="unused", max_retries=0)
    upload = await client.audio.transcriptions.create(model="any", file=("blend.wav", wav.getvalue()))
    uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
    async with websockets.connect(uri, subprotocols=["realtime"]) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SAMPLE_RATE}}}}}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(audio)).decode()}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != \
                "conversation.item.input_audio_transcription.completed":
            assert event["type"] != "error", event
    return [upload.text, event["transcript"]]


BAD_HOTWORDS = {
    "not_a_list": "save",
    "not_a_string": [7],
    "empty": [""],
    "too_long": ["save " * 20],
    "unknown_field": [{"text": "save", "weight": 2}],
    "no_text": [{"boost": 2}],
    "bad_boost": [{"text": "save", "boost": -1}],
    "huge_boost": [{"text": "save", "boost": 1e9}],
    "boost_past_float": [{"text": "save", "boost": 10 ** 400}],  # an integer no float holds: was OverflowError
    "unspellable": ["zebra"],
    "too_many": ["save"] * 1000,
}


async def test_bad_hotwords_get_bad_start(serve_test_server):
    async with serve_test_server(DEMO_MODEL) as url:
        for name, value in BAD_HOTWORDS.items():
            result = await send_and_collect(url, [json.dumps({"type": "start", "hotwords": value})])
            assert [m["code"] for m in result.of("error")] == ["bad_start"], name
            assert "hotword" in result.of("error")[0]["message"], name
            assert result.close_code == CLOSE_POLICY, name


async def test_funasr_hotwords(serve_test_server, blend):
    async def transcribe(ws, hotwords) -> str:
        await ws.send(json.dumps({"mode": "offline", "wav_name": "blend", "wav_format": "pcm", "audio_fs": SAMPLE_RATE,
                                  "is_speaking": True, "hotwords": hotwords}))
        await ws.send(pcm16(blend))
        await ws.send(json.dumps({"is_speaking": False}))
        # Each segment's result, then is_final on the last message of the input: that is the segment's own
        # when it is still decoding at is_speaking false, else an empty end message (a fast worker had
        # already sent the segment's result: the VAD ended it in the trailing silence).
        texts = []
        while True:
            message = json.loads(await ws.recv())
            texts.append(message.get("text", ""))
            if message.get("is_final"):
                return " ".join(text for text in texts if text)

    async with serve_test_server(DEMO_MODEL, funasr_port=0) as url:
        port = f"ws://127.0.0.1:{url.server.funasr_port}/"
        async with websockets.connect(port, subprotocols=["binary"]) as ws:
            # FunASR's format; a word the model cannot spell is skipped, as FunASR does
            assert await transcribe(ws, json.dumps({"save": BLEND_WEIGHT, "阿里巴巴": 30})) == "save message"
            assert await transcribe(ws, json.dumps({"send": BLEND_WEIGHT})) == "send message"
            # FunASR's hotword files as its Python client sends them: lines "phrase weight"
            assert await transcribe(ws, f"阿里巴巴 20\nsave {BLEND_WEIGHT:g}") == "save message"
            assert await transcribe(ws, f"阿里巴巴 20\nsend {BLEND_WEIGHT:g}") == "send message"
            # its `--hotword "w1 w2"` and newer comma lists: the words as typed, each at FunASR's default
            # weight, which need not be boost enough for the blend at this start (the fixture's docstring):
            # they answer as the same words at that weight in JSON
            for word in ("save", "send"):
                weighted = await transcribe(ws, json.dumps({word: FUNASR_DEFAULT_WEIGHT}))
                assert await transcribe(ws, f"阿里巴巴 {word}") == weighted
                assert await transcribe(ws, f"zebra,{word}") == weighted
        async with websockets.connect(port, subprotocols=["binary"]) as ws:
            await ws.send(json.dumps({"mode": "offline", "hotwords": json.dumps({"save": "high"})}))
            error = json.loads(await ws.recv())
            assert error["code"] == "bad_start" and "weight" in error["error"]
        async with websockets.connect(port, subprotocols=["binary"]) as ws:  # was an internal error, 1011
            await ws.send(json.dumps({"mode": "offline", "hotwords": {"save": 10 ** 400}}))
            error = json.loads(await ws.recv())
            assert error["code"] == "bad_start" and "weight" in error["error"]


def test_cli_refuses_a_bad_hotwords_file(tmp_path, capsys):
    path = tmp_path / "hotwords.txt"
    path.write_text("save\nzebra\n", encoding="utf-8")
    assert cli_main(["--model", str(DEMO_MODEL), "--hotwords", str(path)]) == 2
    assert "hotwords.txt:2" in capsys.readouterr().err
    path.write_text("save\nvolume up:3\n", encoding="utf-8")  # the clients' syntax, not the file's
    assert cli_main(["--model", str(DEMO_MODEL), "--hotwords", str(path)]) == 2
    assert "hotwords.txt:2" in (err := capsys.readouterr().err) and "a boost follows a TAB" in err
    assert cli_main(["--model", str(DEMO_MODEL), "--hotwords", str(tmp_path / "missing.txt")]) == 2
    path.write_text("save\t-2\n", encoding="utf-8")
    assert cli_main(["--model", str(DEMO_MODEL), "--hotwords", str(path)]) == 2
    assert "hotwords.txt:1: hotword boost must be a number in (0, 10], got -2.0 for 'save'" in capsys.readouterr().err
    path.write_text("save\tloud\n", encoding="utf-8")
    assert cli_main(["--model", str(DEMO_MODEL), "--hotwords", str(path)]) == 2
    assert "hotwords.txt:1: hotword boost must be a number in (0, 10], got 'loud' for 'save'" in capsys.readouterr().err


def test_cli_refuses_hotwords_for_a_paraformer(paraformer_model_dir, tmp_path, capsys):
    """A Paraformer has no CTC output to bias: --hotwords stops it at startup, not every stream later."""
    path = tmp_path / "hotwords.txt"
    path.write_text("的\n", encoding="utf-8")  # a word its vocabulary can spell
    assert cli_main(["--model", str(paraformer_model_dir), "--hotwords", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (f"unipad: error: --hotwords {path}: hotwords need a CTC model "
                                               "(SenseVoice) or Qwen3-ASR; this model is a Paraformer; serve it "
                                               "without --hotwords")
