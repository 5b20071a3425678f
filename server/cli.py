"""`unipad` / `python -m server`: flags map one to one onto ServerConfig."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from pathlib import Path

from pipeline.batching import parse_batch_sizes
from pipeline.catalog import resolve_model
from pipeline.errors import UnipadError
from pipeline.families import family_for, read_model_hotwords
from pipeline.modeldir import read_model_directory
from pipeline.shapes import parse_containers
from pipeline.vad import VADS

from .config import (DEFAULT_MODEL_DIR, LOG_FORMATS, LOG_LEVELS, TOKEN_ENV, ServerConfig, config_from_env, split_list,
                     validate_config)
from .logs import configure_logging
from .punctuation_model import DEFAULT_PUNCTUATION, chosen_punctuation, read_punctuation_model

EXIT_USAGE = 2
MAX_OPEN_FILES = 1 << 20  # the soft limit raise_open_file_limit asks for at most (Linux's nr_open default)

_DEFAULTS = ServerConfig()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already states its default, or the
    default is None or empty (its help then says what happens without the option)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "(default:" in (action.help or "") or action.default in (None, ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    d = _DEFAULTS
    p = argparse.ArgumentParser(prog="unipad", description="Unipad ASR: real-time speech recognition server "
                                "(`unipad models` lists the models pulled into the cache)",
                                formatter_class=_HelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR,
                   help="model directory, or a name pulled with `python -m export pull NAME` (e.g. sensevoice-small)")
    p.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=d.port, help="TCP port for WebSocket and HTTP (0: any free port)")
    p.add_argument("--device", default=None, help="auto, cpu, cuda or directml (default: $INFERENCE_DEVICE, else auto)")
    p.add_argument("--precision", default=d.precision, help="auto, fp32, int8 or fp16")
    p.add_argument("--containers", type=_containers, default=None,
                   help="container lengths in seconds, e.g. 1,2,4,8,15,30 (default: that ladder on CPU, 30 on GPUs; "
                        "a Paraformer on the CPU runs each segment at its own length unless this is given)")
    p.add_argument("--threads", type=int, default=d.threads, help="ONNX Runtime threads (0: one per core)")
    p.add_argument("--cpu-spin-us", type=int, default=d.cpu_spin_us,
                   help="CPU: let idle ONNX Runtime threads spin this many microseconds within a run before they "
                        "sleep (faster on cores of its own, slower on busy shared ones; 0: never)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None,
                   help="rows per model run, e.g. 1,4,16 (default: that on GPUs, 1 on CPU; int8 always 1)")
    p.add_argument("--cost-table", type=Path, default=None,
                   help="`python -m bench model --save` output: measured seconds per (batch, container), from which "
                        "the worker plans its batches (default: modelled as rows x container seconds); with "
                        "--measure-costs, where the measured table is written")
    p.add_argument("--measure-costs", action="store_true",
                   help="time every (batch, container) shape after the warm-up and plan batches from that (GPUs: "
                        "a few seconds more to start)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA: capture each session's graph once and replay it (default: on for SenseVoice, 8-11 ms "
                        "a call at batch 1 instead of 19-22 on an H100; off for Paraformer and Qwen3-ASR)")
    p.add_argument("--allow-tf32", action="store_true", help="CUDA: TF32 matmuls for fp32 (faster, not exact)")
    p.add_argument("--share-weights", action=argparse.BooleanOptionalAction, default=d.share_weights,
                   help="CPU: the sessions share one copy of the weights; --no-share-weights: a copy each "
                        "(more memory; SenseVoice's ladder runs 10-15%% faster, docs/benchmarks.md)")
    p.add_argument("--vad", choices=VADS, default=d.vad,
                   help="the frame VAD: webrtc (webrtcvad) or silero (Silero VAD on ONNX Runtime, steadier in room "
                        f"noise: docs/history.md) (default {d.vad})")
    p.add_argument("--vad-aggressiveness", type=int, default=d.vad_aggressiveness, help="webrtcvad mode 0-3")
    p.add_argument("--vad-threshold", type=float, default=d.vad_threshold,
                   help=f"silero: the speech probability of a voiced frame, above 0, at most 1 (default {d.vad_threshold})")
    p.add_argument("--end-silence", type=float, default=d.end_silence, help="seconds of silence that end a segment")
    p.add_argument("--pre-roll", type=float, default=d.pre_roll, help="seconds kept before speech starts")
    p.add_argument("--partial-interval", type=float, default=d.partial_interval,
                   help="seconds of new speech between partial results (0: no partials)")
    p.add_argument("--partial-window", type=float, default=d.partial_window,
                   help="partials decode at most this many seconds of the segment's end")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="concurrent streams (more: close 1013)")
    p.add_argument("--max-message-bytes", type=int, default=d.max_message_bytes,
                   help="largest WebSocket message (larger: close 1009)")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout, help="close streams silent this long (s)")
    p.add_argument("--send-timeout", type=float, default=d.send_timeout,
                   help="cut off a client that does not accept a message for this long (s)")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout,
                   help="on shutdown, seconds open streams get to receive their finals")
    p.add_argument("--token", default=None, help=f"require this token from clients (default: ${TOKEN_ENV})")
    p.add_argument("--auth-max-failures", type=int, default=d.auth_max_failures,
                   help="failed token checks from one address before it is refused for --auth-cooldown")
    p.add_argument("--auth-cooldown", type=float, default=d.auth_cooldown,
                   help="seconds an address stays refused (HTTP 429) after too many failed token checks")
    p.add_argument("--allowed-origins", default="", help="comma-separated browser origins allowed (default: any)")
    p.add_argument("--forwarded-allow-ips", default="",
                   help="comma-separated proxy addresses or networks whose X-Forwarded-For names the client, "
                        "for per-address limits and logs (default: $UNIPAD_FORWARDED_ALLOW_IPS, else none)")
    p.add_argument("--certfile", type=Path, default=None, help="TLS certificate (PEM): serve wss:// and https://")
    p.add_argument("--keyfile", type=Path, default=None, help="TLS private key (PEM)")
    p.add_argument("--funasr-port", type=int, default=None,
                   help="also speak the FunASR runtime protocol on this port (default: off)")
    p.add_argument("--wyoming-port", type=int, default=None,
                   help="also speak Home Assistant's Wyoming protocol on this port, e.g. 10300 (default: off)")
    p.add_argument("--wyoming-host", default=d.wyoming_host,
                   help="address of the Wyoming port; it has no authentication, so only a trusted network's")
    p.add_argument("--fetch-urls", action="store_true",
                   help="POST /v1/listen (Deepgram) may fetch audio from a JSON body's url (only where clients are trusted)")
    p.add_argument("--join-uploads", action=argparse.BooleanOptionalAction, default=d.join_uploads,
                   help="an upload sent as long after the same client's previous one as it lasts (a client's VAD cut "
                        "both from one live stream, as pipecat's OpenAISTTService does) is heard after the end of it")
    p.add_argument("--hotwords", type=Path, default=None,
                   help="file of hotwords for every stream, one a line, optionally TAB and a boost (default: none)")
    p.add_argument("--punc", metavar="NAME_OR_DIR", default=None,
                   help="punctuate finals with this punctuation model: a name pulled with `python -m export pull NAME` "
                        f"(e.g. {DEFAULT_PUNCTUATION}) or a model directory (default: {DEFAULT_PUNCTUATION} when the "
                        "model is a Chinese Paraformer and ct-punc is pulled, else none)")
    p.add_argument("--no-punc", action="store_true", help="no punctuation model, whatever the default")
    p.add_argument("--log-level", default=d.log_level, choices=LOG_LEVELS, help="log verbosity")
    p.add_argument("--log-format", default=d.log_format, choices=LOG_FORMATS,
                   help="text, or json: one object per line (time, level, logger, message, fields)")
    return p


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_batch_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _containers(text: str) -> tuple[float, ...]:
    try:
        return parse_containers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    values["allowed_origins"] = split_list(args.allowed_origins)
    values["forwarded_allow_ips"] = split_list(args.forwarded_allow_ips)
    values["model"] = resolve_model(args.model)  # a catalogue name -> its directory in the cache
    # --punc's name -> its directory, --no-punc, or the default for the model (server/punctuation_model.py)
    values["punc"] = chosen_punctuation(args.punc, args.no_punc, read_model_directory(values["model"]))
    return validate_config(config_from_env(ServerConfig(**values)))


def raise_open_file_limit() -> None:
    """Every connection holds a file descriptor, and many Linux boxes give a process 1024 (the soft limit)
    under a far higher hard one: a thousand idle or handshaking sockets then stop the server accepting
    anyone (EMFILE) until they time out. Take the hard limit, as nginx's worker_rlimit_nofile is used to.
    Not on Windows (no such limit)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:  # macOS caps it below an infinite hard limit
        logging.getLogger(__name__).info("open files: kept the limit of %d (%s)", soft, exc)
        return
    logging.getLogger(__name__).info("open files: limit raised from %d to %d", soft, wanted)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["models"]:  # `unipad models`: what is in the model cache
        from .models_command import main as models_main

        return models_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        model = read_model_directory(config.model)  # fail here, in one line, rather than after binding the port
        family_for(model)  # a family serves it (an old single-graph Paraformer export: re-export it)
        if config.hotwords:
            read_model_hotwords(config.hotwords, model)
        if config.punc is not None:
            read_punctuation_model(config.punc, model)
    except (ValueError, UnipadError) as exc:
        print(f"unipad: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(config.log_level, config.log_format)
    raise_open_file_limit()
    from .server import Server  # after the checks: --help and bad flags stay instant

    try:
        server = Server(config)
        code = asyncio.run(server.serve())
    except OSError as exc:  # e.g. the port is taken
        if config.log_format == "json":  # every stderr line stays one JSON object for the log collector
            logging.getLogger(__name__).error("unipad: error: %s", exc)
        else:
            print(f"unipad: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if server.worker is not None and server.worker.running:
        # Stopped while ONNX Runtime still loads on the worker thread: the interpreter's normal exit would
        # destroy ONNX Runtime under that thread and abort ("terminate called without an active exception").
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
