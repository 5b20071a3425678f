"""clients/file.py as a user runs it (a subprocess) against a real server: every format, every failure."""
from __future__ import annotations

import asyncio
import re
import socket
import sys

import numpy as np
import pytest
import soundfile
import soxr
from client_testkit import ROOT, assert_one_line_error, knows_words, normalise, run_script
from subtitle_validator import parse_srt, parse_vtt

from clients.client import connect
from pipeline.audio import SAMPLE_RATE
from server.protocol import Final, parse_server_message

FIXTURE = str(ROOT / "tests" / "fixtures" / "demo" / "multi.wav")
TEXT_LINE = re.compile(r"\[(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})\] (\S.*)")


def finals_of(jsonl: str) -> list[Final]:
    finals = [parse_server_message(line) for line in jsonl.splitlines()]
    assert all(isinstance(f, Final) for f in finals)
    return finals  # type: ignore[return-value]


async def test_every_format(serve_test_server, speech, test_model_dir, tmp_path):
    async with serve_test_server() as url:
        jsonl = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast", "--format", "jsonl")
        assert jsonl.returncode == 0, jsonl.stderr
        finals = finals_of(jsonl.stdout)
        assert [f.segment for f in finals] == list(range(len(speech.utterances)))
        spoken = [f for f in finals if f.text.strip()]

        text = await run_script("-m", "clients.file", FIXTURE, "--url", url, "--fast")  # module mode, text
        assert text.returncode == 0, text.stderr
        assert "\r" not in text.stdout and "\033" not in text.stdout  # no live partials when not a TTY
        lines = [TEXT_LINE.fullmatch(line) for line in text.stdout.splitlines()]
        assert all(lines) and len(lines) == len(spoken), text.stdout

        out = {}
        for fmt in ("srt", "vtt"):
            path = tmp_path / f"out.{fmt}"
            run = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast", "--format", fmt,
                                   "--output", str(path))
            assert run.returncode == 0 and run.stdout == "", run
            out[fmt] = path.read_text(encoding="utf-8")
    srt, vtt = parse_srt(out["srt"]), parse_vtt(out["vtt"])
    assert len(srt) == len(vtt) >= len(spoken)  # long finals may be split at word times
    assert [(c.start, c.end, c.text) for c in srt] == [(c.start, c.end, c.text) for c in vtt]
    for cue in srt:
        assert 0 <= cue.start < cue.end <= speech.duration + 0.1
    if knows_words(test_model_dir):
        expected = [normalise(u["text"]) for u in speech.utterances]
        assert [normalise(f.text) for f in finals] == expected
        assert [normalise(m.group(3)) for m in lines] == expected
        assert normalise(" ".join(c.text for c in srt)) == " ".join(expected)


async def test_real_time_pace_and_a_stereo_44k_flac(serve_test_server, speech, tmp_path):
    """Not --fast: sent at the pace of the audio (1.2 s here); a stereo 44.1 kHz FLAC is downmixed."""
    clip = speech.audio[int(0.3 * SAMPLE_RATE):int(2.5 * SAMPLE_RATE)]  # the first utterance
    audio44 = soxr.resample(clip, SAMPLE_RATE, 44100)
    path = tmp_path / "stereo.flac"
    soundfile.write(path, np.stack([audio44, audio44 * 0.5], axis=1), 44100)
    async with serve_test_server() as url:
        run = await run_script("clients/file.py", str(path), "--url", url, "--format", "jsonl")
    assert run.returncode == 0, run.stderr
    assert [f.segment for f in finals_of(run.stdout)] == [0]


async def test_wrong_token(serve_test_server):
    async with serve_test_server(token="sesame") as url:
        run = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast", "--token", "wrong")
        assert_one_line_error(run, "401")
        run = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast")  # none: refused at start
        assert_one_line_error(run, "unauthorized")
        ok = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast", "--token", "sesame")
        assert ok.returncode == 0, ok.stderr


async def test_server_error_is_one_line(serve_test_server):
    async with serve_test_server() as url:  # a language the model does not know: `error` bad_start
        run = await run_script("clients/file.py", FIXTURE, "--url", url, "--fast", "--language", "klingon")
    assert_one_line_error(run, "bad_start", "klingon")


async def test_full_server_is_one_line(serve_test_server):
    """A full server refuses right after the handshake, often before the client's `start` is out: the
    refusal (`overloaded`) must still be what the user sees, never a traceback of the failed send."""
    async with serve_test_server(max_sessions=1) as url:
        async with connect(url):
            runs = await asyncio.gather(*(run_script("clients/file.py", FIXTURE, "--url", url, "--fast")
                                          for _ in range(4)))
    for run in runs:
        assert_one_line_error(run, "overloaded")


async def test_url_without_path_means_the_stream_endpoint(serve_test_server):
    async with serve_test_server() as url:
        bare = await run_script("clients/file.py", FIXTURE, "--url", f"127.0.0.1:{url.port}", "--fast")
        assert bare.returncode == 0 and bare.stdout, bare
        wrong = await run_script("clients/file.py", FIXTURE, "--url", f"ws://127.0.0.1:{url.port}/stream", "--fast")
    assert_one_line_error(wrong, "404", "use /v1/stream")


async def test_closed_stdout_ends_quietly_with_141(serve_test_server, speech, tmp_path):
    """`file.py ... | head -n 1`: head exits after the first cue's first line; the next final's write finds
    the pipe closed. The client ends quietly, as Unix tools do (141 = 128 + SIGPIPE)."""
    clip = tmp_path / "two.wav"  # two utterances, sent at real-time pace: the second final comes later
    soundfile.write(clip, speech.audio[:int((speech.utterances[1]["end"] + 0.8) * SAMPLE_RATE)], SAMPLE_RATE)
    async with serve_test_server() as url:
        shell = (f'"{sys.executable}" clients/file.py "{clip}" --url {url} --format srt | head -n 1; '
                 'echo "statuses ${PIPESTATUS[*]}"')
        proc = await asyncio.create_subprocess_exec("bash", "-c", shell, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert out.decode().splitlines() == ["1", "statuses 141 0"], (out, err)
    assert err.decode() == ""  # no "error: ... BrokenPipeError", no "Exception ignored"


async def test_unreachable_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = await run_script("clients/file.py", FIXTURE, "--url", f"ws://127.0.0.1:{port}/v1/stream")
    assert_one_line_error(run, "cannot connect", str(port))


@pytest.mark.parametrize("name, content, says", [
    ("missing.wav", None, "no such file"),
    ("noise.wav", b"this is not audio at all\n" * 10, "cannot read audio"),
    ("empty.wav", "EMPTY", "no audio"),
    ("zero.wav", b"", "cannot read audio"),
    ("one_hz.wav", "1 HZ", "sample rate is 1 Hz"),  # 64 KB that resampled to 16 kHz would be 2 GB
])
async def test_bad_input_file(tmp_path, name: str, content: bytes | str | None, says: str):
    path = tmp_path / name
    if content == "EMPTY":
        soundfile.write(path, np.zeros(0, np.float32), SAMPLE_RATE)  # a valid WAV with no samples
    elif content == "1 HZ":
        soundfile.write(path, np.zeros(32000, np.int16), 1)
    elif content is not None:
        path.write_bytes(content)
    # The URL is never dialled: the file is checked first.
    run = await run_script("clients/file.py", str(path), "--url", "ws://127.0.0.1:9/v1/stream")
    assert_one_line_error(run, says)

