"""Serving punctuation (--punc, issue 59 point 3) on every door, through real servers on 127.0.0.1 and real clients.

The models are FunASR's own tiny ones with seeded random weights: the Paraformer (conftest's
`paraformer_model_dir`) and the CT-Transformer (`ct_punc_model_dir`). Their words are noise, but the punctuation is
deterministic, so each door's text is checked against the Punctuator run directly (pipeline/punctuation.py) on the
text the same audio gives unpunctuated, and each word's times against that same unpunctuated answer:
    FunASR     offline and 2pass-offline: FunASR's punctuated text and one stamp_sents entry per mark; a server
               without --punc gives the same words and `timestamp`; 2pass-online stays unpunctuated
    Deepgram   deepgram-sdk: punctuate=true gives the punctuated transcript and each word's punctuated_word,
               without it the model's own text; live and pre-recorded
    OpenAI     the openai SDK: text and segments punctuated, words as the model wrote them
    Unipad     finals' text punctuated, tokens as the model gave them
    Realtime, Wyoming   a turn's transcript is the upload's punctuated text
Against FunASR itself (issue 59 point 4): its AutoModel(model=paraformer, punc_model=ct-punc) on the clips our server
hears (tests/fixtures/funasr_punc.json) gives our FunASR door's text, timestamps and sentences; FunASR's own
funasr_wss_client.py reads our offline and 2pass results (where $UNIPAD_FUNASR_WSS_CLIENT names a copy of it).
And the startup checks: a punctuation model as --model, a speech model as --punc, a language the punctuation model
cannot read, a missing file, both flags: each exits 2 with one line naming the fix.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import websockets

from pipeline.audio import SAMPLE_RATE
from pipeline.punctuation import Punctuated, Punctuator, load_punctuator
from pipeline.transcript import TokenTiming, Transcript, join_texts, starting_at
from serving import serve_test_server
from server.cli import build_parser, config_from_args, main
from server.punctuation_model import DEFAULT_PUNCTUATION, chosen_punctuation
from fixtures.make_funasr_punc_fixture import clip_digest
from server_testkit import eventually, funasr_input, http_get, pcm16, watch_clips

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLIP = FIXTURES / "paraformer" / "audio.wav"  # one utterance (2.2 s of three_utterances.wav)
MARKS = set("，。？、,.?")


@pytest.fixture(scope="module")
def punctuator(ct_punc_model_dir: Path) -> Punctuator:
    return load_punctuator(ct_punc_model_dir)


def clip() -> np.ndarray:
    audio, rate = soundfile.read(CLIP, dtype="float32")
    assert rate == SAMPLE_RATE
    return audio


def wav_bytes(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    return out.getvalue()


def spelled(punctuated: Punctuated) -> list[str]:
    """Each word as the punctuated text writes it, with its mark (Deepgram's punctuated_word)."""
    return [w + m for w, m in zip(punctuated.written, punctuated.marks)]


def sentence_sizes(marks: tuple[str, ...]) -> list[int]:
    """How many words each sentence holds: one ends with every word that has a mark."""
    ends = [i + 1 for i, mark in enumerate(marks) if mark]
    return [b - a for a, b in zip([0] + ends, ends + ([len(marks)] if not marks or not marks[-1] else []))]


def finals_of(messages: list[dict], mode: str) -> list[dict]:
    return [m for m in messages if m["mode"] == mode and m["text"]]


# ---- FunASR ------------------------------------------------------------------------------------------------

async def test_funasr_door_sends_funasr_text_and_stamp_sents(paraformer_model_dir, ct_punc_model_dir, punctuator,
                                                            speech):
    async with serve_test_server(paraformer_model_dir, funasr_port=0) as url:
        plain = finals_of(await funasr_input(url.server.funasr_port, speech.audio, "offline"), "offline")
    async with serve_test_server(paraformer_model_dir, funasr_port=0, punc=ct_punc_model_dir) as url:
        offline = finals_of(await funasr_input(url.server.funasr_port, speech.audio, "offline"), "offline")
        two_pass = await funasr_input(url.server.funasr_port, speech.audio, "2pass", pace=0.05)  # partials too
        _, _, ready = await http_get(url.http, "/readyz")
        _, _, model = await http_get(url.http, "/v1/model")
    assert json.loads(ready)["punctuation"] == json.loads(model)["punctuation"] == DEFAULT_PUNCTUATION
    assert len(offline) == len(plain) == len(speech.utterances)
    for before, after in zip(plain, offline):
        expected = punctuator.punctuate(before["text"])
        assert after["text"] == expected.text and any(mark in after["text"] for mark in MARKS)
        assert after["timestamp"] == before["timestamp"]  # word times unchanged
        sentences = after["stamp_sents"]
        assert [w for s in sentences for w in s["text_seg"].split()] == list(expected.words)
        assert [s["punc"] for s in sentences] == [m for m in expected.marks if m]
        assert [len(s["ts_list"]) for s in sentences] == sentence_sizes(expected.marks)
        assert [t for s in sentences for t in s["ts_list"]] == json.loads(before["timestamp"])
        assert all((s["start"], s["end"]) == (s["ts_list"][0][0], s["ts_list"][-1][1]) for s in sentences)
    assert [m["text"] for m in finals_of(two_pass, "2pass-offline")] == [m["text"] for m in offline]
    online = [m["text"] for m in two_pass if m["mode"] == "2pass-online"]
    assert online and not MARKS.intersection("".join(online))  # partials stay unpunctuated


# ---- FunASR itself (issue 59 point 4) ------------------------------------------------------------------------

REFERENCE = json.loads((FIXTURES / "funasr_punc.json").read_text(encoding="utf-8"))
RECORDINGS = {"three_utterances": FIXTURES / "three_utterances.wav", "paraformer_clip": CLIP,
              "demo_multi": FIXTURES / "demo" / "multi.wav"}
CHINESE_FORMS = {",": "，", ".": "。", "?": "？"}  # FunASR's Python sentences write its marks in these forms
SLACK_MS = 1  # our times are seconds, FunASR's integer ms within the clip plus the clip's offset: rounding


def funasr_times(times: list, offset: float, speech_start_ms: int) -> list[list[float]]:
    """FunASR's [start, end] ms within its clip, where they are in the stream (the clip's offset added), and a word
    it times before the speech starts moved to the speech start, as every door's words are (pipeline/transcript.py
    starting_at: the pre-roll is context, not speech)."""
    words = tuple(TokenTiming(str(i), a / 1000 + offset, b / 1000 + offset) for i, (a, b) in enumerate(times))
    moved = starting_at(Transcript("", words=words), speech_start_ms / 1000).words
    return [[w.start * 1000, w.end * 1000] for w in moved]


def near(ours: list, theirs: list) -> bool:
    return len(ours) == len(theirs) and all(abs(a - b) <= SLACK_MS for pair, other in zip(ours, theirs)
                                            for a, b in zip(pair, other))


@pytest.mark.parametrize("name", sorted(RECORDINGS))
async def test_the_funasr_door_answers_as_funasr_itself(paraformer_model_dir, ct_punc_model_dir, name):
    """tests/fixtures/funasr_punc.json: FunASR's AutoModel(model=paraformer, punc_model=ct-punc) on the clips our
    server hears (the same tiny random weights, fp32): the same text and timestamps, and one stamp_sents entry per
    sentence of FunASR's own timestamp_sentence, with its words, mark and times."""
    audio, _ = soundfile.read(RECORDINGS[name], dtype="float32")
    async with serve_test_server(paraformer_model_dir, funasr_port=0, precision="fp32", punc=ct_punc_model_dir) as url:
        with watch_clips(url.server) as heard:
            finals = finals_of(await funasr_input(url.server.funasr_port, audio, "offline"), "offline")
    reference = REFERENCE["recordings"][name]
    assert [clip_digest(a) for a, _ in heard] == [c["sha256"] for c in reference], (
        "the server hears other audio than when the fixture was made: run tests/fixtures/make_funasr_punc_fixture.py")
    assert len(finals) == len(reference)
    for final, funasr in zip(finals, reference):
        assert final["text"] == funasr["text"]
        times = funasr_times(funasr["timestamp"], funasr["offset"], final["start_time"])
        assert near(json.loads(final["timestamp"]), times)
        sentences, at = final["stamp_sents"], 0
        assert len(sentences) == len(funasr["sentence_info"])
        for ours, theirs in zip(sentences, funasr["sentence_info"]):
            assert ours["text_seg"].replace(" ", "") == theirs["raw_text"]  # FunASR's Python drops the blanks
            assert CHINESE_FORMS.get(ours["punc"], ours["punc"]) == theirs["text"][-1]
            words = times[at:at + len(theirs["timestamp"])]
            at += len(words)
            assert near(ours["ts_list"], words) and near([[ours["start"], ours["end"]]], [[words[0][0], words[-1][1]]])
        assert at == len(times)


FUNASR_CLIENT = "UNIPAD_FUNASR_WSS_CLIENT"  # the path of a copy of FunASR's funasr_wss_client.py


@pytest.mark.parametrize("mode", ["offline", "2pass"])
async def test_funasrs_own_python_client_reads_them(paraformer_model_dir, ct_punc_model_dir, tmp_path, mode):
    """FunASR's runtime/python/websocket/funasr_wss_client.py as its users run it (a WAV as --audio_in, --ssl 0),
    offline and 2pass (the latter at its real-time pace): the texts it records for the final results (its
    --log_dir events.jsonl) are FunASR's own for the clip, 2pass-online ones unpunctuated. FunASR's file is not
    in this repository: $UNIPAD_FUNASR_WSS_CLIENT names a copy (docs/funasr.md says where to get it)."""
    client = os.environ.get(FUNASR_CLIENT)
    if not client:
        pytest.skip(f"${FUNASR_CLIENT} names no copy of FunASR's funasr_wss_client.py (docs/funasr.md)")
    async with serve_test_server(paraformer_model_dir, funasr_port=0, precision="fp32", punc=ct_punc_model_dir) as url:
        process = await asyncio.create_subprocess_exec(
            sys.executable, client, "--host", "127.0.0.1", "--port", str(url.server.funasr_port), "--mode", mode,
            "--ssl", "0", "--audio_in", str(CLIP), "--log_dir", str(tmp_path / "logs"),
            "--output_dir", str(tmp_path / "out"), cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        printed, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, printed.decode(errors="replace")
    events = [json.loads(line) for log in (tmp_path / "logs").rglob("events.jsonl")
              for line in log.read_text(encoding="utf-8").splitlines()]
    finals = [e["text"] for e in events if e["mode"] == {"2pass": "2pass-offline"}.get(mode, mode) and e["text"]]
    assert finals == [clip["text"] for clip in REFERENCE["recordings"]["paraformer_clip"]]
    online = [e["text"] for e in events if e["mode"] == "2pass-online"]
    assert (mode == "2pass") == bool(online) and not MARKS.intersection("".join(online))
    assert finals[0] in printed.decode()


# ---- Deepgram ----------------------------------------------------------------------------------------------

async def deepgram_live(client: Any, audio: np.ndarray, **query: str) -> list[Any]:
    """deepgram-sdk's live connection: the finals' alternatives."""
    from deepgram.core.events import EventType
    from deepgram.listen.v1.types import ListenV1Results

    got: list[Any] = []
    async with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate="16000", **query) as connection:
        connection.on(EventType.MESSAGE, got.append)
        listening = asyncio.ensure_future(connection.start_listening())
        data = pcm16(audio)
        for i in range(0, len(data), SAMPLE_RATE // 5):
            await connection.send_media(data[i:i + SAMPLE_RATE // 5])
        await connection.send_close_stream()
        await asyncio.wait_for(listening, 30)
    return [m.channel.alternatives[0] for m in got if isinstance(m, ListenV1Results) and m.is_final]


def check_deepgram(plain: list[Any], punctuated: list[Any], punctuator: Punctuator) -> None:
    """Alternatives (or utterances) of the same audio without and with punctuate=true."""
    assert len(plain) == len(punctuated) > 0
    for before, after in zip(plain, punctuated):
        expected = punctuator.punctuate(before.transcript)
        assert after.transcript == expected.text.strip() and not MARKS.intersection(before.transcript)
        assert [w.punctuated_word for w in after.words] == spelled(expected)
        assert [w.punctuated_word for w in before.words] == list(expected.words)
        assert [(w.word, w.start, w.end) for w in after.words] == [(w.word, w.start, w.end) for w in before.words]


async def test_deepgram_punctuates_when_asked(paraformer_model_dir, ct_punc_model_dir, punctuator, speech):
    pytest.importorskip("deepgram", reason="deepgram-sdk is not installed (pip install -e '.[frameworks]')")
    from deepgram import AsyncDeepgramClient, DeepgramClientEnvironment

    async with serve_test_server(paraformer_model_dir, punc=ct_punc_model_dir) as url:
        client = AsyncDeepgramClient(api_key="any", environment=DeepgramClientEnvironment(
            base=url.http, production=f"ws://127.0.0.1:{url.port}", agent=f"ws://127.0.0.1:{url.port}",
            agent_rest=url.http))
        wav = wav_bytes(speech.audio)
        answers = [await client.listen.v1.media.transcribe_file(request=wav, model="nova-3", utterances=True,
                                                                punctuate=punctuate) for punctuate in (False, True)]
        live = [await deepgram_live(client, speech.audio, punctuate=flag) for flag in ("false", "true")]
    plain, punctuated = (answer.results.utterances for answer in answers)
    check_deepgram(plain, punctuated, punctuator)
    check_deepgram(*live, punctuator)
    whole = answers[1].results.channels[0].alternatives[0]
    assert whole.transcript == " ".join(u.transcript for u in punctuated)
    assert [w.punctuated_word for w in whole.words] == [w.punctuated_word for u in punctuated for w in u.words]


# ---- OpenAI, Unipad, Realtime, Wyoming ----------------------------------------------------------------------

async def test_every_other_door_gives_the_punctuated_text(paraformer_model_dir, ct_punc_model_dir, punctuator, speech):
    """The raw texts are the Deepgram door's without punctuate=true (the same uploads, so the same segments)."""
    import openai

    from clients.client import connect

    async with serve_test_server(paraformer_model_dir, punc=ct_punc_model_dir, wyoming_port=0) as url:
        api = openai.AsyncOpenAI(base_url=f"{url.http}/v1", api_key="any", max_retries=0)
        raw = await deepgram_post(url, speech.audio)
        verbose = await api.audio.transcriptions.create(
            file=("speech.wav", wav_bytes(speech.audio)), model="any", response_format="verbose_json",
            timestamp_granularities=["segment", "word"])
        upload = (await api.audio.transcriptions.create(file=("clip.wav", wav_bytes(clip())), model="any")).text
        async with connect(str(url), sample_rate=SAMPLE_RATE) as stream:
            pcm = np.round(speech.audio * 32767).astype(np.int16)
            for i in range(0, len(pcm), SAMPLE_RATE // 5):
                await stream.send(pcm[i:i + SAMPLE_RATE // 5])
            await stream.stop()
        finals = stream.finals
        realtime = await realtime_commit(url.port, clip())
        wyoming = await wyoming_transcript(url.server.wyoming_port, clip())
        await api.close()
    expected = [punctuator.punctuate(u["transcript"]) for u in raw]
    assert [s.text for s in verbose.segments] == [p.text.strip() for p in expected]
    assert verbose.text == join_texts([p.text.strip() for p in expected])  # no blank after "。", as FunASR writes
    assert [w.word for w in verbose.words] == [w["word"] for u in raw for w in u["words"]]
    assert len(finals) == len(expected)  # a live stream's words (its tokens) may differ from an upload's
    assert [f.text for f in finals] == [punctuator.punctuate("".join(t.text for t in f.tokens)).text.strip()
                                        for f in finals]
    assert upload and MARKS.intersection(upload) and realtime == upload == wyoming


async def deepgram_post(url: Any, audio: np.ndarray) -> list[dict]:
    """POST /v1/listen?utterances=true without punctuate: the model's own utterances."""
    from openai_testkit import post

    status, body = await post(url.port, "/v1/listen?utterances=true", wav_bytes(audio), {"Content-Type": "audio/wav"})
    assert status == 200, body
    return body["results"]["utterances"]


async def realtime_commit(port: int, audio: np.ndarray) -> str:
    """`audio` appended to a Realtime transcription session and committed by hand: its completed transcript."""
    import base64

    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": None}}}}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(audio)).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert event["type"] != "error", event
            if event["type"].endswith("input_audio_transcription.completed"):
                return event["transcript"]


async def wyoming_transcript(port: int, audio: np.ndarray) -> str:
    """One request as Home Assistant's Wyoming integration sends it: the transcript's text."""
    pytest.importorskip("wyoming")  # the package's own client below
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="zh").event())
        await client.write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
        await client.write_event(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=pcm16(audio)).event())
        await client.write_event(AudioStop().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None
            if Transcript.is_type(event.type):
                return Transcript.from_event(event).text


# ---- startup: what is served, and what is refused ------------------------------------------------------------

def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`unipad ARGV` exits 2 before binding a port: its one line."""
    assert main(argv + ["--port", "0"]) == 2
    return capsys.readouterr().err.strip()


def test_bad_punctuation_models_are_refused_at_start_naming_the_fix(paraformer_model_dir, ct_punc_model_dir,
                                                                   test_model_dir, tmp_path, capsys):
    line = refusal(["--model", str(ct_punc_model_dir)], capsys)
    assert "is a punctuation model" in line and "give this one as --punc" in line
    line = refusal(["--model", str(paraformer_model_dir), "--punc", str(paraformer_model_dir)], capsys)
    assert "is a speech model (paraformer), not a punctuation model: serve it as --model" in line
    line = refusal(["--model", str(paraformer_model_dir), "--punc", str(ct_punc_model_dir), "--no-punc"], capsys)
    assert "--punc and --no-punc contradict each other" in line
    for missing in ("model.onnx", "tokens.txt", "manifest.json"):
        broken = tmp_path / missing
        shutil.copytree(ct_punc_model_dir, broken)
        (broken / missing).unlink()
        line = refusal(["--model", str(paraformer_model_dir), "--punc", str(broken)], capsys)
        assert line.startswith(f"unipad: error: --punc {broken}: ") and missing in line
        assert "`python -m export pull ct-punc --force`" in line and "--no-punc" in line
    line = refusal(["--model", str(paraformer_model_dir), "--punc", "no-such-model"], capsys)
    assert "--punc no-such-model: no such directory, and not a known model name" in line
    # a punctuation model that reads only Chinese beside a model that recognises only English
    chinese = tmp_path / "chinese-only"
    shutil.copytree(ct_punc_model_dir, chinese)
    tokens = (chinese / "tokens.txt").read_text(encoding="utf-8").splitlines()
    han = iter("丁七万丈三上下不与丐丑专且丕世丘丙业丛东丝丞丢两严並丧丨个丫中丰串临丸丹为主丽举乃久么义之乌乍乎乏乐")
    (chinese / "tokens.txt").write_text("\n".join(next(han) if t.isascii() and t.isalpha() or "'" in t else t
                                                  for t in tokens) + "\n", encoding="utf-8")
    english = tmp_path / "english"
    shutil.copytree(paraformer_model_dir, english)
    manifest = json.loads((english / "manifest.json").read_text(encoding="utf-8"))
    manifest["languages"] = {"auto": 0, "en": 0}
    (english / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    line = refusal(["--model", str(english), "--punc", str(chinese)], capsys)
    assert "punctuates zh, but the model 'paraformer-large' recognises en: serve it without --punc" in line


def test_ct_punc_punctuates_a_chinese_paraformer_by_default_when_pulled(paraformer_model_dir, ct_punc_model_dir,
                                                                      test_model_dir, tmp_path, monkeypatch):
    from pipeline.modeldir import read_model_directory

    monkeypatch.setenv("UNIPAD_HOME", str(tmp_path))
    paraformer = read_model_directory(paraformer_model_dir)
    assert chosen_punctuation(None, False, paraformer) is None  # not pulled
    pulled = tmp_path / "models" / DEFAULT_PUNCTUATION
    shutil.copytree(ct_punc_model_dir, pulled)
    assert chosen_punctuation(None, False, paraformer) == pulled
    assert chosen_punctuation(None, True, paraformer) is None  # --no-punc
    assert chosen_punctuation(None, False, read_model_directory(test_model_dir)) is None  # not a Paraformer
    assert chosen_punctuation(DEFAULT_PUNCTUATION, False, read_model_directory(test_model_dir)) == pulled
    args = build_parser().parse_args(["--model", str(paraformer_model_dir)])
    assert config_from_args(args).punc == pulled
    args = build_parser().parse_args(["--model", str(paraformer_model_dir), "--no-punc"])
    assert config_from_args(args).punc is None


# ---- the worker ------------------------------------------------------------------------------------------------

async def test_the_worker_punctuates_finals_and_uploads_that_ask_never_partials(paraformer_model_dir, punctuator,
                                                                             caplog):
    """With the real engine and punctuator: FINAL and BATCH jobs that ask are punctuated, a PARTIAL never, a job
    that does not ask is not; a punctuation model that fails leaves the final its text (and logs why)."""
    from pipeline.engine import Engine, EngineOptions
    from server.metrics import Metrics
    from server.worker import BATCH, FINAL, PARTIAL, Job, Worker

    loop = asyncio.get_running_loop()
    got: dict[str, Any] = {}
    done = loop.create_future()
    worker = Worker(Engine(paraformer_model_dir, EngineOptions(precision="fp32", threads=1)), loop, Metrics(),
                    max_finals=8, punctuator=punctuator)

    def deliver(job: Job, transcript: Any, error: Any) -> None:
        assert error is None
        got[job.session] = transcript
        if len(got) == 5:
            done.set_result(None)

    def job(kind: str, session: str, punctuate: bool = True) -> Job:
        return Job(session=session, kind=kind, segment=0, start=0.0, end=2.2, audio_start=0.0, audio=clip(),
                   deliver=deliver, punctuate=punctuate)

    for kind, session in ((FINAL, "final"), (BATCH, "upload"), (PARTIAL, "partial")):
        worker.submit(job(kind, session))
    worker.submit(job(FINAL, "not asked", punctuate=False))
    worker.start()
    try:
        await eventually(lambda: len(got) == 4, 60)
        punctuate, punctuator.punctuate = punctuator.punctuate, lambda text: 1 / 0
        try:
            worker.submit(job(FINAL, "failing"))
            await asyncio.wait_for(done, 60)
        finally:
            punctuator.punctuate = punctuate
    finally:
        worker.stop(timeout=10)
    expected = punctuator.punctuate(got["final"].text)
    for session in ("final", "upload"):
        assert got[session].punctuation.text == expected.text and got[session].words == got["not asked"].words
    assert got["partial"].punctuation is None and got["not asked"].punctuation is None
    assert got["failing"].punctuation is None and got["failing"].text == got["final"].text
    assert "punctuation failed (session failing, segment 0): ZeroDivisionError" in caplog.text
