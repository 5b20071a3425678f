"""`python -m bench paraformer DIR [--peer PEER]`: one Paraformer inference on the CPU, ours (the serving
path) against FunASR's own export, interleaved so that the machine's load touches both alike.

  * ours   the engine as the server builds it (pipeline/engine.py): on the CPU each clip at its own length
           (open shapes, pipeline/shapes.py; --containers: a warmed ladder instead), then the decoder on
           the CIF count (pipeline/families/paraformer/stages.py); fed clips of each --lengths, raw audio in, token
           ids and times out;
  * peer   with --peer DIR (bench/make_paraformer_peer.py: FunASR's own export and int8 recipe of the same
           weights) run by `funasr_onnx.Paraformer` itself, as its users run it (bench/funasr_onnx_peer.py,
           in --peer-python, a Python with funasr_onnx): its frontend, its session options, its decoding;
           `ratio` = ours / the peer's (wall seconds of the call), `ratio_cpu` the same with each process's
           CPU seconds (less moved by other jobs).
  * punc   with --punc DIR (a punctuation model: python -m export ct-punc), what punctuating a final adds: the
           final as the server's worker makes it (Engine.transcribe_many: the two stages and the decoding), and
           after it, on the same thread, the punctuation of its transcript (the model and the alignment of its
           words, pipeline/punctuation.py), and of a text of --punc-words-per-second words a second (the length of
           real speech's transcript; a random model's may be any); `punc_share` is the larger of the two over the
           final, in per cent (docs/benchmarks.md, "Punctuation").
Each repeat times ours and the peer on the same clip, each going first in turn. Tables go to stderr; the
last stdout line is one JSON object with every figure (the engine's containers, token containers, load
time and memory included).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.batching import Clip
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import UnipadError
from pipeline.families import PARAFORMER, family_of
from pipeline.modeldir import read_model_directory
from pipeline.shapes import parse_containers

from .common import command_line, emit, machine, say, speech_audio, summary, time_runs
from .peer import read_peer_info

DEFAULT_LENGTHS = (1.0, 2.0, 5.0, 10.0, 20.0, 29.0)
PEER_PYTHON = Path("/opt/funasr-onnx-venv/bin/python")  # pip install funasr-onnx==0.4.3 (docs/benchmarks.md)
PEER_SCRIPT = Path(__file__).with_name("funasr_onnx_peer.py")
PUNC_WORDS_PER_SECOND = 5.0  # characters a second of Mandarin read briskly (each a word to the punctuation model)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a Paraformer model directory (python -m export paraformer)")
    parser.add_argument("--peer", type=Path, help="peer directory from bench/make_paraformer_peer.py")
    parser.add_argument("--precision", default="fp32,int8", help="comma list (default fp32,int8)")
    parser.add_argument("--lengths", default=",".join(f"{x:g}" for x in DEFAULT_LENGTHS), help="clip seconds")
    parser.add_argument("--containers", type=parse_containers, help="audio containers, seconds (default: the CPU's)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--spin-us", type=int, default=0, help="ours: intra-op spinning in microseconds "
                        "(EngineOptions.cpu_spin_us; default 0, never, as the server runs)")
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON, help=f"a Python with funasr_onnx "
                        f"(default {PEER_PYTHON})")
    parser.add_argument("--peer-threads", type=int, help="the intra_op_num_threads passed to funasr_onnx's Paraformer "
                        "(default: none passed, its own default, 4)")
    parser.add_argument("--punc", type=Path, help="a punctuation model directory: also time a final with and without "
                        "punctuating it (the server's --punc)")
    parser.add_argument("--punc-words-per-second", type=float, default=PUNC_WORDS_PER_SECOND,
                        help="words a second of the text punctuated beside the transcript (default %(default)g: "
                             "Mandarin read briskly, a character a word)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save", type=Path, help="also write the JSON here")


class FunasrOnnxPeer:
    """funasr_onnx.Paraformer in its own process (bench/funasr_onnx_peer.py); call it with a clip's .npy path
    for (wall, CPU) seconds of one call, timed there."""

    def __init__(self, python: Path, peer: Path, precision: str, threads: int | None) -> None:
        read_peer_info(peer)  # ModelLoadError when it is not a peer directory
        if not python.exists():
            raise UnipadError(f"{python}: no such Python; make one with funasr_onnx (docs/benchmarks.md) or pass "
                              "--peer-python")
        threads_option = [] if threads is None else ["--threads", str(threads)]
        self.process = subprocess.Popen([str(python), str(PEER_SCRIPT), str(peer), "--precision", precision,
                                         *threads_option], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.load_seconds = self._answer()["ready"]

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise UnipadError(f"the funasr_onnx peer exited (status {self.process.wait()}); see its error above")
        return json.loads(line)

    def __call__(self, clip: Path) -> tuple[float, float]:
        self.process.stdin.write(f"{clip}\n")
        self.process.stdin.flush()
        answer = self._answer()
        return answer["wall"], answer["cpu"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call of fn in this process."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def interleaved(ours, peer, warmup: int, repeats: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """`repeats` (wall, CPU) seconds of each, alternating ours and the peer's after `warmup` untimed calls of
    each; the one that goes first alternates too (neither always runs on the other's warm caches). Each side
    returns its own (wall, CPU) seconds; CPU seconds are its process's, all threads: on a shared machine they
    count the work done while wall time also counts the waits for a core."""
    times: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    for fn in (ours, peer):
        for _ in range(warmup):
            fn()
    for repeat in range(repeats):
        pairs = list(zip((ours, peer), times))
        for fn, out in pairs[::-1] if repeat % 2 else pairs:
            out.append(fn())
    return times


def time_punctuation(args: argparse.Namespace, engine: Engine, lengths: list[float]) -> dict:
    """Per clip length: a final's seconds (transcribe_many, as the worker runs it), its transcript's punctuation's
    and a text's of the same length's (--punc-words-per-second), and the larger share of the two, in per cent."""
    from pipeline.punctuation import aligned, load_punctuator, split_words
    from server.punctuation_model import punctuation_precision

    directory = read_model_directory(args.punc)
    punctuator = load_punctuator(directory, punctuation_precision(directory), "cpu", threads=args.threads)
    punctuator.warm_up()
    characters = [t for t in directory.tokens if len(t) == 1 and not t.isascii()]  # single-character words
    out: dict = {"model": directory.manifest.name, "precision": punctuation_precision(directory),
                 "dimensions": {k: v for k, v in directory.manifest.dimensions.items() if k != "punc_list"},
                 "final": {}, "punc": {}, "punc_text": {}, "words": {}, "text_words": {}, "punc_share": {}}
    for seconds in lengths:
        audio, key = speech_audio(seconds), f"{seconds:g}"
        final = lambda: engine.transcribe_many([Clip(audio)], [0.0])[0]  # noqa: E731 - timed closures
        transcript = final()
        words = max(1, round(seconds * args.punc_words_per_second))
        text = "".join(characters[i % len(characters)] for i in range(words))
        out["final"][key] = summary(time_runs(final, args.warmup, args.repeats))
        # the punctuation of the transcript whatever it holds (punctuate_transcript leaves a text with marks alone)
        out["punc"][key] = summary(time_runs(lambda: aligned(punctuator.punctuate(transcript.text), transcript.words),
                                             args.warmup, args.repeats))
        out["punc_text"][key] = summary(time_runs(lambda: punctuator.punctuate(text), args.warmup, args.repeats))
        out["words"][key], out["text_words"][key] = len(split_words(transcript.text)), len(split_words(text))
        larger = max(out["punc"][key]["median"], out["punc_text"][key]["median"])
        out["punc_share"][key] = round(100 * larger / out["final"][key]["median"], 2)
        say(f"[punc {out['precision']}] {key} s: final {out['final'][key]['median'] * 1000:.1f} ms; punctuation "
            f"{out['punc'][key]['median'] * 1000:.2f} ms ({out['words'][key]} words), "
            f"{out['punc_text'][key]['median'] * 1000:.2f} ms ({out['text_words'][key]} words): "
            f"{out['punc_share'][key]} % of the final")
    return out


def run(args: argparse.Namespace) -> int:
    directory = read_model_directory(args.model)
    if family_of(directory.manifest) is not PARAFORMER:
        raise UnipadError(f"{args.model}: architecture {directory.manifest.architecture!r}, not {PARAFORMER.architecture}")
    lengths = [float(s) for s in args.lengths.split(",")]
    result = {"machine": machine(), "command": command_line(), "model": directory.manifest.name,
              "dimensions": directory.manifest.dimensions, "precisions": {}}
    with tempfile.TemporaryDirectory(prefix="bench-paraformer-") as scratch:
        for precision in [p.strip() for p in args.precision.split(",") if p.strip()]:
            run_precision(args, precision, lengths, result, scratch)
    emit(result, args.save)
    return 0


def run_precision(args: argparse.Namespace, precision: str, lengths: list[float], result: dict, scratch: str) -> None:
    """Load the engine (and the peer) in `precision` and time every length into result["precisions"]."""
    engine = Engine(args.model, EngineOptions(device="cpu", precision=precision, containers=args.containers,
                                              threads=args.threads, cpu_spin_us=args.spin_us)).load()
    stats = engine.stats
    part: dict = {"containers": list(engine.containers), "decoder_shapes": len(engine.runtime.decoder.sessions),
                  "load_seconds": round(stats.load_seconds, 2),
                  "rss_mib": round(((stats.rss_after_load or 0) - (stats.rss_before_load or 0)) / 2**20, 1),
                  "ours": {}, "peer": {}, "ratio": {}, "ours_cpu": {}, "peer_cpu": {}, "ratio_cpu": {}, "tokens": {}}
    say(f"[{precision}] engine: containers {part['containers']} s, {part['decoder_shapes']} decoder shapes, "
        f"loaded and warmed in {part['load_seconds']} s, {part['rss_mib']} MiB resident memory added")
    peer = FunasrOnnxPeer(args.peer_python, args.peer, precision, args.peer_threads) if args.peer else None
    if peer is not None:
        part["peer_load_seconds"], part["peer_threads"] = peer.load_seconds, args.peer_threads or "funasr_onnx default"
    for seconds in lengths:
        audio, key = speech_audio(seconds), f"{seconds:g}"
        ours = lambda: engine.infer([Clip(audio)])  # noqa: E731 - timed closures
        if peer is None:
            part["ours"][key] = summary(time_runs(ours, args.warmup, args.repeats))
        else:
            clip = Path(scratch) / f"{key}.npy"
            np.save(clip, audio)
            mine, theirs = interleaved(lambda: timed(ours), lambda: peer(clip), args.warmup, args.repeats)
            for side, runs in (("ours", mine), ("peer", theirs)):
                part[side][key] = summary([wall for wall, _ in runs])
                part[f"{side}_cpu"][key] = summary([cpu for _, cpu in runs])
            for ratio, side in (("ratio", ""), ("ratio_cpu", "_cpu")):
                part[ratio][key] = round(part["ours" + side][key]["median"] / part["peer" + side][key]["median"], 3)
        part["tokens"][key] = len(engine.infer([Clip(audio)])[0].token_ids)
        say(f"[{precision}] {key} s ({part['tokens'][key]} tokens): ours {part['ours'][key]['median']:.3f} s"
            + (f"; peer {part['peer'][key]['median']:.3f} s (ratio {part['ratio'][key]}, CPU seconds' ratio "
               f"{part['ratio_cpu'][key]})" if peer else ""))
    if args.punc is not None:
        part["punctuation"] = time_punctuation(args, engine, lengths)
    part["unwarmed_calls"], part["cold_shape_calls"] = stats.unwarmed_calls, stats.cold_shape_calls
    part["open_step"] = engine.policy.step  # samples; 0: every clip in a warmed container
    result["precisions"][precision] = part
    if peer is not None:
        peer.close()
