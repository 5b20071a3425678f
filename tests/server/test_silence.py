"""Silence around speech never reaches the model, at any door, and word times start at the speech (issue 25).

Real server on 127.0.0.1, the real `openai` client for uploads, raw Realtime events for the modes OpenAI's
SDK leaves to the caller (`turn_detection: null` with manual commits, `prefix_padding_ms` 600 as LiveKit
sends it), the FunASR port, the demo fixtures with silence added.
"""
from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import numpy as np
import pytest
import soundfile
import websockets
from openai_testkit import DEMO, TOKEN, sdk, words

from clients.client import connect

from pipeline.audio import SAMPLE_RATE

TRANSCRIPTION = "conversation.item.input_audio_transcription"
LEAD, TRAIL = 2.0, 1.0  # seconds of silence added around each fixture
LIVEKIT_VAD = {"type": "server_vad", "prefix_padding_ms": 600, "silence_duration_ms": 500, "threshold": 0.5}
INTO_THE_WORD = 0.06  # seconds past a word's start (its CTC spike) where a commit falls
PIECES = "gpt-4o-transcribe"  # the model the pieces of one live stream name (part of a client's key)


def quiet(seconds: float, seed: int) -> np.ndarray:
    """A silent room: noise 60 dB below full scale, which the VAD does not take for speech."""
    return (np.random.default_rng(seed).standard_normal(int(seconds * SAMPLE_RATE)) * 1e-3).astype(np.float32)


def padded_clips(count: int) -> list[tuple[np.ndarray, str]]:
    """The first `count` demo fixtures with LEAD and TRAIL seconds of quiet around them, PCM16-exact."""
    clips = []
    for n, entry in enumerate(json.loads((DEMO / "transcripts.json").read_text())[:count]):
        speech, _ = soundfile.read(DEMO / entry["audio"], dtype="float32")
        audio = np.concatenate([quiet(LEAD, n), speech, quiet(TRAIL, 100 + n)])
        clips.append((exact(audio), entry["text"]))
    return clips


def exact(audio: np.ndarray) -> np.ndarray:
    """`audio` as PCM16 samples read back (k / 32768): every door then decodes the very same samples."""
    return np.clip(np.round(audio * 32768), -32768, 32767).astype(np.float32) / 32768


def pcm16(audio: np.ndarray) -> np.ndarray:
    return np.clip(np.round(audio * 32768), -32768, 32767).astype("<i2")


def wav(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, pcm16(audio), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    return out.getvalue()


async def realtime_text(url: Any, audio: np.ndarray, turn_detection: dict | None,
                        started: list | None = None) -> str:
    """`audio` appended to a new Realtime session (16 kHz) as one item, committed by hand without turn
    detection, else ended by server VAD; its completed transcript (`started` collects speech_started events)."""
    uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
    async with websockets.connect(uri, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": turn_detection}}}}))
        data = pcm16(audio).tobytes()
        for i in range(0, len(data), SAMPLE_RATE):  # 0.5 s per event
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(data[i:i + SAMPLE_RATE]).decode()}))
        if turn_detection is None:
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert event["type"] != "error", event
            if event["type"] == "input_audio_buffer.speech_started" and started is not None:
                started.append(event)
            if event["type"] == f"{TRANSCRIPTION}.completed":
                return event["transcript"]


@pytest.mark.parametrize("vad", ["webrtc", "silero"])
async def test_every_door_hears_the_speech_not_the_silence(serve_test_server, vad):
    """2 s of quiet before and 1 s after each utterance: a Realtime commit without turn detection, Realtime
    server VAD with LiveKit's 600 ms prefix padding, an upload and our own stream give the model the same
    audio (the speech with the server's 0.3 s pre-roll), so the same words (bench/silence.py measures the
    WER of each door on many more recordings). Before, the commit decoded all the silence and the 600 ms padding reached the model,
    and both added words."""
    clips = padded_clips(3)
    audios = [a for a, _ in clips]
    async with serve_test_server(token=TOKEN, vad=vad) as url:
        client = sdk(url)
        uploads = [(await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav(a)))).text
                   for a in audios]
        streamed = [" ".join(f.text for f in (await stream(url, a)).finals) for a in audios]
        committed = [await realtime_text(url, a, None) for a in audios]
        started: list[dict] = []
        livekit = [await realtime_text(url, a, LIVEKIT_VAD, started) for a in audios]
    assert committed == uploads and livekit == uploads
    # What the client asked for keeps its meaning: OpenAI's audio_start_ms includes the prefix padding.
    assert len(started) == len(audios) and all(1300 <= e["audio_start_ms"] <= 1600 for e in started), started
    assert [words(t) for t in streamed] == [words(t) for t in uploads]
    assert all(uploads)


@pytest.mark.parametrize("vad", ["webrtc", "silero"])
async def test_a_buffer_without_speech_has_an_empty_transcript(serve_test_server, vad):
    """3 s of digital silence (a muted microphone), and a quiet room with a 100 ms beep: a Realtime commit
    without turn detection answers an empty transcript, as OpenAI's does, and so does an upload. Before, the
    commit decoded them whole, and the demo model heard "oh" in the silence and "up" in the beep."""
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    beep = quiet(3.0, 7) + np.where((t > 1.0) & (t < 1.1), 0.2 * np.sin(2 * np.pi * 1000 * t), 0).astype(np.float32)
    buffers = [np.zeros(3 * SAMPLE_RATE, np.float32), exact(beep)]
    async with serve_test_server(token=TOKEN, vad=vad) as url:
        uploads = [(await sdk(url).audio.transcriptions.create(model="whisper-1", file=("a.wav", wav(a)))).text
                   for a in buffers]
        committed = [await realtime_text(url, a, None) for a in buffers]
    assert committed == ["", ""] and uploads == ["", ""]


async def test_word_times_start_at_the_speech(serve_test_server):
    """With 1 s of quiet before an utterance, no word starts before the speech the VAD found: in an upload's
    verbose_json (words and segments), our stream's finals and FunASR's offline timestamps. Before, the
    first word started in the 0.3 s pre-roll (0.24 s early with the demo model)."""
    speech, _ = soundfile.read(DEMO / "single_00.wav", dtype="float32")
    audio = exact(np.concatenate([quiet(1.0, 1), speech, quiet(1.0, 2)]))
    async with serve_test_server(token=TOKEN, funasr_port=0) as url:
        verbose = await sdk(url).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav(audio)), response_format="verbose_json",
            timestamp_granularities=["word", "segment"])
        funasr = await funasr_offline(url, audio)
        streamed = await stream(url, audio)
    assert verbose.segments and verbose.words
    speech_start = verbose.segments[0].start
    assert 0.9 <= speech_start <= 1.1  # where the fixture's speech is (its own lead is near 0)
    assert all(w.start >= speech_start for w in verbose.words), (speech_start, verbose.words)
    assert streamed.finals and all(t.start >= f.start for f in streamed.finals for t in f.tokens)
    stamps = json.loads(funasr["timestamp"])
    assert stamps and stamps[0][0] >= funasr["start_time"] == round(speech_start * 1000)


async def test_speech_from_the_first_sample_keeps_its_words_and_never_starts_before_it(serve_test_server):
    """Files cut tight, their speech from the first sample: the upload, a live stream and Realtime commits
    (one session, each clip its own commit, its speech from the commit's first sample) say each fixture's
    words, and no word or segment starts before 0 (the model hears a short lead of zeros first:
    trim.STREAM_START_LEAD)."""
    entries = json.loads((DEMO / "transcripts.json").read_text())[:6]
    tights = []
    for entry in entries:
        speech, _ = soundfile.read(DEMO / entry["audio"], dtype="float32")
        tights.append(exact(speech[np.flatnonzero(np.abs(speech) > 0.01)[0]:]))
    async with serve_test_server(token=TOKEN) as url:
        committed = await realtime_commits(url, [np.concatenate([t, quiet(0.6, n)]) for n, t in enumerate(tights)])
        assert [words(t) for t in committed] == [words(e["text"]) for e in entries]
        for entry, tight in zip(entries, tights):
            verbose = await sdk(url).audio.transcriptions.create(
                model="whisper-1", file=("a.wav", wav(tight)), response_format="verbose_json",
                timestamp_granularities=["word", "segment"])
            streamed = await stream(url, tight)
            assert words(verbose.text) == words(entry["text"]), (entry, verbose.text)
            assert words(" ".join(f.text for f in streamed.finals)) == words(entry["text"])
            assert min([w.start for w in verbose.words] + [s.start for s in verbose.segments]) >= 0
            assert all(t.start >= 0 for f in streamed.finals for t in f.tokens)


async def test_digital_silence_after_the_room_adds_no_word(serve_test_server):
    """Two recordings in babble, each followed by 1 s of digital silence (tests/fixtures/demo/babble_turns.wav,
    bench frameworks' own), in one stream and in one upload: webrtcvad hears the second one's babble as
    speech up to the zeros, and the model, hearing the babble stop dead, said "five zero two oh" for "five
    zero two". It now hears the room without the zeros after it (trim._room_before)."""
    audio, _ = soundfile.read(DEMO / "babble_turns.wav", dtype="float32")
    spoken = json.loads((DEMO / "babble_turns.json").read_text())["texts"]
    async with serve_test_server(token=TOKEN) as url:
        streamed = await stream(url, audio)
        upload = await sdk(url).audio.transcriptions.create(model="whisper-1", file=("a.wav", wav(audio)))
    assert [words(f.text) for f in streamed.finals] == [words(t) for t in spoken]
    assert words(upload.text) == words(" ".join(spoken))


async def stream(url: Any, audio: np.ndarray) -> Any:
    """`audio` through our own /v1/stream at once, then stop: the client stream, finals received."""
    async with connect(str(url), token=TOKEN, sample_rate=SAMPLE_RATE) as session:
        await session.send(pcm16(audio))
        await session.stop()
    return session


async def funasr_offline(url: Any, audio: np.ndarray) -> dict:
    """One offline PCM input on the FunASR port; its segment's result."""
    async with websockets.connect(f"ws://127.0.0.1:{url.server.funasr_port}/", subprotocols=["binary"]) as ws:
        await ws.send(json.dumps({"mode": "offline", "wav_name": "a", "wav_format": "pcm", "audio_fs": SAMPLE_RATE,
                                  "is_speaking": True, "token": TOKEN}))
        await ws.send(pcm16(audio).tobytes())
        await ws.send(json.dumps({"is_speaking": False}))
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if "start_time" in message:
                return message


async def test_commits_at_pauses_inside_an_utterance_keep_its_words(serve_test_server):
    """pipecat's default Realtime mode commits after 0.2 s of silence, often between two words of one
    utterance. Each fixture committed in two pieces, cut between two words (every such cut, times from the
    upload's verbose_json): the second commit's transcript is the spoken words after the first's. Before,
    the second piece was decoded alone and the demo model misheard its first word ("seven two one" as "two
    two one", "back home" as "home")."""
    clips = padded_clips(3)
    async with serve_test_server(token=TOKEN) as url:
        checked = 0
        for audio, text in clips:
            upload = await upload_words(url, audio)
            spoken = words(text)
            for before, after in zip(upload, upload[1:]):
                at = round((before.end + after.start) / 2 * SAMPLE_RATE)
                first, second = await realtime_commits(url, [audio[:at], audio[at:]])
                if not first:  # less than a word: the VAD heard no speech in it (an empty item, as OpenAI's)
                    continue
                assert words(second) == spoken[len(words(first)):], (text, first, second)
                checked += 1
    assert checked >= 4


async def test_commits_inside_a_word_lose_and_repeat_no_word(serve_test_server):
    """A client's VAD may commit a few frames into the next word (its onset heard as silence): the two
    transcripts together are the spoken words, each once. Decoded alone, 8 of these 9 second commits were
    wrong. (That the context is the sound as received, not the first commit's trimmed copy with a hole at
    the cut, is tests/pipeline/test_trim.py's.)"""
    async with serve_test_server(token=TOKEN) as url:
        assert await commits_cut_inside_words(url, (INTO_THE_WORD,), wait=True) >= 6


async def test_a_commit_that_cuts_a_word_hears_it_with_the_audio_after_it(serve_test_server):
    """pipecat streams on after its VAD commits, and the next word may begin just before the commit: the
    piece then ends in the start of a word. The two items, the second appended right after the first commit
    as pipecat does, hold the spoken words, each once, wherever in the word's onset the commit falls. Before,
    the first item guessed the word from its start ("s" of "save" as "slower") and the second, hearing it
    whole as its context, dropped it as said."""
    async with serve_test_server(token=TOKEN) as url:
        assert await commits_cut_inside_words(url, (0.06, 0.12, 0.18), wait=False) >= 18


async def test_a_commit_that_cuts_the_first_word_of_an_utterance_keeps_its_onset(serve_test_server):
    """A commit that ends less than min_speech (0.2 s) into an utterance's first word: that much speech is no
    segment on its own, so it was dropped, and the next commit heard the word without its onset ("three"
    lost, "call" heard as "oh"). Speech going on at a commit's end is now a segment however short, heard
    with the audio after it."""
    async with serve_test_server(token=TOKEN) as url:
        assert await commits_cut_inside_words(url, (0.03, 0.06, 0.09, 0.12, 0.15), wait=False, first_word=True) >= 15


async def test_uploads_a_client_cut_from_one_live_stream_keep_their_words(serve_test_server):
    """pipecat's OpenAISTTService uploads each turn its VAD marks (stop_secs 0.2: often between two words of
    one utterance) as it ends, with 0.5 s of zeros appended. Each fixture uploaded in two such pieces, cut
    between two words, the second sent as long after the first as its sound lasts: the second's transcript
    is the spoken words after the first's (server/upload_sequence.py). Decoded alone, as every upload was
    before, the demo model misheard some of the same second pieces. (Each cut's pieces, and each upload
    that must stand alone, name a model of their own: the client's uploads follow each other much faster
    than real time here, so by timing alone several of them could precede a piece.)"""
    appended = np.zeros(SAMPLE_RATE // 2, np.float32)
    alone_wrong = checked = 0
    async with serve_test_server(token=TOKEN) as url:
        for audio, text in padded_clips(2):
            audio = audio[round((LEAD - 0.3) * SAMPLE_RATE):-round((TRAIL - 0.3) * SAMPLE_RATE)]
            spoken = words(text)
            upload = await upload_words(url, audio)
            for before, after in zip(upload, upload[1:]):
                at = round((before.end + after.start) / 2 * SAMPLE_RATE)
                stream = f"{PIECES}-{checked}"
                began = asyncio.get_running_loop().time()
                first = await upload_text(url, np.concatenate([audio[:at], appended]), stream)
                await asyncio.sleep(began + (len(audio) - at) / SAMPLE_RATE - asyncio.get_running_loop().time())
                second = await upload_text(url, np.concatenate([audio[at:], appended]), stream)
                assert words(second) == spoken[len(words(first)):], (text, first, second)
                alone = await upload_text(url, np.concatenate([audio[at:], appended]), f"alone-{checked}")
                alone_wrong += words(alone) != spoken[len(words(first)):]
                checked += 1
    assert checked >= 4 and alone_wrong >= 1


async def upload_text(url: Any, audio: np.ndarray, model: str = "whisper-1") -> str:
    return (await sdk(url).audio.transcriptions.create(model=model, file=("a.wav", wav(audio)))).text


async def commits_cut_inside_words(url: Any, intos: tuple[float, ...], wait: bool, first_word: bool = False) -> int:
    """Each of three fixtures committed in two pieces, cut `into` s past each word's CTC spike (which comes
    before its sound), for each of `intos`: the two transcripts together are the spoken words, each once.
    How many cuts were checked. `wait`: as realtime_commits. `first_word`: cut the first word, else every other."""
    checked = 0
    for audio, text in padded_clips(3):
        upload = await upload_words(url, audio)
        for word in upload[:1] if first_word else upload[1:]:
            for into in intos:
                at = round((word.start + into) * SAMPLE_RATE)
                first, second = await realtime_commits(url, [audio[:at], audio[at:]], wait=wait)
                assert words(first) + words(second) == words(text), (text, word.word, into, first, second)
                checked += 1
    return checked


async def upload_words(url: Any, audio: np.ndarray) -> list[Any]:
    """The words of `audio` uploaded with word timestamps (verbose_json), as the SDK returns them."""
    upload = await sdk(url).audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav(audio)), response_format="verbose_json",
        timestamp_granularities=["word"])
    return list(upload.words)


async def realtime_commits(url: Any, pieces: list[np.ndarray], wait: bool = True) -> list[str]:
    """Each piece appended to one Realtime session without turn detection and committed; the transcripts.
    `wait`: each piece's transcript before the next piece is sent (else the pieces go out back to back)."""
    uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
    transcripts = []

    async def completed() -> None:
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert event["type"] != "error", event
            if event["type"] == f"{TRANSCRIPTION}.completed":
                transcripts.append(event["transcript"])
                return

    async with websockets.connect(uri, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": None}}}}))
        for piece in pieces:
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm16(piece).tobytes()).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            if wait:
                await completed()
        while len(transcripts) < len(pieces):
            await completed()
    return transcripts
