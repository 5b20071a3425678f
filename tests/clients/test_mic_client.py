"""clients/mic.py: its streaming loop fed from a capture thread (as sounddevice's callback does), Ctrl-C
semantics (stop -> last final), and its one-line errors."""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import threading
import time

import numpy as np
import pytest
import soxr
from client_testkit import assert_one_line_error, knows_words, normalise, run_script

from clients.file import EXIT_OK, ResultWriter
from clients.mic import stream_capture
from pipeline.audio import SAMPLE_RATE
from server.protocol import Final, parse_server_message

HAVE_SOUNDDEVICE = importlib.util.find_spec("sounddevice") is not None
DEVICE_RATE = 44100  # a typical sound card


def thread_capture(audio: np.ndarray, rate: int, finished: threading.Event):
    """A StartCapture that plays int16 `audio` from its own thread in 100 ms blocks, like a sound card
    callback (faster than real time, with a short sleep so the loop interleaves), then sets `finished`."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    block = rate // 10

    def start(on_audio):
        halt = threading.Event()

        def play() -> None:
            for i in range(0, len(pcm), block):
                if halt.is_set():
                    return
                on_audio(pcm[i:i + block].tobytes())
                time.sleep(0.002)
            finished.set()

        thread = threading.Thread(target=play, daemon=True)
        thread.start()
        return lambda: (halt.set(), thread.join())

    return start


async def test_stream_capture_until_stopped_prints_the_last_final(serve_test_server, speech, test_model_dir):
    audio = soxr.resample(speech.audio, SAMPLE_RATE, DEVICE_RATE).astype(np.float32)
    finished = threading.Event()
    stopping = asyncio.Event()
    out = io.StringIO()
    args = argparse.Namespace(url=None, token=None, language="auto", itn=False, hotword=[])

    async def press_ctrl_c_when_played() -> None:  # what mic.py's SIGINT handler does
        await asyncio.to_thread(finished.wait)
        stopping.set()

    async with serve_test_server(partial_interval=0.3) as url:
        args.url = f"127.0.0.1:{url.port}"  # a bare host:port, as people type it
        presser = asyncio.create_task(press_ctrl_c_when_played())
        status = await stream_capture(thread_capture(audio, DEVICE_RATE, finished), DEVICE_RATE, args,
                                      ResultWriter("jsonl", out, live=False), stopping)
        await presser
    assert status == EXIT_OK
    finals = [parse_server_message(line) for line in out.getvalue().splitlines()]
    assert all(isinstance(f, Final) for f in finals)
    # The last utterance ends 0.7 s before the audio does: its final arrives only after the stop.
    assert [f.segment for f in finals] == list(range(len(speech.utterances)))
    if knows_words(test_model_dir):
        assert [normalise(f.text) for f in finals] == [normalise(u["text"]) for u in speech.utterances]


def test_live_text_overwrites_one_line() -> None:
    from server.protocol import Partial

    out = io.StringIO()
    writer = ResultWriter("text", out, live=True)
    writer.partial(Partial(segment=0, text="hello", start=0.5, end=1.0))
    writer.partial(Partial(segment=0, text="hello wor", start=0.5, end=1.2))
    writer.final(Final(segment=0, text="hello world", start=0.5, end=1.4))
    writer.close()
    shown = out.getvalue()
    assert shown.count("\r\033[K") == 3 and shown.endswith("[00:00:00.500 --> 00:00:01.400] hello world\n")


@pytest.mark.skipif(HAVE_SOUNDDEVICE, reason="sounddevice is installed here")
async def test_missing_sounddevice_is_one_line():
    for args in (("clients/mic.py",), ("-m", "clients.mic", "--list-devices")):
        assert_one_line_error(await run_script(*args), "pip install sounddevice")


@pytest.mark.skipif(not HAVE_SOUNDDEVICE, reason="sounddevice is not installed")
async def test_device_that_does_not_exist_is_one_line():
    run = await run_script("clients/mic.py", "--device", "no such microphone anywhere")
    assert_one_line_error(run)
