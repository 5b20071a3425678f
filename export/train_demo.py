"""`python -m export train-demo`: the shipped demo model, trained on espeak-ng speech in minutes on a CPU.

    data   export.synth renders seeded utterances (2 worker processes); each worker computes the model's
           own frontend features (fbank + LFR, before CMVN) once; they are cached in memory as float16
           (export.demo_data, with the batching and augmentation)
    cmvn   shift = -mean, scale = 1/std over the training frames: the am.mvn of this model
    train  a small SenseVoice (ModelDimensions.preset("demo")) with CTC on [4 tags] + word tokens; batches
           by length, AdamW, warmup + cosine decay over --steps or the time left of --minutes, mel-warp, masks;
           bf16 autocast where the CPU has it (the budget is time, and bf16 gives 1.4-1.6x the steps)
    ship   export fp32 + int8 into a temporary sibling of --out, evaluate it on held-out voices and phrases
           through pipeline.engine.Engine, write the model card, rename into place
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.families import SENSEVOICE
from pipeline.modeldir import SENSEVOICE_LANGUAGES

from . import synth
from .demo_data import cmvn_from, collate, length_batches, render_features

# OpenMP threads that spin while waiting lose badly when other processes share the 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "demo"
WORD_START = "\u2581"
TAGS = ("<|en|>", "<|Speech|>", "<|NEUTRAL|>", "<|withitn|>", "<|woitn|>")  # released-vocabulary order
# Kept from the --minutes budget for export, the held-out evaluation and the card (about 1 min when idle).
SHIP_RESERVE_SECONDS = 150
# The language prompts training uses, and so the manifest's languages: the only ones the model knows.
LANGUAGES = {name: SENSEVOICE_LANGUAGES[name] for name in ("auto", "en")}
LANGUAGE_PROMPTS = tuple(LANGUAGES.values())
TEXTNORM_PROMPTS = {14: "<|withitn|>", 15: "<|woitn|>"}


def demo_tokens() -> list[str]:
    """id 0 blank, one whole-word piece per vocabulary word, then the tag tokens."""
    return ["<blank>"] + [WORD_START + w for w in synth.VOCABULARY] + list(TAGS)


@dataclass(frozen=True)
class TrainOptions:
    seed: int = 0
    utterances: int = 30000
    steps: int = 12000
    minutes: float = 44.0  # wall-clock budget of the whole command; training gets what data and shipping leave
    peak_lr: float = 7.5e-4  # 1.5e-3 and 3e-3 stall longer on the all-blank plateau (measured)
    warmup: int = 400
    weight_decay: float = 0.01
    max_frames: int = 1400  # padded LFR frames per batch (about 32 utterances of 2.5 s)
    workers: int = 2
    threads: int = 2
    mel_warp: float = 0.1  # +-10 % mel-axis stretch per utterance
    time_masks: int = 2  # masks of up to 2 frames (120 ms)
    freq_masks: int = 2  # masks of up to 8 mel bins
    log_every: int = 125  # steps between loss lines (and 4x that between held-out WER checks)
    precision: str = "auto"  # "bf16": autocast matmuls to bfloat16 (fp32 master weights); "auto": where the CPU has it
    long_silence: float = 0.0  # synth.Recipe.long_silence_probability: utterances with a 0.3-2 s lead or trail
    room_noise: float = 0.0  # synth.Recipe.room_noise_probability: pink, brown or room noise at -60..-35 dBFS
    round_trip: float = 0.0  # synth.Recipe.round_trip_probability: through 24 kHz and back

    def recipe(self) -> synth.Recipe:
        return synth.Recipe(long_silence_probability=self.long_silence, room_noise_probability=self.room_noise,
                            round_trip_probability=self.round_trip)


def targets_for(text: str, token_ids: dict[str, int]) -> list[int]:
    return [token_ids[WORD_START + w] for w in text.split()]


# ---- training ------------------------------------------------------------------------------------

def greedy_words(logprobs, lengths, tokens: list[str]) -> list[str]:
    """Greedy CTC over a batch (torch), tags dropped: one text per utterance."""
    texts = []
    ids = logprobs.argmax(-1)
    for row, n in zip(ids.tolist(), lengths.tolist()):
        out, prev = [], 0
        for i in row[:n]:
            if i != prev and i != 0 and not tokens[i].startswith("<|"):
                out.append(tokens[i][1:])
            prev = i
        texts.append(" ".join(out))
    return texts


PRECISIONS = ("auto", "bf16", "fp32")


def native_bf16() -> bool:
    """Whether the CPU computes bf16 itself (AVX512-BF16 or AMX); elsewhere oneDNN emulates it."""
    import torch

    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def training_precision(requested: str) -> str:
    """"auto" is bf16 where the CPU has it natively (1.4-1.6x the steps per minute here, measured by
    `python -m bench train`), fp32 elsewhere: emulated bf16 is slower than fp32."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r} (choose from {', '.join(PRECISIONS)})")
    if requested != "auto":
        return requested
    return "bf16" if native_bf16() else "fp32"


def adamw(model, options: TrainOptions):
    """AdamW without weight decay on biases, norms and the prompt embeddings."""
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or name.startswith("embed") else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": options.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=options.peak_lr, betas=(0.9, 0.98), fused=True,  # fused: one kernel, not one per tensor
    )


def tag_targets(token_ids: dict[str, int], textnorm: int) -> list[int]:
    """The four tags every transcript starts with, in the order SenseVoice emits them."""
    return [token_ids["<|en|>"], token_ids["<|NEUTRAL|>"], token_ids["<|Speech|>"], token_ids[TEXTNORM_PROMPTS[textnorm]]]


def train_step(model, optimizer, features: list[np.ndarray], word_targets: list[list[int]], token_ids: dict[str, int],
               shift, scale, options: TrainOptions, generator, rng: np.random.Generator, precision: str):
    """One CTC update on one batch (its features and word targets): collation with augmentation, random
    language and textnorm prompts, gradients clipped at norm 5. Returns the loss tensor."""
    import torch

    x, x_lengths = collate(features, shift, scale, options, generator)
    language = torch.tensor(rng.choice(LANGUAGE_PROMPTS, len(features)), dtype=torch.int32)
    textnorm = torch.tensor(rng.choice(list(TEXTNORM_PROMPTS), len(features)), dtype=torch.int32)
    target_rows = [tag_targets(token_ids, int(tn)) + words for words, tn in zip(word_targets, textnorm)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logprobs, out_lengths = model.encode(x, x_lengths, language, textnorm)  # logprobs: float32
    loss = torch.nn.functional.ctc_loss(
        logprobs.transpose(0, 1), torch.tensor([t for row in target_rows for t in row]),
        out_lengths.long(), torch.tensor([len(r) for r in target_rows]), blank=0, zero_infinity=True,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
    return loss


def train(model, features, texts, heldout, options: TrainOptions, seconds: float | None = None, log=print) -> dict:
    """CTC training on cached features for at most options.steps steps and `seconds` of wall-clock time
    (default: options.minutes); the learning-rate schedule follows whichever ends first. Returns a
    summary (steps, seconds, held-out greedy WER)."""
    import torch
    from tqdm import tqdm

    from .evaluate import word_errors

    tokens = demo_tokens()
    token_ids = {t: i for i, t in enumerate(tokens)}
    shift, scale = model.frontend.cmvn_shift.clone(), model.frontend.cmvn_scale.clone()
    word_targets = [targets_for(t, token_ids) for t in texts]
    lengths = np.array([len(f) for f in features])
    rng = np.random.default_rng([options.seed, 2])
    generator = torch.Generator().manual_seed(options.seed)
    optimizer = adamw(model, options)
    precision = training_precision(options.precision)
    log(f"training precision {precision}")
    start = time.monotonic()
    budget = options.minutes * 60 if seconds is None else seconds
    step, epoch, progress = 0, 0, 0.0
    history = []
    bar = tqdm(total=options.steps, desc="train", unit="step", disable=None)
    model.train()
    while progress < 1.0:
        for batch in length_batches(lengths, options.max_frames, rng):
            progress = max(step / options.steps, (time.monotonic() - start) / budget)
            if progress >= 1.0:
                break
            lr = options.peak_lr * min(1.0, (step + 1) / options.warmup) * 0.5 * (1 + math.cos(math.pi * progress))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = train_step(model, optimizer, [features[i] for i in batch], [word_targets[i] for i in batch],
                              token_ids, shift, scale, options, generator, rng, precision)
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}", epoch=epoch)
            if step % options.log_every == 0:
                log(f"step {step}: loss {loss.item():.3f}, lr {lr:.1e}, epoch {epoch}, {time.monotonic() - start:.0f} s")
            if step % (4 * options.log_every) == 0 and heldout is not None:
                wer = heldout_wer(model, heldout, shift, scale, tokens, word_errors)
                history.append({"step": step, "heldout_wer": round(wer, 4)})
                log(f"step {step}: held-out greedy WER {wer:.2%} ({time.monotonic() - start:.0f} s)")
                model.train()
        epoch += 1
    bar.close()
    model.eval()
    summary = {"precision": precision, "steps": step, "epochs": round(step / max(1, len(length_batches(lengths, options.max_frames, rng))), 2),
               "train_seconds": round(time.monotonic() - start), "history": history}
    if heldout is not None:
        summary["heldout_greedy_wer_torch"] = round(heldout_wer(model, heldout, shift, scale, tokens, word_errors), 4)
    return summary


def heldout_wer(model, heldout, shift, scale, tokens, word_errors) -> float:
    import torch

    features, texts = heldout
    model.eval()
    errors = words = 0
    with torch.no_grad():
        for i in range(0, len(features), 64):
            x, x_lengths = collate(features[i : i + 64], shift, scale, None)
            n = len(x)
            logprobs, out_lengths = model.encode(x, x_lengths, torch.full((n,), 0, dtype=torch.int32), torch.full((n,), 15, dtype=torch.int32))
            for hyp, ref in zip(greedy_words(logprobs, out_lengths, tokens), texts[i : i + 64]):
                errors += word_errors(ref, hyp)
                words += len(ref.split())
    return errors / max(1, words)


# ---- command line --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainOptions()
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"model directory to create (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists (atomically, at the end)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--utterances", type=int, default=d.utterances, help=f"training utterances (default {d.utterances})")
    parser.add_argument("--steps", type=int, default=d.steps, help=f"training steps (default {d.steps})")
    parser.add_argument("--minutes", type=float, default=d.minutes,
                        help="wall-clock budget of the whole command: training ends at the earlier of --steps and "
                             f"what data generation and the final export and evaluation leave (default {d.minutes:g})")
    parser.add_argument("--workers", type=int, default=d.workers, help="data processes (default 2)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads (default 2)")
    parser.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                        help="training arithmetic: bf16 autocast, fp32, or auto = bf16 where the CPU has it natively")
    parser.add_argument("--eval-utterances", type=int, default=500, help="held-out utterances for the model card (default 500)")
    parser.add_argument("--long-silence", type=float, default=d.long_silence, metavar="P",
                        help="share of training utterances given a 0.3-2 s lead, trail or both (default 0: the "
                             "shipped recipe; the server trims silence at every door anyway)")
    parser.add_argument("--room-noise", type=float, default=d.room_noise, metavar="P",
                        help="share of training speech under pink, brown or room noise at -60..-35 dBFS, lead and "
                             "trail included (issue 36; default 0)")
    parser.add_argument("--round-trip", type=float, default=d.round_trip, metavar="P",
                        help="share of training utterances sent through 24 kHz and back, as a Realtime client's "
                             "audio is (default 0)")
    parser.add_argument("--checkpoint", type=Path, help="also save the torch checkpoint (model.pt, am.mvn, training.json) here")
    parser.add_argument("--init-from", type=Path, metavar="CHECKPOINT",
                        help="fine-tune: start from this --checkpoint directory's weights and CMVN instead of "
                             "random ones (then train --steps on this recipe, e.g. --room-noise)")
    parser.add_argument("--peak-lr", type=float, default=d.peak_lr,
                        help=f"the learning rate after warm-up (default {d.peak_lr:g}; lower it to fine-tune)")
    parser.add_argument("--from-checkpoint", type=Path, help="skip data and training: export and evaluate this checkpoint")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not args.force:
        raise ValueError(f"{out} already exists (remove it, choose another --out, or pass --force)")
    if args.minutes * 60 < SHIP_RESERVE_SECONDS + 60 and args.from_checkpoint is None:
        raise ValueError(f"--minutes {args.minutes:g} is too short: export and evaluation alone take "
                         f"{SHIP_RESERVE_SECONDS / 60:g} minutes")
    for flag in ("long_silence", "room_noise", "round_trip"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            raise ValueError(f"--{flag.replace('_', '-')} must be from 0 to 1, got {getattr(args, flag):g}")
    if args.init_from is not None and not all((args.init_from / f).is_file() for f in ("model.pt", "am.mvn")):
        raise ValueError(f"--init-from {args.init_from}: no model.pt and am.mvn there (make them with --checkpoint)")
    if not args.peak_lr > 0:
        raise ValueError(f"--peak-lr must be above 0, got {args.peak_lr:g}")
    synth.require_espeak()
    import torch  # ModuleNotFoundError -> "torch is not installed" from export.__main__

    from models.frontend import read_am_mvn, write_am_mvn

    started = time.monotonic()
    torch.set_num_threads(args.threads)
    options = TrainOptions(seed=args.seed, utterances=args.utterances, steps=args.steps, minutes=args.minutes,
                           workers=args.workers, threads=args.threads, precision=args.precision,
                           long_silence=args.long_silence, room_noise=args.room_noise, round_trip=args.round_trip,
                           peak_lr=args.peak_lr)
    tokens = demo_tokens()
    torch.manual_seed(options.seed)
    model = build_model(len(tokens))
    if args.init_from is not None:
        model.load_state_dict(torch.load(args.init_from / "model.pt", map_location="cpu", weights_only=True))
        model.set_cmvn(*read_am_mvn(args.init_from / "am.mvn"))  # the features it learned on keep their scale
    if args.from_checkpoint is not None:
        model.load_state_dict(torch.load(args.from_checkpoint / "model.pt", map_location="cpu", weights_only=True))
        model.set_cmvn(*read_am_mvn(args.from_checkpoint / "am.mvn"))
        summary = json.loads((args.from_checkpoint / "training.json").read_text(encoding="utf-8"))
        options = TrainOptions(**summary["options"])
    else:
        summary = {"options": asdict(options)} | ({"init_from": str(args.init_from)} if args.init_from else {})
        utterances = synth.sample_utterances(options.utterances, options.seed, recipe=options.recipe())
        seen = frozenset(u.text for u in utterances if u.text)
        monitor = synth.sample_utterances(300, options.seed + 1, heldout=True, exclude=seen)
        features = render_features(utterances + monitor, options.workers, "synthesise")
        summary["data_seconds"] = round(time.monotonic() - started)
        if args.init_from is None:
            model.set_cmvn(*cmvn_from(features[: len(utterances)]))
        heldout = (features[len(utterances):], [u.text for u in monitor])
        seconds = options.minutes * 60 - (time.monotonic() - started) - SHIP_RESERVE_SECONDS
        if seconds < 60:
            raise ValueError(f"--minutes {options.minutes:g} leaves {max(0, seconds):.0f} s for training after the data; "
                             "give it more minutes or fewer --utterances")
        summary.update(train(model, features[: len(utterances)], [u.text for u in utterances], heldout, options, seconds))
        del features
        if args.checkpoint is not None:
            args.checkpoint.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), args.checkpoint / "model.pt")
            shift, scale = model.frontend.cmvn_shift.numpy(), model.frontend.cmvn_scale.numpy()
            write_am_mvn(args.checkpoint / "am.mvn", shift, scale)
            (args.checkpoint / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    ship(model.eval(), tokens, out, options, summary, args, started)
    return 0


def build_model(vocab_size: int):
    from models.sensevoice import PRESETS, ModelDimensions, SenseVoice

    if "demo" in PRESETS:
        dims = ModelDimensions.preset("demo")
    else:  # the geometry proposed for the preset
        dims = ModelDimensions(output_size=192, attention_heads=4, linear_units=768, num_blocks=6, tp_blocks=1,
                               kernel_size=11, vocab_size=vocab_size)
    if dims.vocab_size != vocab_size:
        raise ValueError(f"the demo preset has vocab_size {dims.vocab_size}, the demo vocabulary {vocab_size} tokens")
    return SenseVoice(dims)


def reproduce_command(options: TrainOptions, args) -> str:
    """The command that makes this model again (where it is written does not matter)."""
    d = TrainOptions()
    flags = [f"--{name.replace('_', '-')} {getattr(options, name):g}"
             for name in ("seed", "utterances", "steps", "minutes", "long_silence", "room_noise", "round_trip",
                          "peak_lr")
             if getattr(options, name) != getattr(d, name)]
    if options.precision != d.precision:
        flags.append(f"--precision {options.precision}")
    if args.init_from is not None:
        flags.append(f"--init-from {args.init_from}")
    if args.eval_utterances != 500:
        flags.append(f"--eval-utterances {args.eval_utterances}")
    return " ".join(["python -m export train-demo", *flags])


def ship(model, tokens: list[str], out: Path, options: TrainOptions, summary: dict, args, started: float) -> None:
    """Export into a temporary sibling of `out`, evaluate it there, write the card, then rename into place."""
    import dataclasses

    from pipeline.modeldir import ModelManifest, read_model_directory, write_model_directory

    from .demo_card import demo_notice, write_model_card
    from .evaluate import synth_eval_set, evaluate
    from .onnx_export import write_model_dir

    source = {
        "kind": "trained",
        "command": reproduce_command(options, args),
        "seed": options.seed,
        "utterances": options.utterances,
        "recipe": asdict(options.recipe()),
        "voices": {"bases": list(synth.VOICE_BASES), "train_variants": len(synth.TRAIN_VARIANTS),
                   "heldout_variants": list(synth.HELDOUT_VARIANTS)},
        "training": {k: v for k, v in summary.items() if k != "history"},
    }
    manifest = ModelManifest(name="demo-en-commands", architecture=SENSEVOICE.architecture, dimensions=model.dims.to_dict(),
                             files={}, source=source, languages=dict(LANGUAGES), notice=demo_notice())
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        stage = write_model_dir(model, tokens, work / out.name, manifest, ("fp32", "int8"))
        items = synth_eval_set(args.eval_utterances, options.seed, options.seed, options.utterances, options.workers)
        results = [evaluate(stage, items, p, threads=options.threads) for p in ("fp32", "int8")]
        source["heldout"] = {r.precision: {"wer": round(r.wer, 4), "sentence_accuracy": round(r.sentence_accuracy, 4),
                                           "utterances": r.utterances, "words": r.words} for r in results}
        source["total_minutes"] = round((time.monotonic() - started) / 60, 1)
        manifest = dataclasses.replace(read_model_directory(stage).manifest, source=source)
        write_model_directory(stage, manifest, tokens)
        write_model_card(stage / "README.md", manifest, tokens, results, summary.get("history", []))
        for r in results:
            print(f"held-out {r.precision}: WER {r.wer:.2%}, sentence accuracy {r.sentence_accuracy:.2%}")
        if out.exists():
            out.rename(work / "previous")
        stage.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out} in {(time.monotonic() - started) / 60:.1f} min")
