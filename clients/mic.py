"""Live transcription from a microphone through a running Unipad server.

    pip install sounddevice                      # plus PortAudio: apt install libportaudio2 on Debian/Ubuntu
    python clients/mic.py --list-devices
    python clients/mic.py --device 3 --url ws://127.0.0.1:8765/v1/stream

Captures mono int16 at the device's default rate (the server resamples), sends ~100 ms frames, shows the
partial on one overwritten line and prints each final with its times. Ctrl-C stops the capture, waits
for the last final and exits 0; a second Ctrl-C quits at once. Errors: one line on stderr, exit 1; a
closed stdout (`| head`) ends it quietly with 141, like clients/file.py.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

if __package__ in (None, ""):  # run as `python clients/mic.py`: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.client import DEFAULT_URL, ClientError, connect
from clients.options import add_hotword_option
from clients.file import CHUNK_SECONDS, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, ResultWriter, output_closed, quit_quietly
from pipeline.audio import MAX_INPUT_RATE, MIN_INPUT_RATE, SAMPLE_RATE

OnAudio = Callable[[bytes], None]
# start_capture(on_audio) starts calling on_audio(pcm) from its own thread and returns a function that stops it.
StartCapture = Callable[[OnAudio], Callable[[], None]]


class MicError(Exception):
    """The microphone (or the sounddevice/PortAudio stack under it) cannot be used."""


def import_sounddevice() -> ModuleType:
    try:
        import sounddevice
    except ImportError:
        raise MicError("the microphone client needs sounddevice: pip install sounddevice") from None
    except OSError as exc:  # sounddevice is there but the PortAudio library is not
        raise MicError(f"sounddevice cannot load PortAudio ({exc}); on Debian/Ubuntu: apt install libportaudio2") from None
    return sounddevice


def parse_device(device: str | None) -> int | str | None:
    """A device index ('3') or a part of its name ('USB')."""
    return int(device) if device is not None and device.isdigit() else device


def capture_rate(sd: ModuleType, device: int | str | None) -> int:
    """The device's default input rate, kept inside what the server accepts."""
    try:
        info: Any = sd.query_devices(device, "input")
    except (ValueError, sd.PortAudioError) as exc:
        raise MicError(f"no usable input device {device if device is not None else '(default)'}: {exc}") from None
    rate = int(info["default_samplerate"])
    return rate if MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE else (MAX_INPUT_RATE if rate > MAX_INPUT_RATE else SAMPLE_RATE)


def sounddevice_capture(sd: ModuleType, device: int | str | None, rate: int) -> StartCapture:
    """A StartCapture that records mono s16le from `device` in CHUNK_SECONDS blocks."""

    def start(on_audio: OnAudio) -> Callable[[], None]:
        def callback(indata: Any, frames: int, time: Any, status: Any) -> None:
            on_audio(bytes(indata))  # runs on PortAudio's thread; input overflows just lose audio

        try:
            stream = sd.RawInputStream(samplerate=rate, blocksize=int(rate * CHUNK_SECONDS), device=device,
                                       channels=1, dtype="int16", callback=callback)
            stream.start()
        except (ValueError, sd.PortAudioError) as exc:
            raise MicError(f"cannot open the microphone: {' '.join(str(exc).split())}") from None

        def stop() -> None:
            stream.stop()
            stream.close()

        return stop

    return start


async def stream_capture(start_capture: StartCapture, rate: int, args: argparse.Namespace,
                         writer: ResultWriter, stopping: asyncio.Event) -> int:
    """Stream s16le mono audio at `rate` Hz from `start_capture` until `stopping` is set; write results."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def on_audio(pcm: bytes) -> None:  # any thread
        loop.call_soon_threadsafe(queue.put_nowait, pcm)

    # resume=True: a server's restart or failure does not end the session
    async with connect(args.url, token=args.token, sample_rate=rate, format="s16le", language=args.language,
                       itn=args.itn, hotwords=args.hotword, partials=True, on_partial=writer.partial,
                       on_final=writer.final, resume=True) as stream:
        stop_capture = start_capture(on_audio)
        stopper = asyncio.create_task(stopping.wait())
        stopper.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (pcm := await queue.get()) is not None:
                await stream.send(pcm)
        finally:
            stop_capture()
            stopper.cancel()
        while not queue.empty():  # what the device delivered before it stopped
            if (pcm := queue.get_nowait()) is not None:
                await stream.send(pcm)
        await stream.stop()
    return EXIT_OK


async def _run(start_capture: StartCapture, rate: int, args: argparse.Namespace, writer: ResultWriter) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt  # the second Ctrl-C: quit now
        loop.call_soon_threadsafe(stopping.set)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        return await stream_capture(start_capture, rate, args, writer, stopping)
    finally:
        signal.signal(signal.SIGINT, previous)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clients.mic", description="Live transcription from a "
                                     "microphone through a running Unipad server.")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"stream endpoint; host:port is enough (default {DEFAULT_URL})")
    parser.add_argument("--token", default=os.environ.get("UNIPAD_TOKEN"), help="access token (default $UNIPAD_TOKEN)")
    parser.add_argument("--device", help="input device: index or part of the name (see --list-devices)")
    parser.add_argument("--list-devices", action="store_true", help="list the audio devices and exit")
    parser.add_argument("--language", default="auto", help="auto, en, zh, yue, ja, ko (default auto)")
    parser.add_argument("--itn", action="store_true", help="inverse text normalisation (numbers, punctuation)")
    add_hotword_option(parser)
    parser.add_argument("--format", choices=("text", "jsonl"), default="text", help="output format (default text)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sd = import_sounddevice()
        if args.list_devices:
            print(sd.query_devices())
            return EXIT_OK
        device = parse_device(args.device)
        rate = capture_rate(sd, device)
        writer = ResultWriter(args.format, sys.stdout, live=sys.stdout.isatty())
        print(f"listening at {rate} Hz; Ctrl-C to stop", file=sys.stderr)
        try:
            return asyncio.run(_run(sounddevice_capture(sd, device, rate), rate, args, writer))
        finally:
            writer.close()
    except (MicError, ClientError, OSError) as exc:
        if output_closed(exc):  # `python clients/mic.py | head`
            return quit_quietly()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
