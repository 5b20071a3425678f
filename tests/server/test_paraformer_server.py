"""A Paraformer model directory served end to end: real server, real WebSocket, a real recording.

The model is FunASR's own tiny Paraformer with seeded random weights (conftest's `paraformer_model_dir`):
its words are noise, but its CIF fires tokens on speech, so segmentation, partials, finals and token
times all run through the Paraformer path (engine dispatch on the manifest, decoding, protocol).
"""
from __future__ import annotations

import json

from serving import serve_test_server
from server.protocol import CLOSE_NORMAL, parse_server_message
from server_testkit import http_get, run_stream

TOLERANCE = 0.3  # seconds, as the SenseVoice stream test


async def test_paraformer_streams_partials_finals_and_token_times(paraformer_model_dir, speech):
    pauses = [((u["start"] + u["end"]) / 2, lambda m, i=i: m["type"] == "partial" and m["segment"] == i)
              for i, u in enumerate(speech.utterances)]
    async with serve_test_server(paraformer_model_dir, partial_interval=0.3) as url:
        assert url.server.worker.engine.model.manifest.architecture == "paraformer"
        result = await run_stream(url, speech.audio, pauses=pauses)
        _, _, body = await http_get(url.http, "/metrics")
    assert result.close_code == CLOSE_NORMAL
    # The CPU runs each segment and partial at its own length (open shapes): counted as cold, none refused.
    values = {line.split()[0]: float(line.split()[1]) for line in body.decode().splitlines()
              if line.startswith(("unipad_unwarmed_shape_calls ", "unipad_cold_shape_calls "))}
    assert values["unipad_unwarmed_shape_calls"] == 0 and values["unipad_cold_shape_calls"] > 0
    finals = result.of("final")
    assert [f["segment"] for f in finals] == list(range(len(speech.utterances)))
    for final, utterance in zip(finals, speech.utterances):
        assert abs(final["start"] - utterance["start"]) <= TOLERANCE
        assert abs(final["end"] - utterance["end"]) <= TOLERANCE
        assert final["text"] and final["tokens"], final
        starts = [t["start"] for t in final["tokens"]]
        assert starts == sorted(starts)
        assert "".join(t["text"] for t in final["tokens"]) == final["text"]
        for token in final["tokens"]:  # times from the CIF peaks, within the segment's audio (pre-roll included)
            assert final["start"] - TOLERANCE - 0.1 <= token["start"] <= token["end"] <= final["end"] + TOLERANCE
    assert {p["segment"] for p in result.of("partial")} == set(range(len(speech.utterances)))
    assert result.messages[-1] == {"type": "done", "segments": len(speech.utterances)}
    for message in result.messages:
        parse_server_message(json.dumps(message))


def test_hotwords_are_refused_with_a_reason(paraformer_model_dir):
    """Hotwords bias a CTC beam search; a Paraformer has no CTC output, so a start asking for them is a
    bad_start naming why, not silently ignored."""
    import pytest

    from pipeline.engine import Engine, EngineOptions
    from pipeline.errors import ProtocolError
    from pipeline.hotwords import parse_hotwords

    engine = Engine(paraformer_model_dir, EngineOptions(containers=(2.0,))).load()
    assert engine.hotword_graph(()) is None
    with pytest.raises(ProtocolError, match="hotwords need a CTC model") as caught:
        engine.hotword_graph(parse_hotwords(["now"]))
    assert caught.value.code == "bad_start"


async def test_funasr_port_gives_untagged_text_and_word_times(paraformer_model_dir, speech):
    """FunASR's C++ clients always send svs_itn, which asks a SenseVoice for its tags; a Paraformer has none,
    so its text comes plain, with one [start, end] pair per word (a character in Chinese)."""
    import asyncio

    import websockets

    from pipeline.audio import SAMPLE_RATE
    from server_testkit import pcm16

    async with serve_test_server(paraformer_model_dir, funasr_port=0) as url:
        async with websockets.connect(f"ws://127.0.0.1:{url.server.funasr_port}/", subprotocols=["binary"]) as ws:
            await ws.send(json.dumps({"mode": "offline", "wav_name": "speech", "wav_format": "pcm", "audio_fs": SAMPLE_RATE,
                                      "is_speaking": True, "itn": True, "svs_lang": "auto", "svs_itn": True}))
            await ws.send(pcm16(speech.audio))
            await ws.send(json.dumps({"is_speaking": False}))
            results: list[dict] = []
            while not results or not results[-1]["is_final"]:
                results.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    texts = [m["text"] for m in results if m["text"]]
    assert texts and not any("<|" in t for t in texts), texts
    for message in results:
        if message["text"]:
            times = json.loads(message["timestamp"])
            assert len(times) == len([w for s in message["stamp_sents"] for w in s["ts_list"]]) > 0
            assert all(a <= b for a, b in times) and times == sorted(times)
