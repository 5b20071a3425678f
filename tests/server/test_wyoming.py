"""Wyoming on --wyoming-port, driven by the `wyoming` package's own client (AsyncTcpClient and its event
classes, as Home Assistant's integration uses them): no Unipad code on the client side. One server for the
module; the pure framing is tested at the end with bytes in, events out."""
from __future__ import annotations

import asyncio
import io
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soundfile
import soxr

from pipeline.audio import SAMPLE_RATE
from pipeline.errors import ProtocolError
from serving import serve_test_server
from server.wyoming_protocol import EventReader, PcmFormat, encode, requested_language, to_float32, Event

with warnings.catch_warnings():  # wyoming.audio imports audioop, deprecated since Python 3.11: not ours to fix
    warnings.simplefilter("ignore", DeprecationWarning)
    wyoming = pytest.importorskip("wyoming")
    import wyoming.audio  # noqa: F401
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event as WyomingEvent  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402

e2e = pytest.mark.asyncio(loop_scope="module")  # the module's one server lives in the module's event loop
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "fixtures" / "demo"
CHUNK_SECONDS = 0.064  # Home Assistant's chunks are about this long
READ_TIMEOUT = 30.0
WORDS = "start recording four four six play music louder".split()  # multi.wav, as the demo model hears it


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(test_model_dir: Path) -> Any:
    async with serve_test_server(test_model_dir, wyoming_port=0, max_sessions=3) as url:
        yield url


@pytest.fixture(scope="module")
def multi() -> np.ndarray:
    audio, rate = soundfile.read(DEMO / "multi.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    return audio


def client(server: Any) -> AsyncTcpClient:
    """What Home Assistant's Wyoming integration opens for each request (docs/wyoming.md)."""
    return AsyncTcpClient("127.0.0.1", server.server.wyoming_port, read_timeout=READ_TIMEOUT)


def pcm(audio: np.ndarray, rate: int, width: int = 2, channels: int = 1) -> bytes:
    """float32 mono at SAMPLE_RATE -> little-endian integer PCM of `width` bytes at `rate`, `channels` copies."""
    audio = soxr.resample(audio, SAMPLE_RATE, rate) if rate != SAMPLE_RATE else audio
    scale = 2 ** (8 * width - 1) - 1
    ints = np.round(np.clip(audio, -1, 1) * scale).astype("<i4")
    ints = np.repeat(ints, channels)
    if width == 1:
        return (ints + 128).astype(np.uint8).tobytes()
    return ints.view(np.uint8).reshape(-1, 4)[:, :width].tobytes()


async def transcribe(server: Any, audio: np.ndarray, rate: int = SAMPLE_RATE, width: int = 2, channels: int = 1,
                     language: str | None = "en") -> list[WyomingEvent]:
    """One request as Home Assistant sends it; every event until the transcript-stop."""
    data = pcm(audio, rate, width, channels)
    step = int(CHUNK_SECONDS * rate) * width * channels
    async with client(server) as c:
        await c.write_event(Transcribe(language=language).event())
        await c.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        for i in range(0, len(data), step):
            await c.write_event(AudioChunk(rate=rate, width=width, channels=channels, audio=data[i:i + step]).event())
        await c.write_event(AudioStop().event())
        events = []
        while not events or not TranscriptStop.is_type(events[-1].type):
            event = await c.read_event()
            assert event is not None, f"connection closed after {[e.type for e in events]}"
            events.append(event)
    return events


async def upload(server: Any, audio: np.ndarray) -> str:
    from openai import AsyncOpenAI

    wav = io.BytesIO()
    soundfile.write(wav, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    api = AsyncOpenAI(base_url=server.http + "/v1", api_key="unused")
    result = await api.audio.transcriptions.create(file=("multi.wav", wav.getvalue()), model=server.server.model_name)
    await api.close()
    return result.text


@e2e
async def test_describe_answers_info_with_the_models_languages(server):
    async with client(server) as c:
        await c.write_event(Describe().event())
        info = Info.from_event(await c.read_event())
    (program,) = info.asr
    assert program.installed and program.supports_transcript_streaming and program.attribution.name
    (model,) = program.models
    assert model.name == server.server.model_name and model.installed
    assert model.languages == [k for k in server.server.model.manifest.languages if k not in ("auto", "nospeech")]


@e2e
async def test_a_request_gives_the_uploads_words_and_the_stream_events(server, multi):
    expected = await upload(server, multi)
    events = await transcribe(server, multi)
    kinds = [e.type for e in events]
    assert kinds[0] == "transcript-start" and kinds[-2:] == ["transcript", "transcript-stop"]
    assert set(kinds[1:-2]) <= {"transcript-chunk"} and len(kinds) >= 4  # three utterances: chunks as they end
    text = Transcript.from_event(events[-2]).text
    assert text == expected  # the same segments, the same words as the upload
    chunks = "".join(TranscriptChunk.from_event(e).text for e in events if TranscriptChunk.is_type(e.type))
    assert chunks == text
    if server.server.model.manifest.notice:  # the demo model: its words are known
        assert text.lower().replace(".", "").split() == WORDS


@e2e
@pytest.mark.parametrize("rate,width,channels", [(44100, 2, 2), (22050, 4, 1), (8000, 1, 1)])
async def test_any_announced_format_is_resampled(server, multi, rate, width, channels):
    events = await transcribe(server, multi, rate, width, channels)
    text = Transcript.from_event(events[-2]).text
    if server.server.model.manifest.notice and width > 1:  # 8-bit audio is too coarse to promise every word
        assert text.lower().replace(".", "").split() == WORDS
    assert TranscriptStart.is_type(events[0].type)


@e2e
async def test_silence_gives_an_empty_transcript(server):
    events = await transcribe(server, np.zeros(SAMPLE_RATE, np.float32), language=None)
    assert [e.type for e in events] == ["transcript-start", "transcript", "transcript-stop"]
    assert Transcript.from_event(events[1]).text == ""


async def read_error(c: AsyncTcpClient) -> Error:
    event = await c.read_event()
    assert event is not None and Error.is_type(event.type), event
    assert await c.read_event() is None  # then the server closes
    return Error.from_event(event)


@e2e
async def test_bad_input_gets_an_error_event_and_costs_no_other_stream(server, multi):
    good = asyncio.ensure_future(transcribe(server, multi))  # runs alongside every bad one
    async with client(server) as c:  # audio before audio-start
        await c.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * 640).event())
        error = await read_error(c)
        assert error.code == "bad_order" and "before audio-start" in error.text
    async with client(server) as c:  # a malformed event: a header that is not JSON
        c._writer.write(b"{not json\n")
        error = await read_error(c)
        assert error.code == "invalid_json" and "not JSON" in error.text
    async with client(server) as c:  # JSON nested past any protocol's depth: refused unparsed
        c._writer.write(b'{"type": "describe", "data": ' + b"[" * 30000 + b"}\n")
        error = await read_error(c)
        assert error.code == "invalid_json" and "nested deeper" in error.text
    async with client(server) as c:  # a payload length no server should allocate
        c._writer.write(json.dumps({"type": "audio-chunk", "payload_length": 1 << 40}).encode() + b"\n")
        assert (await read_error(c)).code == "message_too_big"
    async with client(server) as c:
        await c.write_event(Transcribe(language="tlh").event())
        error = await read_error(c)
        assert error.code == "bad_start" and "tlh" in error.text
    async with client(server) as c:
        await c.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await c.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * 641).event())
        assert (await read_error(c)).code == "invalid_audio"
    async with client(server) as c:
        await c.write_event(AudioStart(rate=16000, width=5, channels=1).event())
        assert (await read_error(c)).code == "unsupported_audio"
    events = await good
    assert Transcript.from_event(events[-2]).text == await upload(server, multi)


@e2e
async def test_events_written_at_once_are_each_answered(server, multi):
    """Home Assistant waits for each answer; a client that writes 40 describes (and a megabyte of blank
    lines) at once inside a request gets 40 infos, then the request's transcript. The answers once
    overflowed the connection's outbox: an internal error, every answer lost."""
    data = pcm(multi, SAMPLE_RATE)
    step = int(CHUNK_SECONDS * SAMPLE_RATE) * 2
    async with client(server) as c:
        await c.write_event(Transcribe(language="en").event())  # admitted: its answers go through the outbox
        c._writer.write(encode("describe") * 40 + b"\n" * (1 << 20))
        await c.write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
        for i in range(0, len(data), step):
            await c.write_event(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=data[i:i + step]).event())
        await c.write_event(AudioStop().event())
        kinds = []
        while not kinds or kinds[-1] != "transcript-stop":
            event = await c.read_event()
            assert event is not None, f"connection closed after {kinds}"
            kinds.append(event.type)
            if Transcript.is_type(event.type):
                text = Transcript.from_event(event).text
    assert kinds[:40] == ["info"] * 40 and "info" not in kinds[40:]
    assert text == await upload(server, multi)


@e2e
async def test_describe_is_answered_when_full_and_a_request_is_refused(server):
    limit = server.server.config.max_sessions
    held = [client(server) for _ in range(limit)]
    for c in held:  # admitted as soon as they send something other than describe
        await c.connect()
        await c.write_event(Transcribe(language="en").event())
    while len(server.server.connections) < limit:
        await asyncio.sleep(0.01)
    try:
        async with client(server) as c:
            await c.write_event(Describe().event())
            assert Info.is_type((await c.read_event()).type)
            await c.write_event(Transcribe(language="en").event())
            error = await read_error(c)
            assert error.code == "overloaded" and "full" in error.text
    finally:
        for c in held:
            await c.disconnect()


# ---- docs/wyoming.md, run as written -------------------------------------------------------------------

DOC = ROOT / "docs" / "wyoming.md"


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_docs_switches_are_the_servers_flags():
    from server.cli import build_parser

    lines = [line.split("#")[0].split() for block in doc_blocks("bash") for line in block.splitlines()]
    configs = [vars(build_parser().parse_args(line[1:])) for line in lines if line[:1] == ["unipad"]]
    assert [(c["wyoming_port"], c["wyoming_host"]) for c in configs] == [(10300, "127.0.0.1"),
                                                                           (10300, "192.168.1.20")]


@e2e
async def test_the_docs_client_gets_the_transcript(server, multi):
    (code,) = doc_blocks("python")
    namespace: dict[str, Any] = {}
    exec(code.replace("10300", str(server.server.wyoming_port)), namespace)  # the port we got instead of 10300
    text = await namespace["transcribe"](pcm(multi, SAMPLE_RATE))
    assert text == await upload(server, multi)


# ---- the pure framing ----------------------------------------------------------------------------------

def test_events_split_anywhere_are_reassembled():
    wire = (encode("transcribe", {"language": "en"}) + encode("audio-chunk", {"rate": 16000, "width": 2,
            "channels": 1}, b"\1\2\3\4") + b'{"type": "audio-stop", "data": {"timestamp": 5}}\n')
    for cut in range(1, len(wire)):
        reader = EventReader(max_payload=1 << 20)
        reader.receive_data(wire[:cut])
        reader.receive_data(wire[cut:])
        assert reader.events() == [Event("transcribe", {"language": "en"}),
                                   Event("audio-chunk", {"rate": 16000, "width": 2, "channels": 1}, b"\1\2\3\4"),
                                   Event("audio-stop", {"timestamp": 5})]


def test_blank_lines_between_events_are_skipped():
    """In any number and any cut (a flood of them cost the event loop seconds while other streams waited:
    each line copied the rest of the read; docs/benchmarks.md, "Reliability")."""
    wire = b"\n \r\n" + encode("describe") + b"\n" * (1 << 20) + encode("transcribe", {"language": "en"}) + b"\n\n"
    reader = EventReader(max_payload=1 << 20)
    for i in range(0, len(wire), 4096 + 3):
        reader.receive_data(wire[i:i + 4096 + 3])
    assert reader.events() == [Event("describe"), Event("transcribe", {"language": "en"})]


@pytest.mark.parametrize("line,code", [(b"[1]\n", "invalid_json"), (b'{"data": {}}\n', "invalid_json"),
                                       (b'{"type": "x", "data_length": -1}\n', "invalid_json"),
                                       (b'{"type": "x", "data_length": 1}\n[', "invalid_json"),
                                       (b'{"type": "x", "data": ' + b"[" * 20000 + b"}\n", "invalid_json"),
                                       (b'{"type": "x", "data_length": 20000}\n' + b"[" * 20000, "invalid_json"),
                                       (b"x" * 70000, "message_too_big")])
def test_malformed_events_name_their_fault(line, code):
    with pytest.raises(ProtocolError) as caught:
        EventReader(max_payload=1 << 20).receive_data(line)
    assert caught.value.code == code


def test_every_width_becomes_the_same_float_samples():
    ramp = np.linspace(-0.9, 0.9, 64, dtype=np.float32)
    for width in (1, 2, 3, 4):
        got = np.frombuffer(to_float32(pcm(ramp, SAMPLE_RATE, width, 2), PcmFormat(SAMPLE_RATE, width, 2)), "<f4")
        assert np.allclose(got, ramp, atol=1.5 / 2 ** (8 * width - 1))


def test_languages_map_onto_the_models():
    assert requested_language(Event("transcribe", {"language": "en-US"}), ["zh", "en"]) == "en"
    assert requested_language(Event("transcribe", {}), ["en"]) == "auto"
    with pytest.raises(ProtocolError):
        requested_language(Event("transcribe", {"language": "de"}), ["en"])


# ---- last, as it ends the module's server -------------------------------------------------------------

@e2e
async def test_shutdown_mid_request_still_sends_the_transcript(server, multi):
    data = pcm(multi, SAMPLE_RATE)
    async with client(server) as c:
        await c.write_event(Transcribe(language="en").event())
        await c.write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
        await c.write_event(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=data).event())
        while not any(s.session and s.session.received_seconds >= len(multi) / SAMPLE_RATE
                      for s in server.server.connections):
            await asyncio.sleep(0.01)
        server.server.request_shutdown()  # no audio-stop: the server ends the request itself
        events = []
        while (event := await c.read_event()) is not None:
            events.append(event)
    assert [e.type for e in events][-2:] == ["transcript", "transcript-stop"]
    if server.server.model.manifest.notice:  # the demo model: its words are known
        assert Transcript.from_event(events[-2]).text.split() == WORDS
