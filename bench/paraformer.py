"""`python -m bench paraformer DIR [--peer PEER]`: one Paraformer inference on the CPU, ours against
FunASR's own export.

  * ours   the model directory's graph (fp32, int8) in one session with every shape fixed to the 30 s
           container (what the server and a GPU run), fed clips of each --lengths: raw audio in,
           token ids, times and counts out; the time does not depend on the clip's length;
  * peer   with --peer DIR (bench/make_paraformer_peer.py): FunASR's Paraformer export of the
           same weights run as funasr_onnx's Paraformer runs it: kaldi-native-fbank, LFR and CMVN in
           Python (bench/peer.py), one dynamic-shape run at the clip's exact length, then the
           greedy argmax over the decoder's log-probs in numpy; `ratio` = ours / the peer's.
Tables go to stderr; the last stdout line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.audio import seconds_to_samples
from pipeline.errors import UnipadError
from pipeline.modeldir import read_model_directory

from .common import command_line, emit, machine, say, speech_audio, summary, time_runs
from .model import plain_options
from .peer import PeerModel

DEFAULT_LENGTHS = (5.0, 10.0, 29.0)
CONTAINER_SECONDS = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a Paraformer model directory (python -m export paraformer)")
    parser.add_argument("--peer", type=Path, help="peer directory from bench/make_paraformer_peer.py")
    parser.add_argument("--precision", default="fp32,int8", help="comma list (default fp32,int8)")
    parser.add_argument("--lengths", default=",".join(f"{x:g}" for x in DEFAULT_LENGTHS), help="clip seconds")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", type=Path, help="also write the JSON here")


def peer_run(peer: PeerModel, audio: np.ndarray) -> np.ndarray:
    """funasr_onnx Paraformer.__call__ for one clip: features, one run, argmax of the valid tokens."""
    feats = peer.features(audio)
    logprobs, token_num = peer.session.run(None, {"speech": feats[None], "speech_lengths": np.array([len(feats)], np.int32)})
    return logprobs[0, : int(token_num[0])].argmax(-1)


def run(args: argparse.Namespace) -> int:
    directory = read_model_directory(args.model)
    if directory.manifest.architecture != "paraformer":
        raise UnipadError(f"{args.model}: architecture {directory.manifest.architecture!r}, not paraformer")
    lengths = [float(s) for s in args.lengths.split(",")]
    container = seconds_to_samples(CONTAINER_SECONDS)
    if max(lengths) > CONTAINER_SECONDS:
        raise ValueError(f"the {CONTAINER_SECONDS:g} s container is shorter than the {max(lengths):g} s clip")
    result = {"machine": machine(), "command": command_line(), "model": directory.manifest.name,
              "dimensions": directory.manifest.dimensions, "container_seconds": CONTAINER_SECONDS, "precisions": {}}
    for precision in [p.strip() for p in args.precision.split(",") if p.strip()]:
        session = ort.InferenceSession(str(directory.onnx_path(precision)), plain_options(args.threads, samples=container),
                                       providers=["CPUExecutionProvider"])
        part: dict = {"ours": {}, "peer": {}, "ratio": {}}
        peer = None
        if args.peer is not None:
            peer = PeerModel(args.peer, precision, plain_options(args.threads), ["CPUExecutionProvider"])
        for seconds in lengths:
            audio = speech_audio(seconds)
            padded = np.zeros(container, np.float32)
            padded[: len(audio)] = audio
            feeds = {"audio": padded[None], "audio_lengths": np.array([len(audio)], np.int32)}
            key = f"{seconds:g}"
            part["ours"][key] = summary(time_runs(lambda: session.run(None, feeds), args.warmup, args.repeats))
            line = f"[{precision}] {key} s in the {CONTAINER_SECONDS:g} s container: {part['ours'][key]['median']:.3f} s"
            if peer is not None:
                part["peer"][key] = summary(time_runs(lambda: peer_run(peer, audio), args.warmup, args.repeats))
                part["ratio"][key] = round(part["ours"][key]["median"] / part["peer"][key]["median"], 3)
                line += f"; peer at {key} s: {part['peer'][key]['median']:.3f} s (ratio {part['ratio'][key]})"
            say(line)
        result["precisions"][precision] = part
    emit(result, args.save)
    return 0
