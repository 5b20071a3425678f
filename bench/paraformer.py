"""`python -m bench paraformer DIR [--peer PEER]`: one Paraformer inference on the CPU, ours (the serving
path) against FunASR's own export, interleaved so that the machine's load touches both alike.

  * ours   the engine as the server builds it (pipeline/engine.py): the audio container ladder, then the
           decoder on the token container that holds the CIF count (pipeline/paraformer_stages.py), every
           session warmed at load; fed clips of each --lengths, raw audio in, token ids and times out;
  * peer   with --peer DIR (bench/make_paraformer_peer.py): FunASR's Paraformer export of the
           same weights run as funasr_onnx's Paraformer runs it: kaldi-native-fbank, LFR and CMVN in
           Python (bench/peer.py), one dynamic-shape run at the clip's exact length, then the
           greedy argmax over the decoder's log-probs in numpy; `ratio` = ours / the peer's (wall
           seconds), `ratio_cpu` the same with the process's CPU seconds (less moved by other jobs).
Each repeat times ours and the peer on the same clip, each going first in turn. Tables go to stderr; the
last stdout line is one JSON object with every figure (the engine's containers, token containers, load
time and memory included).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pipeline.batching import Clip
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import UnipadError
from pipeline.modeldir import read_model_directory
from pipeline.shapes import parse_containers

from .common import command_line, emit, machine, say, speech_audio, summary, time_runs
from .model import plain_options
from .peer import PeerModel

DEFAULT_LENGTHS = (1.0, 2.0, 5.0, 10.0, 20.0, 29.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a Paraformer model directory (python -m export paraformer)")
    parser.add_argument("--peer", type=Path, help="peer directory from bench/make_paraformer_peer.py")
    parser.add_argument("--precision", default="fp32,int8", help="comma list (default fp32,int8)")
    parser.add_argument("--lengths", default=",".join(f"{x:g}" for x in DEFAULT_LENGTHS), help="clip seconds")
    parser.add_argument("--containers", type=parse_containers, help="audio containers, seconds (default: the CPU's)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save", type=Path, help="also write the JSON here")


def peer_run(peer: PeerModel, audio: np.ndarray) -> np.ndarray:
    """funasr_onnx Paraformer.__call__ for one clip: features, one run, argmax of the valid tokens."""
    feats = peer.features(audio)
    logprobs, token_num = peer.session.run(None, {"speech": feats[None], "speech_lengths": np.array([len(feats)], np.int32)})
    return logprobs[0, : int(token_num[0])].argmax(-1)


def interleaved(ours, peer, warmup: int, repeats: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """`repeats` (wall, CPU) seconds of each, alternating ours and the peer's after `warmup` untimed calls of
    each; the one that goes first alternates too (neither always runs on the other's warm caches). CPU
    seconds are the process's, all threads: on a shared machine they count the work done while wall time
    also counts the waits for a core."""
    times: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    for fn in (ours, peer):
        time_runs(fn, warmup, 0)
    for repeat in range(repeats):
        pairs = list(zip((ours, peer), times))
        for fn, out in pairs[::-1] if repeat % 2 else pairs:
            cpu = time.process_time()
            wall = time_runs(fn, 0, 1)[0]
            out.append((wall, time.process_time() - cpu))
    return times


def run(args: argparse.Namespace) -> int:
    directory = read_model_directory(args.model)
    if directory.manifest.architecture != "paraformer":
        raise UnipadError(f"{args.model}: architecture {directory.manifest.architecture!r}, not paraformer")
    lengths = [float(s) for s in args.lengths.split(",")]
    result = {"machine": machine(), "command": command_line(), "model": directory.manifest.name,
              "dimensions": directory.manifest.dimensions, "precisions": {}}
    for precision in [p.strip() for p in args.precision.split(",") if p.strip()]:
        engine = Engine(args.model, EngineOptions(device="cpu", precision=precision, containers=args.containers,
                                                  threads=args.threads)).load()
        stats = engine.stats
        part: dict = {"containers": list(engine.containers), "decoder_shapes": len(engine._decoder.sessions),
                      "load_seconds": round(stats.load_seconds, 2),
                      "rss_mib": round(((stats.rss_after_load or 0) - (stats.rss_before_load or 0)) / 2**20, 1),
                      "ours": {}, "peer": {}, "ratio": {}, "ours_cpu": {}, "peer_cpu": {}, "ratio_cpu": {}, "tokens": {}}
        say(f"[{precision}] engine: containers {part['containers']} s, {part['decoder_shapes']} decoder shapes, "
            f"loaded and warmed in {part['load_seconds']} s, {part['rss_mib']} MiB resident memory added")
        peer = PeerModel(args.peer, precision, plain_options(args.threads), ["CPUExecutionProvider"]) if args.peer else None
        for seconds in lengths:
            audio, key = speech_audio(seconds), f"{seconds:g}"
            ours = lambda: engine.infer([Clip(audio)])  # noqa: E731 - timed closures
            if peer is None:
                part["ours"][key] = summary(time_runs(ours, args.warmup, args.repeats))
            else:
                mine, theirs = interleaved(ours, lambda: peer_run(peer, audio), args.warmup, args.repeats)
                for side, runs in (("ours", mine), ("peer", theirs)):
                    part[side][key] = summary([wall for wall, _ in runs])
                    part[f"{side}_cpu"][key] = summary([cpu for _, cpu in runs])
                for ratio, side in (("ratio", ""), ("ratio_cpu", "_cpu")):
                    part[ratio][key] = round(part["ours" + side][key]["median"] / part["peer" + side][key]["median"], 3)
            part["tokens"][key] = len(engine.infer([Clip(audio)])[0].token_ids)
            say(f"[{precision}] {key} s ({part['tokens'][key]} tokens): ours {part['ours'][key]['median']:.3f} s"
                + (f"; peer {part['peer'][key]['median']:.3f} s (ratio {part['ratio'][key]}, CPU seconds' ratio "
                   f"{part['ratio_cpu'][key]})" if peer else ""))
        part["unwarmed_calls"] = stats.unwarmed_calls
        result["precisions"][precision] = part
        del engine, peer
    emit(result, args.save)
    return 0
