"""A Paraformer model directory served end to end: real server, real WebSocket, a real recording.

The model is FunASR's own tiny Paraformer with seeded random weights (conftest's `paraformer_model_dir`):
its words are noise, but its CIF fires tokens on speech, so segmentation, partials, finals and token
times all run through the Paraformer path (engine dispatch on the manifest, decoding, protocol).
"""
from __future__ import annotations

import json

from serving import serve_test_server
from server.protocol import CLOSE_NORMAL, parse_server_message
from server_testkit import run_stream

TOLERANCE = 0.3  # seconds, as the SenseVoice stream test


async def test_paraformer_streams_partials_finals_and_token_times(paraformer_model_dir, speech):
    pauses = [((u["start"] + u["end"]) / 2, lambda m, i=i: m["type"] == "partial" and m["segment"] == i)
              for i, u in enumerate(speech.utterances)]
    async with serve_test_server(paraformer_model_dir, partial_interval=0.3) as url:
        assert url.server.worker.engine.model.manifest.architecture == "paraformer"
        result = await run_stream(url, speech.audio, pauses=pauses)
    assert result.close_code == CLOSE_NORMAL
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
