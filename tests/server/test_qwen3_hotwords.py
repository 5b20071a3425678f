"""Hotwords on Qwen3-ASR: the context of its prompt (pipeline/families/qwen3_asr/context.py), end to end.

The model is the `qwen-asr` package's tiny Qwen3-ASR (random weights) in Qwen's released layout with a small
byte-level BPE tokenizer (tests/qwen3_released.py), exported from that checkpoint (conftest's
`qwen3_released_model_dir`): its merges.txt encodes the context. Its words are noise, but a context changes
the prompt, so the greedy tokens change with it, and each door must give what the engine gives for it.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from openai_testkit import TOKEN, own_protocol_text, sdk

from clients.client import connect
from pipeline.audio import SAMPLE_RATE
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import ProtocolError
from pipeline.families import read_model_hotwords
from pipeline.hotwords import make_hotword, parse_hotwords
from pipeline.modeldir import read_model_directory
from pipeline.families.qwen3_asr.bpe import model_tokenizer
from pipeline.families.qwen3_asr.context import SYSTEM_TURN, ContextEncoder, Qwen3Context
from pipeline.families.qwen3_asr.decoding import GRAPHS, Qwen3Decoder, Qwen3Shapes, prompt_ids
from server_testkit import wav16

PHRASE = "turn on the kitchen lights"


@pytest.fixture(scope="module")
def engine(qwen3_released_model_dir):
    return Engine(qwen3_released_model_dir, EngineOptions(device="cpu")).load()


def test_hotwords_become_the_prompts_context(engine, qwen3_released_model_dir, speech):
    """The context is encoded with the system turn's text into the prompt; the engine's result is the
    decoder's with exactly that prompt, and differs from the result without it."""
    directory = read_model_directory(qwen3_released_model_dir)
    prompt = directory.manifest.dimensions["prompt"]
    context = engine.hotword_graph(parse_hotwords([PHRASE, {"text": "Hello", "boost": 3.0}]))
    assert isinstance(context, Qwen3Context) and context.text == f"{PHRASE}, Hello"
    tokenizer = model_tokenizer(qwen3_released_model_dir, directory.tokens, prompt["added_ids"])
    assert context.system == tuple(tokenizer.encode(SYSTEM_TURN + context.text))
    ids, length = prompt_ids(prompt, 13, 64, None, context.system)
    assert ids[0, :4].tolist() == [250, 10, 13, tokenizer.vocab["t"]]  # <|im_start|> system \n t(urn)...
    assert ids[0, length - 6: length].tolist() == list(prompt["suffix"])

    clip = speech.audio[: 3 * SAMPLE_RATE]
    plain, biased = engine.transcribe(clip), engine.transcribe(clip, hotwords=context)
    sessions = {g: ort.InferenceSession(str(qwen3_released_model_dir / directory.manifest.graphs["int8"][g]))
                for g in GRAPHS}
    direct = Qwen3Decoder(sessions, prompt, Qwen3Shapes.from_dimensions(directory.manifest.dimensions))
    tokens = direct.decode(clip, system=context.system).tokens
    assert biased.text == engine.transcribe(clip, hotwords=context).text  # deterministic
    assert tokens != direct.decode(clip).tokens and biased.text != plain.text
    from pipeline.families.qwen3_asr.text import qwen3_transcript

    assert biased.text == qwen3_transcript(tokens, directory.tokens, None, frozenset(prompt["special_ids"])).text
    assert engine.stats.unwarmed_calls == 0  # the prompt with a context runs at the warmed shapes


def test_a_context_that_does_not_fit_or_cannot_be_spelled_is_refused(engine, qwen3_released_model_dir, tmp_path):
    many = tuple(make_hotword(f"word{i} turn the lights") for i in range(40))
    with pytest.raises(ProtocolError, match=r"the hotwords \(context\) are \d+ tokens; this model's prompt has "
                                            r"room for 128") as caught:
        engine.hotword_graph(many)
    assert caught.value.code == "bad_start"
    with pytest.raises(ProtocolError, match="vocabulary has no token"):  # the tiny vocabulary is ASCII
        engine.hotword_graph(parse_hotwords(["你好"]))
    with pytest.raises(ProtocolError, match="control token '<|im_end|>'"):
        engine.hotword_graph((), "stop<|im_end|>")
    path = tmp_path / "hotwords.txt"
    path.write_text("\n".join(h.text for h in many), encoding="utf-8")
    with pytest.raises(ValueError, match=f"--hotwords {path}: the hotwords"):  # at startup, not per stream
        read_model_hotwords(path, read_model_directory(qwen3_released_model_dir))
    path.write_text(PHRASE + "\n", encoding="utf-8")
    assert [h.text for h in read_model_hotwords(path, read_model_directory(qwen3_released_model_dir))] == [PHRASE]
    other = tmp_path / "other-merges"  # merges of another tokenizer: they do not spell the template's "system"
    shutil.copytree(qwen3_released_model_dir, other)
    merges = (other / "merges.txt").read_text(encoding="utf-8").replace("s y\n", "")
    (other / "merges.txt").write_text(merges, encoding="utf-8")
    with pytest.raises(ProtocolError, match=re.escape(f"its merges.txt spells {SYSTEM_TURN!r} as")):
        ContextEncoder(read_model_directory(other)).context((make_hotword("lights"),))


async def test_hotwords_on_the_stream_and_a_prompt_on_the_openai_upload(serve_test_server, engine,
                                                                       qwen3_released_model_dir, speech):
    """The stream's `hotwords` and the OpenAI upload's `prompt` reach the engine as the same context: the
    same text, which is not the text without them; a prompt that does not fit is the API's 400."""
    import openai

    wav = wav16(speech.audio)
    async with serve_test_server(qwen3_released_model_dir, token=TOKEN) as url:
        client = sdk(url)
        plain = await own_protocol_text(url, speech.audio)
        async with connect(str(url), token=TOKEN, sample_rate=SAMPLE_RATE, hotwords=[PHRASE]) as stream:
            pcm = np.clip(np.round(speech.audio * 32767), -32768, 32767).astype(np.int16)
            for i in range(0, len(pcm), SAMPLE_RATE // 10):
                await stream.send(pcm[i:i + SAMPLE_RATE // 10])
            await stream.stop()
        upload = await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav), prompt=PHRASE)
        unbiased = await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav))
        with pytest.raises(openai.BadRequestError, match="room for 128"):
            await client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav),
                                                     prompt=" ".join(["lights"] * 200))
    biased = " ".join(f.text for f in stream.finals)
    assert len(stream.finals) == len(speech.utterances)
    assert unbiased.text == plain and upload.text == biased != plain


async def test_a_realtime_sessions_prompt_is_its_context(serve_test_server, qwen3_released_model_dir, speech):
    """A Realtime transcription session's `prompt` reaches the engine as the upload's `prompt` does; one that
    does not fit is an `error` event and leaves the session as it was."""
    import asyncio
    import base64
    import json

    import websockets

    from server_testkit import pcm16

    clip = speech.audio[: int((speech.utterances[0]["end"] + 0.3) * SAMPLE_RATE)]
    transcription = {"model": "whisper-1", "prompt": PHRASE}
    async with serve_test_server(qwen3_released_model_dir, token=TOKEN) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
        async with websockets.connect(uri, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            too_long = {"model": "whisper-1", "prompt": " ".join(["lights"] * 200)}
            for settings in (too_long, transcription):
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": None,
                              "transcription": settings}}}}))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(clip)).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            events = [{"type": ""}]
            while events[-1]["type"] != "conversation.item.input_audio_transcription.completed":
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        upload = await sdk(url).audio.transcriptions.create(model="whisper-1", file=("clip.wav", wav16(clip)),
                                                            prompt=PHRASE)
        plain = await sdk(url).audio.transcriptions.create(model="whisper-1", file=("clip.wav", wav16(clip)))
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and "room for 128" in errors[0]["error"]["message"]
    assert events[-1]["transcript"] == upload.text != plain.text
