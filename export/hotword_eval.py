"""`python -m export eval-hotwords DIR`: what hotwords buy and cost, with the serving engine on CPU.

Two held-out sets, synthesised like `eval`'s (held-out espeak-ng voices, texts absent from training):
    biased   digit strings and commands that contain the hotwords' confusable words (default hotwords
             "oh" and "save", whose look-alikes "four"/"zero" and "send"/"stop" share the set), with
             noise at --snr dB so that the acoustic evidence is sometimes ambiguous
    control  the same kind of texts without any hotword: biasing must not hurt them
Each is decoded greedily (no hotwords) and with the hotword list by beam search; printed: WER, and on the
biased set the hotword recall (hotword occurrences of the references that the hypotheses have).
Then the decoding time of a 30 s segment (utterances of the biased set back to back): the model's run,
greedy decoding, and top-k plus beam search with beam 4 and 8, as medians of --repeats runs; also the
host top-k over SenseVoice-Small's 25 055 tokens (the demo's log-probabilities padded with a tail drawn
around -30, no ties), the cost that moves into the graph once it outputs its own top-k.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE

from .evaluate import EvalItem, _render, normalize, word_errors

DEFAULT_HOTWORDS = ("oh", "save")
CONFUSABLE = ("four", "zero", "oh", "save", "send", "stop", "seven")  # the words the biased texts draw on
SEGMENT_SECONDS = 30.0
SENSEVOICE_VOCAB = 25055  # SenseVoice-Small's vocabulary: what host-side top-k sorts per frame there


def make_texts(rng: np.random.Generator, count: int, hotwords: tuple[str, ...], biased: bool) -> list[str]:
    """Texts of 2-6 words from the demo vocabulary; biased ones contain at least one hotword, control ones none."""
    from .synth import COMMANDS, DIGITS

    pool = [w for w in DIGITS + COMMANDS if w not in hotwords] if not biased else list(CONFUSABLE) + list(hotwords)
    texts = []
    while len(texts) < count:
        words = [pool[int(i)] for i in rng.integers(0, len(pool), int(rng.integers(2, 7)))]
        if biased and not set(words) & set(hotwords):
            words[int(rng.integers(len(words)))] = hotwords[int(rng.integers(len(hotwords)))]
        texts.append(" ".join(words))
    return texts


def synth_set(texts: list[str], seed: int, snr_db: float | None, workers: int = 2) -> list[EvalItem]:
    from . import synth

    synth.require_espeak()
    recipes = synth.sample_utterances(len(texts), seed, heldout=True)
    recipes = [dataclasses.replace(u, text=t, snr_db=snr_db if snr_db is not None else u.snr_db)
               for u, t in zip(recipes, texts)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        audio = pool.map(_render, recipes, chunksize=8)
    return [EvalItem(f"{i:05d} {u.voice}", a, u.text) for i, (u, a) in enumerate(zip(recipes, audio))]


def score(engine, items: list[EvalItem], graph, hotwords: tuple[str, ...]) -> dict[str, float]:
    errors = words = found = expected = 0
    for item in items:
        hypothesis = engine.transcribe(item.audio, hotwords=graph).text
        errors += word_errors(item.text, hypothesis)
        words += len(normalize(item.text))
        ref, hyp = Counter(normalize(item.text)), Counter(normalize(hypothesis))
        expected += sum(ref[w] for w in hotwords)
        found += sum(min(ref[w], hyp[w]) for w in hotwords)
    return {"wer": errors / max(1, words), "word_errors": errors, "words": words,
            "recall": found / max(1, expected), "hotword_occurrences": expected}


def time_segment(engine, items: list[EvalItem], graph, repeats: int) -> dict[str, float]:
    """Median seconds of each decoding stage for one 30 s segment of speech."""
    from pipeline.families.sensevoice.beam_search import beam_search, top_k
    from pipeline.families.sensevoice.decoding import decode_ctc

    gap = np.zeros(int(0.2 * SAMPLE_RATE), np.float32)
    pieces, total = [], 0
    for item in items:
        if total + len(item.audio) + len(gap) > SEGMENT_SECONDS * SAMPLE_RATE:
            break
        pieces += [item.audio, gap]
        total += len(item.audio) + len(gap)
    audio = np.concatenate(pieces)
    m = engine.model.manifest
    tokens = engine.model.tokens
    timings: dict[str, list[float]] = {}

    def clock(name, fn):
        t = time.perf_counter()
        result = fn()
        timings.setdefault(name, []).append(time.perf_counter() - t)
        return result

    logprobs, length = engine.run(audio)
    wide = np.random.default_rng(0).normal(-30.0, 3.0, (logprobs.shape[0], SENSEVOICE_VOCAB)).astype(np.float32)
    wide[:, :logprobs.shape[1]] = logprobs
    for _ in range(repeats):
        logprobs, length = clock("model", lambda: engine.run(audio))
        clock("greedy", lambda: decode_ctc(logprobs, length, tokens, m.blank_id, m.prompt_frames))
        ids, values = clock("top_k", lambda: top_k(logprobs, length, blank_id=m.blank_id))
        clock("top_k_sensevoice_vocab", lambda: top_k(wide, length, blank_id=m.blank_id))
        for beam in (4, 8):
            clock(f"beam{beam}", lambda: beam_search(ids, values, length, tokens, graph, beam, m.blank_id,
                                                     m.prompt_frames))
    medians = {name: statistics.median(values) for name, values in timings.items()}
    medians["audio_seconds"] = len(audio) / SAMPLE_RATE
    medians["frames"] = int(length)
    return medians


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, help="model directory (the demo model: models/demo)")
    parser.add_argument("--hotwords", default=",".join(DEFAULT_HOTWORDS), help="comma-separated hotwords")
    parser.add_argument("--boost", type=float, default=None, help="boost of every hotword (default: the default boost)")
    parser.add_argument("--utterances", type=int, default=300, help="utterances per set")
    parser.add_argument("--snr", type=float, default=10.0, help="noise (dB SNR) on the biased set; the control "
                        "set keeps the held-out recipe's")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--precision", default="int8", choices=("fp32", "int8"))
    parser.add_argument("--repeats", type=int, default=20, help="timing runs of the 30 s segment")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")


def run(args: argparse.Namespace) -> int:
    from pipeline.engine import Engine, EngineOptions
    from pipeline.hotwords import DEFAULT_BOOST, make_hotword

    words = tuple(w.strip() for w in args.hotwords.split(",") if w.strip())
    if not words or args.utterances < 1 or args.repeats < 1:
        raise ValueError("give at least one hotword, one utterance and one timing run (--repeats)")
    if not math.isfinite(args.snr):
        raise ValueError(f"--snr must be a finite number of dB, got {args.snr}")
    boost = DEFAULT_BOOST if args.boost is None else args.boost
    hotwords = tuple(make_hotword(w, boost) for w in words)  # a bad boost fails here, before the minutes of work
    engine = Engine(args.model_dir, EngineOptions(device="cpu", precision=args.precision)).load()
    graph = engine.hotword_graph(hotwords)
    hot = tuple(w.text for w in graph.hotwords)
    rng = np.random.default_rng(args.seed)
    biased = synth_set(make_texts(rng, args.utterances, hot, True), args.seed, args.snr)
    control = synth_set(make_texts(rng, args.utterances, hot, False), args.seed + 1, None)
    results = {"hotwords": hot, "boost": boost, "precision": args.precision, "snr_db": args.snr}
    for name, items in (("biased", biased), ("control", control)):
        for mode, g in (("greedy", None), ("hotwords", graph)):
            r = results[f"{name}_{mode}"] = score(engine, items, g, hot)
            recall = f", hotword recall {r['recall']:.1%} of {r['hotword_occurrences']}" if name == "biased" else ""
            print(f"{name:8s} {mode:9s} WER {r['wer']:.2%} ({r['word_errors']}/{r['words']} words){recall}")
    t = results["timing"] = time_segment(engine, biased, graph, args.repeats)
    print(f"{t['audio_seconds']:.1f} s segment ({t['frames']} frames), medians of {args.repeats}: model "
          f"{t['model'] * 1e3:.1f} ms, greedy {t['greedy'] * 1e3:.2f} ms, top-k {t['top_k'] * 1e3:.2f} ms, "
          f"beam 4 {t['beam4'] * 1e3:.2f} ms, beam 8 {t['beam8'] * 1e3:.2f} ms; top-k + beam 4 = "
          f"{(t['top_k'] + t['beam4']) / t['model']:.1%} of the model, beam 8 {(t['top_k'] + t['beam8']) / t['model']:.1%}; "
          f"top-k over {SENSEVOICE_VOCAB} tokens {t['top_k_sensevoice_vocab'] * 1e3:.2f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0
