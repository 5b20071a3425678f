"""`python -m export eval DIR`: word error rate and sentence accuracy through the serving engine.

The audio goes through pipeline.engine.Engine exactly as the server runs it: padded into the CPU
container ladder, one warmed session per container, greedy CTC decoding with tags. The held-out set is
either a directory (`--data`: WAV files and a `transcripts.json` listing {"audio": "x.wav", "text": "..."},
optionally with the espeak-ng "voice", by whose variant WER is then also reported) or, by default,
synthesised with espeak-ng: voices with variants never used in training (synth.HELDOUT_VARIANTS) saying
word sequences that are not among the training texts.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE

TRANSCRIPTS_FILE = "transcripts.json"


@dataclass(frozen=True)
class EvalItem:
    name: str
    audio: np.ndarray  # float32 [N] at SAMPLE_RATE
    text: str
    group: str = ""  # what the item's WER is also reported under (the voice variant of a synthesised item)


@dataclass(frozen=True)
class EvalResult:
    precision: str
    utterances: int
    words: int
    word_errors: int
    wer: float
    sentence_accuracy: float
    examples: tuple[tuple[str, str], ...]  # (reference, hypothesis) of the first mistakes
    groups: tuple[tuple[str, int, int], ...] = ()  # (group, word errors, words), worst WER first


def normalize(text: str) -> list[str]:
    return [w.strip(".,!?;:").lower() for w in text.split() if w.strip(".,!?;:")]


def word_errors(reference: str, hypothesis: str) -> int:
    """Levenshtein distance between the word sequences (substitutions + deletions + insertions)."""
    return edit_distance(normalize(reference), normalize(hypothesis))


def edit_distance(ref, hyp) -> int:
    """Levenshtein distance between two sequences (words, token ids)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1]


def load_eval_dir(directory: str | Path) -> list[EvalItem]:
    """Read DIR/transcripts.json and its WAV files (16 kHz mono); ValueError naming what is wrong."""
    import soundfile

    directory = Path(directory)
    listing = directory / TRANSCRIPTS_FILE
    if not listing.is_file():
        raise ValueError(f"eval set {directory}: no {TRANSCRIPTS_FILE}")
    try:
        entries = json.loads(listing.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{listing}: not JSON ({exc})") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"eval set {directory} is empty ({TRANSCRIPTS_FILE} lists no utterances)")
    items = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("audio"), str) or not isinstance(entry.get("text"), str):
            raise ValueError(f"{listing}: every entry needs \"audio\" and \"text\" strings, got {entry!r}")
        path = directory / entry["audio"]
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        if rate != SAMPLE_RATE:
            raise ValueError(f"{path}: {rate} Hz, expected {SAMPLE_RATE}")
        voice = entry.get("voice") if isinstance(entry.get("voice"), str) else ""
        items.append(EvalItem(entry["audio"], audio.mean(axis=1), entry["text"], voice_group(voice)))
    return items


def _render(u) -> np.ndarray:
    from . import synth

    return synth.render(u)


def synth_eval_set(count: int, seed: int, train_seed: int, train_count: int, workers: int = 2) -> list[EvalItem]:
    """`count` held-out utterances: held-out variants, texts absent from the training recipe's texts."""
    from tqdm import tqdm

    from . import synth

    synth.require_espeak()
    seen = frozenset(u.text for u in synth.sample_utterances(train_count, train_seed))
    utterances = synth.sample_utterances(count, seed, heldout=True, exclude=seen)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        audio = list(tqdm(pool.imap(_render, utterances, chunksize=16), total=count, desc="held-out set", disable=None))
    return [EvalItem(f"{i:05d} {u.voice}", a, u.text, voice_group(u.voice))
            for i, (u, a) in enumerate(zip(utterances, audio))]


def voice_group(voice: str) -> str:
    """The timbre of an espeak-ng voice ("en-us+m3" -> "m3"): what held-out voices differ by."""
    return voice.partition("+")[2] or voice


def format_groups(groups: tuple[tuple[str, int, int], ...]) -> str:
    """"m3 4.1%, f2 2.0%": an EvalResult's per-group WER, in its order."""
    return ", ".join(f"{g} {e / max(1, n):.1%}" for g, e, n in groups)


def evaluate(model_dir: str | Path, items: list[EvalItem], precision: str, threads: int = 0,
             containers: tuple[float, ...] | None = None) -> EvalResult:
    """Transcribe every item with the serving engine on CPU; language auto, no ITN."""
    from tqdm import tqdm

    from pipeline.engine import Engine, EngineOptions

    engine = Engine(model_dir, EngineOptions(device="cpu", precision=precision, threads=threads,
                                             containers=containers)).load()
    errors = words = correct = 0
    examples = []
    groups: dict[str, list[int]] = {}
    for item in tqdm(items, desc=f"eval {precision}", unit="utt", disable=None):
        hypothesis = engine.transcribe(item.audio).text
        e, n = word_errors(item.text, hypothesis), len(normalize(item.text))
        errors += e
        words += n
        correct += e == 0
        if e and len(examples) < 20:
            examples.append((item.text, hypothesis))
        if item.group:
            tally = groups.setdefault(item.group, [0, 0])
            tally[0] += e
            tally[1] += n
    ranked = sorted(((g, e, n) for g, (e, n) in groups.items()), key=lambda t: (-t[1] / max(1, t[2]), t[0]))
    return EvalResult(precision, len(items), words, errors, errors / max(1, words), correct / max(1, len(items)),
                      tuple(examples), tuple(ranked))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, help="model directory (manifest.json, tokens.txt, *.onnx)")
    parser.add_argument("--data", type=Path, help=f"eval set directory (WAVs + {TRANSCRIPTS_FILE}); "
                        "default: synthesise held-out voices and phrases with espeak-ng")
    parser.add_argument("--utterances", type=int, default=500, help="size of the synthesised set (default 500)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the synthesised set (default: the training seed)")
    parser.add_argument("--precision", action="append", choices=("fp32", "int8", "fp16"),
                        help="precision(s) to evaluate (default: every exported one except fp16)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its default)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")


def run(args: argparse.Namespace) -> int:
    from pipeline.errors import UnipadError
    from pipeline.modeldir import read_model_directory

    if args.data is not None:  # the eval set first: its problems need no model to report
        if not args.data.is_dir():
            raise ValueError(f"eval set {args.data} does not exist")
        items = load_eval_dir(args.data)
    try:
        model = read_model_directory(args.model_dir)
    except UnipadError as exc:
        raise ValueError(str(exc)) from None
    source = model.manifest.source
    if args.data is None:
        if args.utterances < 1:
            raise ValueError("--utterances must be at least 1")
        train_seed = int(source.get("seed", 0))
        seed = train_seed if args.seed is None else args.seed
        items = synth_eval_set(args.utterances, seed, train_seed, int(source.get("utterances", 0)))
    precisions = args.precision or [p for p in model.manifest.files if p != "fp16"]
    results = [evaluate(args.model_dir, items, p, args.threads) for p in precisions]
    for r in results:
        print(f"{r.precision}: WER {r.wer:.2%} ({r.word_errors}/{r.words} words), "
              f"sentence accuracy {r.sentence_accuracy:.2%} ({r.utterances} utterances)")
        if r.groups:
            print(f"    by voice: {format_groups(r.groups)}")
        for ref, hyp in r.examples[:5]:
            print(f"    {ref!r} -> {hyp!r}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    return 0
