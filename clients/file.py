"""Transcribe an audio file through a running Unipad server.

    python clients/file.py talk.flac                          # live text, real-time pace
    python -m clients.file talk.wav --fast --format srt --output talk.srt
    python clients/file.py call.ogg --url wss://asr.example.org/v1/stream --token SECRET --format jsonl

Reads anything soundfile reads (WAV, FLAC, OGG/Vorbis, MP3 with libsndfile >= 1.1). Multichannel audio
is downmixed here; the file's own rate is sent as is when the server accepts it (8-48 kHz), else
resampled to 16 kHz first (a file under 4 kHz is refused: no speech fits there). Formats: `text` (one
line per final with its times; partials overwrite one terminal line when stdout is a TTY), `jsonl` (the
protocol's final messages, one per line), `srt`, `vtt`.
Exit status: 0 on success, 1 on any error (one line on stderr), 2 on bad arguments, 130 on Ctrl-C, 141
without a word when the output is closed early (`| head`), the status a shell reports for a Unix tool that
SIGPIPE ended. `--url` may be a bare host:port (the stream endpoint there).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import IO

if __package__ in (None, ""):  # run as `python clients/file.py`: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import soundfile
import soxr

from clients.client import DEFAULT_URL, ClientError, connect
from clients.options import add_hotword_option
from pipeline.audio import MAX_INPUT_RATE, MIN_FILE_RATE, MIN_INPUT_RATE, SAMPLE_RATE
from pipeline.subtitles import VTT_HEADER, cues_for_final, format_timestamp, srt_cue, vtt_cue
from server.protocol import Final, Partial, encode

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # argparse's own status
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE: what `yes | head` reports for yes, so pipefail scripts read it alike
FORMATS = ("text", "jsonl", "srt", "vtt")
CHUNK_SECONDS = 0.1  # one binary frame per 100 ms of audio


class InputError(Exception):
    """The input file cannot be used."""


def read_audio(path: str) -> tuple[np.ndarray, int]:
    """Read a file as float32 mono, shape (samples,), at a rate the server accepts. Returns (audio, rate)."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory")
    try:
        with soundfile.SoundFile(path) as file:
            rate = file.samplerate
            if rate < MIN_FILE_RATE:  # before reading: resampled to 16 kHz it would be that many times longer
                raise InputError(f"{path}: its sample rate is {rate} Hz; below {MIN_FILE_RATE} Hz no speech fits")
            audio = file.read(dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError, OSError) as exc:
        raise InputError(f"{path}: cannot read audio ({' '.join(str(exc).split())})") from None
    if audio.shape[0] == 0:
        raise InputError(f"{path}: the file holds no audio")
    mono = audio.mean(axis=1, dtype=np.float32) if audio.shape[1] > 1 else audio[:, 0]
    if not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        mono, rate = soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32), SAMPLE_RATE
    return np.ascontiguousarray(mono), int(rate)


class ResultWriter:
    """Writes finals in one of FORMATS to `out`; shows partials on one overwritten line when `live`."""

    def __init__(self, fmt: str, out: IO[str], live: bool) -> None:
        self.fmt, self.out, self.live = fmt, out, live and fmt == "text"
        self.cues = 0
        self._partial_shown = False
        if fmt == "vtt":
            out.write(VTT_HEADER)
            out.flush()

    def partial(self, partial: Partial) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size((80, 24)).columns - 1
        text = " ".join(partial.text.split())
        line = f"{format_timestamp(partial.start, '.')}  {text}"
        if len(line) > width:
            line = "…" + line[-(width - 1):]  # keep the newest words in view
        self.out.write("\r\033[K" + line)
        self.out.flush()
        self._partial_shown = True

    def final(self, final: Final) -> None:
        self._clear_partial()
        if self.fmt == "jsonl":
            self.out.write(encode(final) + "\n")
        elif self.fmt == "text":
            text = " ".join(final.text.split())
            if text:
                start, end = format_timestamp(final.start, "."), format_timestamp(final.end, ".")
                self.out.write(f"[{start} --> {end}] {text}\n")
        else:
            for cue in cues_for_final(final):
                self.cues += 1
                self.out.write(srt_cue(self.cues, cue) if self.fmt == "srt" else vtt_cue(cue))
        self.out.flush()

    def close(self) -> None:
        self._clear_partial()
        self.out.flush()

    def _clear_partial(self) -> None:
        if self._partial_shown:
            self.out.write("\r\033[K")
            self._partial_shown = False


def output_closed(exc: BaseException) -> bool:
    """Whether `exc` is a write to a closed pipe (`... | head`), also when a result callback hit it."""
    return isinstance(exc, BrokenPipeError) or isinstance(exc.__cause__, BrokenPipeError)


def quit_quietly() -> int:
    """End on a closed stdout as Unix tools do: no message, EXIT_OUTPUT_CLOSED. stdout now points at devnull
    (Python's advice for SIGPIPE), so the interpreter's own flush at exit finds nothing to complain about."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OUTPUT_CLOSED


async def transcribe_file(audio: np.ndarray, rate: int, args: argparse.Namespace, writer: ResultWriter) -> int:
    """Stream `audio` (float32 mono at `rate` Hz) and write the results. Returns the exit status."""
    loop = asyncio.get_running_loop()
    chunk = max(1, int(rate * CHUNK_SECONDS))
    async with connect(args.url, token=args.token, sample_rate=rate, format="s16le", language=args.language,
                       itn=args.itn, hotwords=args.hotword, partials=writer.live, on_partial=writer.partial,
                       on_final=writer.final) as stream:
        began = loop.time()
        for offset in range(0, len(audio), chunk):
            await stream.send(audio[offset:offset + chunk])
            if not args.fast:  # real time: sleep until the wall clock catches up with the audio sent
                await asyncio.sleep(max(0.0, began + (offset + chunk) / rate - loop.time()))
        await stream.stop()
    for error in stream.errors:  # segment-level errors: the transcript has a hole
        print(f"error: segment {error.segment}: {error}", file=sys.stderr)
    return EXIT_ERROR if stream.errors else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clients.file", description="Transcribe an audio file "
                                     "through a running Unipad server.")
    parser.add_argument("file", help="audio file (anything soundfile reads)")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"stream endpoint; host:port is enough (default {DEFAULT_URL})")
    parser.add_argument("--token", default=os.environ.get("UNIPAD_TOKEN"),
                        help="access token (default $UNIPAD_TOKEN)")
    parser.add_argument("--language", default="auto", help="auto, en, zh, yue, ja, ko (default auto)")
    parser.add_argument("--itn", action="store_true", help="inverse text normalisation (numbers, punctuation)")
    add_hotword_option(parser)
    parser.add_argument("--fast", action="store_true", help="send as fast as possible, not at real-time pace")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    parser.add_argument("--output", "-o", help="write here instead of stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out: IO[str] = sys.stdout
    try:
        audio, rate = read_audio(args.file)
        if args.output:
            out = open(args.output, "w", encoding="utf-8", newline="\n")
        writer = ResultWriter(args.format, out, live=out is sys.stdout and sys.stdout.isatty())
        try:
            status = asyncio.run(transcribe_file(audio, rate, args, writer))
        finally:
            writer.close()
        return status
    except (InputError, ClientError, OSError) as exc:
        if output_closed(exc):
            return quit_quietly()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if out is not sys.stdout:
            out.close()


if __name__ == "__main__":
    sys.exit(main())
