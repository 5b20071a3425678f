"""The Paraformer peer as its users run it: `funasr_onnx.Paraformer` (FunASR's ONNX runtime package) on a
directory from bench/make_paraformer_peer.py, in a Python that has funasr_onnx (it is not ours to install).

    /opt/funasr-onnx-venv/bin/python bench/funasr_onnx_peer.py PEER_DIR --precision int8 [--threads 2]

Everything is funasr_onnx's own: its WavFrontend (kaldi-native-fbank, LFR, CMVN in numpy), its
OrtInferSession (its session options: spinning left on, no memory arena, ORT_ENABLE_ALL), one run at the
clip's exact length, its argmax decoding and text post-processing; int8 is `quantize=True`
(model_quant.onnx, FunASR's own recipe). `--threads` is the intra_op_num_threads a user passes to
Paraformer() (its default, 4, when left out).

It reads one line per call on stdin, the path of a float32 .npy clip at 16 kHz, and answers one JSON line:
{"wall": s, "cpu": s, "tokens": n}, wall and process CPU seconds of the Paraformer call alone. The first
line it writes is {"ready": load seconds}. This file imports nothing of ours: bench/paraformer.py runs it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("peer", help="directory from bench/make_paraformer_peer.py")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="int8")
    parser.add_argument("--threads", type=int, default=None, help="intra_op_num_threads (default: funasr_onnx's)")
    args = parser.parse_args(argv)
    from funasr_onnx import Paraformer

    began = time.perf_counter()
    options = {} if args.threads is None else {"intra_op_num_threads": args.threads}
    model = Paraformer(args.peer, quantize=args.precision == "int8", **options)
    print(json.dumps({"ready": round(time.perf_counter() - began, 3)}), flush=True)
    for line in sys.stdin:
        audio = np.load(line.strip())
        cpu, wall = time.process_time(), time.perf_counter()
        result = model(audio)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        tokens = len(result[0]["preds"][1]) if result and isinstance(result[0]["preds"], tuple) else 0
        print(json.dumps({"wall": wall, "cpu": cpu, "tokens": tokens}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
