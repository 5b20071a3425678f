"""`python -m export {pull,sensevoice,paraformer,ct-punc,qwen3-asr,verify,reexport,add-decoding,train-demo,eval,eval-hotwords} ...`"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from pipeline.errors import UnipadError

COMMANDS = {
    "pull": (".pull", "download a model by name (e.g. sensevoice-small), export, verify and cache it"),
    "sensevoice": (".sensevoice", "export SenseVoiceSmall (released checkpoint or random weights) to a model directory"),
    "paraformer": (".paraformer", "export Paraformer-large / paraformer-zh (released checkpoint or random weights) to a model directory"),
    "ct-punc": (".ct_punc", "export FunASR's CT-Transformer punctuation model (released ct-punc or random weights)"),
    "qwen3-asr": (".qwen3_asr", "export Qwen3-ASR (0.6B / 1.7B geometry, random weights) as encoder, prefill and step graphs"),
    "verify": (".verify", "check padding invariance, operators and static shapes of a model directory"),
    "reexport": (".reexport", "export a SenseVoice model directory again with today's exporter, its weights read from its fp32 graph"),
    "add-decoding": (".decoding_outputs", "add in-graph greedy and top-k outputs to an existing model directory"),
    "train-demo": (".train_demo", "train and export the shipped demo model on synthetic speech"),
    "eval": (".evaluate", "WER and sentence accuracy of a model directory on a held-out set"),
    "eval-hotwords": (".hotword_eval", "WER and hotword recall with and without hotwords; beam search time"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="unipad-export" if __package__ != "export" else "python -m export", description="Export, verify, train and evaluate models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the command that runs: --help stays instant
            module = importlib.import_module(module_name, __package__)
            module.add_arguments(command)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    above = __package__.rpartition(".")[0]  # "unipad_asr" in an installed copy (unipad_asr/__init__.py)
    for name in ("export", "models", "pipeline"):
        logging.getLogger(f"{above}.{name}" if above else name).setLevel(logging.INFO)
    try:
        return module.run(args)
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is not installed (pip install -e '.[export]')", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError, UnipadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (ONNX Runtime's errors have no common base)
        if os.environ.get("UNIPAD_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {exc} (set UNIPAD_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
