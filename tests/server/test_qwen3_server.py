"""Qwen3-ASR served end to end: the real server, a real WebSocket, the Python client and the `openai` SDK.

The model is the tiny Qwen3-ASR geometry with seeded random weights (conftest's `qwen3_model_dir`, an 8 s
container): its words are noise, but the engine runs the real encoder, prefill and step graphs at their
fixed shapes, the VAD cuts the segments, and partials re-decode the open segment.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from openai_testkit import TOKEN, own_protocol_text, sdk

from clients.client import connect
from pipeline.audio import SAMPLE_RATE
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import InferenceError, ProtocolError
from pipeline.hotwords import parse_hotwords
from pipeline.modeldir import read_model_directory
from pipeline.families.qwen3_asr.decoding import serving_overrides
from pipeline.families.qwen3_asr.text import fix_repetitions, parse_output, token_text
from server.protocol import Done, Final
from server_testkit import http_get, wav16


@pytest.fixture(scope="module")
def engine(qwen3_model_dir):
    return Engine(qwen3_model_dir, EngineOptions(device="cpu")).load()


def test_engine_serves_three_warmed_graphs_at_fixed_shapes(engine, qwen3_model_dir, speech):
    """On the CPU the containers are every whole number of attention windows up to the export's (2 s
    windows in the tiny geometry); a clip runs in the smallest that holds it and gives exactly the text it
    gives in the export's container alone, the GPUs' one fixed shape."""
    assert engine.ready and engine.precision == "int8" and engine.containers == (2.0, 4.0, 6.0, 8.0)
    whole = Engine(qwen3_model_dir, EngineOptions(device="cpu", containers=(8.0,))).load()
    assert whole.containers == (8.0,)
    directory = read_model_directory(qwen3_model_dir)
    for graph, overrides in serving_overrides(directory.manifest.dimensions).items():  # a GPU's: all fixed
        options = ort.SessionOptions()
        for name, size in overrides.items():
            options.add_free_dimension_override_by_name(name, size)
        path = str(qwen3_model_dir / directory.manifest.graphs["int8"][graph])
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        assert all(isinstance(d, int) for i in session.get_inputs() for d in i.shape), graph
    calls = engine.stats.calls
    for seconds in (1.5, 2.5, 5.0, 7.9):  # one clip in each container
        clip = speech.audio[: int(seconds * SAMPLE_RATE)]
        alone = engine.transcribe(clip)
        assert alone.text and alone == whole.transcribe(clip) == engine.transcribe(clip)
        assert engine.stats.last_container == engine.policy.container_for(len(clip))
    assert engine.stats.calls > calls and engine.stats.unwarmed_calls == 0
    with pytest.raises(InferenceError, match="longer than the largest container"):
        engine.transcribe(np.zeros(9 * SAMPLE_RATE, np.float32))
    with pytest.raises(InferenceError, match="no per-frame outputs"):
        engine.run(speech.audio[: 2 * SAMPLE_RATE])
    with pytest.raises(ProtocolError, match="hotwords need the model's tokenizer: .* has no merges.txt"):
        engine.hotword_graph(parse_hotwords(["window"]))  # random weights, synthetic tokens: no merges


async def test_stream_through_the_python_client(serve_test_server, qwen3_model_dir, speech):
    async with serve_test_server(qwen3_model_dir, partial_interval=0.3) as url:
        assert url.server.segmenter_options.max_segment_seconds == 8.0  # the one container
        async with connect(url, sample_rate=SAMPLE_RATE) as stream:
            pcm = (speech.audio * 32767).astype(np.int16)
            for i in range(0, len(pcm), SAMPLE_RATE // 10):
                await stream.send(pcm[i:i + SAMPLE_RATE // 10])
            done = await stream.stop()
        status, _, body = await http_get(url.http, "/metrics")
    assert isinstance(done, Done) and done.segments == len(speech.utterances)
    finals = stream.finals
    assert [f.segment for f in finals] == list(range(len(speech.utterances)))
    for final, utterance in zip(finals, speech.utterances):
        assert isinstance(final, Final) and final.text
        assert final.start <= utterance["end"] and final.end >= utterance["start"]
    assert status == 200 and "unipad_unwarmed_shape_calls 0.0" in body.decode()


async def test_partials_re_decode_the_open_segment(serve_test_server, qwen3_model_dir, speech):
    from server_testkit import run_stream

    pauses = [((u["start"] + u["end"]) / 2, lambda m, i=i: m["type"] == "partial" and m["segment"] == i)
              for i, u in enumerate(speech.utterances)]
    async with serve_test_server(qwen3_model_dir, partial_interval=0.3) as url:
        result = await run_stream(url, speech.audio, pauses=pauses)
    assert {p["segment"] for p in result.of("partial")} == set(range(len(speech.utterances)))
    assert [f["segment"] for f in result.of("final")] == list(range(len(speech.utterances)))
    assert all(p["text"] for p in result.of("partial"))
    assert result.messages[-1] == {"type": "done", "segments": len(speech.utterances)}


async def test_openai_upload_through_the_sdk(serve_test_server, qwen3_model_dir, speech):
    """The same segments give the same text through the OpenAI endpoint as through our own protocol."""
    wav = wav16(speech.audio)
    async with serve_test_server(qwen3_model_dir, token=TOKEN) as url:
        client = sdk(url)
        own = await own_protocol_text(url, speech.audio)
        plain = await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav))
        verbose = await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav),
                                                           response_format="verbose_json",
                                                           timestamp_granularities=["segment"])
    assert plain.text and plain.text == own
    assert len(verbose.segments) == len(speech.utterances) and verbose.text == plain.text


async def test_a_forced_language_through_the_engine_the_stream_and_the_sdk(serve_test_server, engine,
                                                                          qwen3_model_dir, speech):
    """A language the client names is forced into the prompt (the reference's transcribe(language=...)): the
    text comes back in it; one the model cannot be told is a clear error at every door."""
    import openai

    clip = speech.audio[: 3 * SAMPLE_RATE]
    assert engine.transcribe(clip, language="zh").language == "zh" and engine.transcribe(clip).language is None
    with pytest.raises(ProtocolError, match="unknown language 'xx'"):
        engine.transcribe(clip, language="xx")
    async with serve_test_server(qwen3_model_dir, token=TOKEN) as url:
        async with connect(url, token=TOKEN, sample_rate=SAMPLE_RATE, language="zh") as stream:
            await stream.send((clip * 32767).astype(np.int16))
            await stream.stop()
        verbose = await sdk(url).audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav16(clip)),
                                                             language="en", response_format="verbose_json")
        with pytest.raises(openai.BadRequestError, match="unknown language"):
            await sdk(url).audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav16(clip)),
                                                       language="xx")
    assert stream.finals and all(final.language == "zh" for final in stream.finals)
    assert verbose.language == "english" and verbose.text


def test_tokens_become_text_as_the_reference_parses_them():
    """Byte-level BPE to UTF-8 (a character split over tokens), the language tag, the repetition fix."""
    tokens = ["language", "ĠEnglish", "<asr_text>", "Hel", "lo", "Ġw", "orld", "Ġä", "½", "ł", "å¥½"]
    assert token_text(range(len(tokens)), tokens) == "language English<asr_text>Hello world 你好"
    assert parse_output("language English<asr_text>Hello world") == ("en", "Hello world")
    assert parse_output("language None<asr_text>") == (None, "")
    assert parse_output("just text") == (None, "just text")
    assert fix_repetitions("a" * 30 + "b") == "ab"
    assert fix_repetitions("x " + "ha" * 25 + " end") == "x ha end"
    assert fix_repetitions("ha" * 5) == "ha" * 5  # short runs stay
    assert parse_output("language Chinese<asr_text>你好") == ("zh", "你好")


async def test_realtime_commit_and_funasr_2pass(serve_test_server, qwen3_model_dir, speech):
    """The other doors serve a model without token times or CTC frames: a Realtime commit (no turn
    detection) gets the upload's text of that audio; FunASR's 2pass gets online text, then each segment's
    offline text, with no timestamps to give (an empty list, not an error)."""
    import asyncio
    import base64
    import json

    import websockets

    from server_testkit import pcm16

    utterance = speech.utterances[0]
    clip = speech.audio[: int((utterance["end"] + 0.3) * SAMPLE_RATE)]
    async with serve_test_server(qwen3_model_dir, token=TOKEN, funasr_port=0) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
        async with websockets.connect(uri, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": None}}}}))
            audio = base64.b64encode(pcm16(clip)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            event = {"type": ""}
            while event["type"] != "conversation.item.input_audio_transcription.completed":
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                assert event["type"] != "error", event
        upload = await sdk(url).audio.transcriptions.create(model="whisper-1", file=("clip.wav", wav16(clip)))
        assert event["transcript"] and event["transcript"] == upload.text

        async with websockets.connect(f"ws://127.0.0.1:{url.server.funasr_port}/", subprotocols=["binary"]) as ws:
            await ws.send(json.dumps({"mode": "2pass", "wav_name": "speech", "wav_format": "pcm",
                                      "audio_fs": SAMPLE_RATE, "is_speaking": True, "chunk_size": [5, 10, 5],
                                      "token": TOKEN}))
            pcm = pcm16(speech.audio)
            for i in range(0, len(pcm), 3200):
                await ws.send(pcm[i:i + 3200])
            await ws.send(json.dumps({"is_speaking": False}))
            results: list[dict] = []
            while not results or not results[-1].get("is_final"):
                results.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
    offline = [m for m in results if m["mode"] == "2pass-offline"]
    assert len(offline) == len(speech.utterances) and all(m["text"] for m in offline), results
    assert all(json.loads(m.get("timestamp") or "[]") == [] for m in offline)



@pytest.mark.parametrize("device, containers, expected", [
    ("cpu", None, (2.0, 4.0, 6.0, 8.0)),  # every whole number of 2 s windows
    ("cuda", None, (8.0,)),  # one shape to compile
    ("directml", None, (8.0,)),
    ("cpu", (3.0, 5.0), (4.0, 6.0, 8.0)),  # rounded up to whole windows; the export's is always one
    ("cpu", (0.5, 20.0), (2.0, 8.0)),  # at least one window, at most the export's container
    ("cuda", (4.0,), (4.0, 8.0)),
])
def test_ladder_of_whole_windows(qwen3_model_dir, device, containers, expected):
    from pipeline.modeldir import read_model_directory
    from pipeline.families.qwen3_asr.decoding import Qwen3Shapes, rung_shapes, window_geometry
    from pipeline.families.qwen3_asr.runtime import CPU_CACHE_STEP, CPU_PROMPT_STEP, qwen3_ladder

    dims = read_model_directory(qwen3_model_dir).manifest.dimensions
    ladder = qwen3_ladder(dims, device, containers)
    assert tuple(s.container_samples / SAMPLE_RATE for s in ladder) == expected
    steps = dict(cache_step=CPU_CACHE_STEP, prompt_step=CPU_PROMPT_STEP) if device == "cpu" else {}  # a GPU's: whole
    top = Qwen3Shapes.from_dimensions(dims)  # the pipeline's prompt room is the exporter's (forced language included)
    assert rung_shapes(dims, top.container_samples // window_geometry(dims)[0]) == top
    assert ladder[-1] == replace(Qwen3Shapes.from_dimensions(dims), **steps)
    for shapes in ladder:  # each prompt holds its windows' audio tokens; each cache that and max_new_tokens
        assert shapes.cache_slots - shapes.prompt_slots == shapes.max_new_tokens
        assert (shapes.cache_step, shapes.prompt_step) == (steps.get("cache_step", 0), steps.get("prompt_step", 0))
    assert [s.prompt_slots for s in ladder] == sorted({s.prompt_slots for s in ladder})
