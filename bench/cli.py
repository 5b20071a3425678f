"""The benchmark CLI: `python -m bench model|paraformer|qwen3|load|failover|train|silence|vad|frameworks|report|fsmn|streamcost|lease`. Exit codes: 0 ok, 1 failed or target
missed where a command says so, 2 bad usage."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = {
    "model": (".model", "time one inference per container and per shape policy (and the peer)"),
    "paraformer": (".paraformer", "one Paraformer inference (the serving path), ours against FunASR's export"),
    "qwen3": (".qwen3", "CPU seconds of a Qwen3-ASR directory: encoder, prefill, per token, a whole utterance"),
    "load": (".load", "N concurrent real-time streams against a server: latency and capacity"),
    "failover": (".failover", "resumable streams through HAProxy while one server drains and one is killed"),
    "train": (".train", "seconds per training step of the demo model, fp32 against bf16"),
    "silence": (".silence", "WER per door (upload, stream, Realtime) and per second of silence before speech"),
    "vad": (".vad", "where segments start in pink, brown and room noise, per frame VAD (webrtc modes, Silero)"),
    "frameworks": (".frameworks", "WER per door with pipecat's and LiveKit's own clients beside upload and Realtime"),
    "report": (".report", "write docs/benchmarks.md sections and the latency plot from saved results"),
    "fsmn": (".fsmn", "first-run and steady seconds of the FSMN memory block written four ways (conv2d, conv1d, taps, gather)"),
    "streamcost": (".streamcost", "CPU per stream-second of the sans-I/O pipeline a stream costs the event loop"),
    "lease": (".lease", "the summary table of a GPU lease's logs and results (bench/gpu_check.sh lease)"),
}
EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description="Unipad ASR benchmarks.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log the engine's progress (each session's creation and warm-up, with its time)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)  # the command, after -v
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the command that runs
            module = importlib.import_module(module_name, __package__)
            module.add_arguments(command)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("pipeline").setLevel(logging.INFO)
    from pipeline.errors import UnipadError

    try:
        return module.run(args)
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is not installed (pip install -e '.[bench,export]')", file=sys.stderr)
        return EXIT_FAILED
    except (UnipadError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
