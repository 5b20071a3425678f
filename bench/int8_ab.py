"""Two exports of one model, timed on the same clips in one run: an int8 recipe's speed against another's.

    python -m bench.int8_ab BEFORE_DIR AFTER_DIR [--precision int8] [--lengths 1,2,5,10,20,29]

Each directory is loaded by the engine as the server loads it (pipeline/engine.py, CPU, --threads
intra-op threads; with --token-containers a short ladder, so that loading a released-size Paraformer does
not warm hundreds of decoder shapes twice). Every repeat runs both on the same speech clip, the one going
first alternating, so the machine's load touches both alike; `ratio` is after / before of the median wall
seconds, `ratio_cpu` of the process's CPU seconds. The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeline.batching import Clip
from pipeline.engine import Engine, EngineOptions

from .common import command_line, emit, machine, say, speech_audio, summary
from .paraformer import interleaved, timed

DEFAULT_LENGTHS = (1.0, 2.0, 5.0, 10.0, 20.0, 29.0)


def token_count(output, blank_id: int) -> int:
    """Tokens of one clip's answer: a Paraformer's, or the CTC path's (repeats merged, blanks dropped)."""
    if hasattr(output, "token_ids"):
        return len(output.token_ids)
    ids = output.best_ids
    return int(((ids != blank_id) & np.r_[True, ids[1:] != ids[:-1]]).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.int8_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--lengths", default=",".join(f"{x:g}" for x in DEFAULT_LENGTHS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--token-containers", default="64,160,320,501",
                        help="a Paraformer decoder's token containers (empty: the CPU's default ladder)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args(argv)
    tokens = tuple(int(k) for k in args.token_containers.split(",") if k.strip()) or None
    options = EngineOptions(device="cpu", precision=args.precision, threads=args.threads, token_containers=tokens)
    engines = [Engine(path, options).load() for path in (args.before, args.after)]
    result = {"machine": machine(), "command": command_line(), "before": str(args.before), "after": str(args.after),
              "precision": args.precision, "load_seconds": [round(e.stats.load_seconds, 2) for e in engines],
              "before_s": {}, "after_s": {}, "ratio": {}, "ratio_cpu": {}, "tokens": {}}
    for seconds in (float(s) for s in args.lengths.split(",")):
        audio, key = speech_audio(seconds), f"{seconds:g}"
        before, after = interleaved(*(lambda e=e: timed(lambda: e.infer([Clip(audio)])) for e in engines), args.warmup,
                                    args.repeats)
        walls = [summary([wall for wall, _ in runs])["median"] for runs in (before, after)]
        cpus = [summary([cpu for _, cpu in runs])["median"] for runs in (before, after)]
        result["before_s"][key], result["after_s"][key] = walls
        result["ratio"][key], result["ratio_cpu"][key] = round(walls[1] / walls[0], 3), round(cpus[1] / cpus[0], 3)
        result["tokens"][key] = [token_count(e.infer([Clip(audio)])[0], e.model.manifest.blank_id) for e in engines]
        say(f"{key} s: before {walls[0]:.3f} s, after {walls[1]:.3f} s, ratio {result['ratio'][key]} "
            f"(CPU seconds {result['ratio_cpu'][key]}); tokens {result['tokens'][key]}")
    emit(result, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
