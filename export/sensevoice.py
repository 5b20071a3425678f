"""`python -m export sensevoice`: a released SenseVoiceSmall checkpoint, or seeded random weights, to a
self-describing model directory (ONNX graphs, tokens.txt, manifest.json)."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.families import SENSEVOICE
from pipeline.modeldir import PRECISIONS, ModelManifest

from .onnx_export import MAX_EXPORT_SAMPLES, OPSET, tag_token_ids, write_model_dir

log = logging.getLogger(__name__)

CHECKPOINT_FILES = ("model.pt", "am.mvn")
DEFAULT_SEED = 20260204
RANDOM_INIT_NOTICE = "Random weights: for speed and padding checks; it recognises no speech."  # manifest notice
# Synthetic vocabulary: SenseVoice's special tokens at their released ids where known.
RELEASED_TAG_IDS = {
    24884: "<|zh|>", 24885: "<|en|>", 24888: "<|yue|>", 24892: "<|ja|>", 24896: "<|ko|>", 24992: "<|nospeech|>",
    24993: "<|Speech|>", 24994: "<|BGM|>", 24995: "<|Laughter|>", 24996: "<|Applause|>",
    25001: "<|HAPPY|>", 25002: "<|SAD|>", 25003: "<|ANGRY|>", 25004: "<|NEUTRAL|>", 25009: "<|EMO_UNKNOWN|>",
    25016: "<|withitn|>", 25017: "<|woitn|>",
}
SMALL_TAGS = ("<|zh|>", "<|en|>", "<|yue|>", "<|ja|>", "<|ko|>", "<|nospeech|>", "<|HAPPY|>", "<|SAD|>",
              "<|ANGRY|>", "<|NEUTRAL|>", "<|EMO_UNKNOWN|>", "<|Speech|>", "<|BGM|>", "<|withitn|>", "<|woitn|>")


def synthetic_tokens(vocab_size: int) -> list[str]:
    """A placeholder vocabulary for random weights: <unk>, word pieces, and the SenseVoice tags."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(3, vocab_size)]
    if vocab_size > max(RELEASED_TAG_IDS):
        for i, tag in RELEASED_TAG_IDS.items():
            tokens[i] = tag
    else:
        if vocab_size < len(SMALL_TAGS) + 8:
            raise ValueError(f"vocab_size {vocab_size} is too small for the tag tokens")
        tokens[vocab_size - len(SMALL_TAGS):] = SMALL_TAGS
    return tokens[:vocab_size]


def random_model(size: str, seed: int):
    """Seeded random weights and a fixed synthetic CMVN; deterministic for a given size and seed."""
    import torch

    from models.sensevoice import ModelDimensions, SenseVoice

    dims = ModelDimensions.preset(size)
    torch.manual_seed(seed)
    model = SenseVoice(dims)
    # Typical magnitudes of log-mel statistics, so the random encoder sees unit-scale inputs.
    k = np.arange(dims.input_size) % 80
    model.set_cmvn(-(8.0 + 4.0 * np.cos(np.pi * k / 80)), np.full(dims.input_size, 0.3))
    return model.eval(), synthetic_tokens(dims.vocab_size)


def checkpoint_model(directory: Path):
    """Load a released model directory (model.pt, am.mvn, *.bpe.model, config.yaml) strictly."""
    import torch  # noqa: F401  (imported for its side effects on the first torch.load)

    from models.frontend import read_am_mvn
    from models.sensevoice import ModelDimensions, SenseVoice, load_checkpoint_state, load_state_strict

    for name in CHECKPOINT_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory}: {name} is missing (expected a released SenseVoiceSmall directory)")
    state = load_checkpoint_state(directory / "model.pt")
    dims = dimensions_from_checkpoint(directory, state, ModelDimensions)
    model = SenseVoice(dims)
    load_state_strict(model, state)
    model.set_cmvn(*read_am_mvn(directory / "am.mvn"))
    return model.eval(), checkpoint_tokens(directory, dims.vocab_size)


def dimensions_from_checkpoint(directory: Path, state: dict, dimensions_class):
    """Geometry from the tensors themselves; attention heads (not visible in shapes) from config.yaml."""
    required = ("ctc.ctc_lo.weight", "encoder.encoders0.0.feed_forward.w_1.weight", "embed.weight",
                "encoder.encoders0.0.self_attn.fsmn_block.weight")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint does not match the model: {len(missing)} missing: {', '.join(missing)}")
    heads = 4
    config = directory / "config.yaml"
    if config.is_file():
        import yaml

        conf = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        heads = int((conf.get("encoder_conf") or {}).get("attention_heads", heads))
    def count(prefix: str) -> int:
        return len({k.split(".")[2] for k in state if k.startswith(prefix)})
    vocab, size = state["ctc.ctc_lo.weight"].shape
    return dimensions_class(
        input_size=state["embed.weight"].shape[1], output_size=size, attention_heads=heads,
        linear_units=state["encoder.encoders0.0.feed_forward.w_1.weight"].shape[0],
        num_blocks=1 + count("encoder.encoders."), tp_blocks=count("encoder.tp_encoders."),
        kernel_size=state["encoder.encoders0.0.self_attn.fsmn_block.weight"].shape[-1],
        vocab_size=vocab, prompt_rows=state["embed.weight"].shape[0],
    )


def checkpoint_tokens(directory: Path, vocab_size: int) -> list[str]:
    models = sorted(directory.glob("*.bpe.model"))
    if not models:
        raise FileNotFoundError(f"{directory}: no sentencepiece *.bpe.model (needed for the token list)")
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(models[0]))
    tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    if len(tokens) != vocab_size:
        raise ValueError(f"{models[0].name} has {len(tokens)} pieces but the checkpoint's CTC layer has {vocab_size}")
    return tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_export_arguments(parser, "released model directory (model.pt, am.mvn, *.bpe.model, config.yaml)", DEFAULT_SEED)


def add_export_arguments(parser: argparse.ArgumentParser, checkpoint_help: str, seed: int) -> None:
    """Every family's export command: a checkpoint or random weights in, a model directory out."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=user_path, help=checkpoint_help)
    source.add_argument("--random-init", choices=("full", "tiny"), help="seeded random weights of this size")
    parser.add_argument("--out", type=user_path, required=True, help="model directory to create (must not exist)")
    parser.add_argument("--precision", default="fp32,int8", help=f"comma list of {', '.join(PRECISIONS)} (default fp32,int8)")
    parser.add_argument("--container", type=float, default=30.0, help="default container length in seconds (default 30)")
    parser.add_argument("--seed", type=int, default=seed, help="seed for --random-init")
    parser.add_argument("--name", help="model name recorded in the manifest")


def user_path(text: str) -> Path:
    """A path flag: "~/SenseVoiceSmall" works where the shell leaves "~" alone (cmd, Windows PowerShell)."""
    return Path(text).expanduser()


def parse_precisions(text: str) -> tuple[str, ...]:
    """"fp32,int8" -> ("fp32", "int8"); ValueError naming an unknown one."""
    precisions = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise ValueError(f"unknown precision {bad[0] if bad else '(none)'!r}: choose from {', '.join(PRECISIONS)}")
    return precisions


def run(args: argparse.Namespace) -> int:
    return run_export(args, "sensevoice", "sensevoice-small", export_checkpoint, random_model, _write)


def run_export(args: argparse.Namespace, family: str, checkpoint_name: str, export_checkpoint, random_model,
               write) -> int:
    """The `python -m export <family>` command of every model family: a released checkpoint or seeded random
    weights (`--random-init`, which get RANDOM_INIT_NOTICE) into a new model directory."""
    precisions = parse_precisions(args.precision)
    if not 0 < args.container <= MAX_EXPORT_SAMPLES / SAMPLE_RATE:  # also refuses nan
        raise ValueError(f"--container {args.container:g}: give a length in seconds, more than 0 and at most "
                         f"{MAX_EXPORT_SAMPLES / SAMPLE_RATE:g}")
    if args.out.exists():
        raise FileExistsError(f"{args.out} already exists (choose another --out or remove it)")
    if args.checkpoint is not None:
        source = {"kind": "checkpoint", "path": str(args.checkpoint.resolve())}
        out = export_checkpoint(args.checkpoint, args.out, precisions, args.name or checkpoint_name, source,
                                args.container)
    else:
        model, tokens = random_model(args.random_init, args.seed)
        source = {"kind": "random-init", "size": args.random_init, "seed": args.seed,
                  "note": "random weights and synthetic tokens: for speed and padding checks, not recognition"}
        out = write(model, tokens, args.out, precisions, args.name or f"{family}-random-{args.random_init}",
                    source, args.container, notice=RANDOM_INIT_NOTICE)
    print(f"wrote {out} ({', '.join(precisions)})")
    return 0


def export_checkpoint(directory: Path, out: Path, precisions: tuple[str, ...], name: str, source: dict,
                      container: float = 30.0) -> Path:
    """A released checkpoint directory to the model directory `out` (written atomically); the exporter
    contract of pipeline/catalog.py, which `python -m export pull` calls."""
    model, tokens = checkpoint_model(Path(directory))
    return _write(model, tokens, out, precisions, name, source, container)


def _write(model, tokens: list[str], out: Path, precisions: tuple[str, ...], name: str, source: dict,
           container: float, notice: str = "") -> Path:
    """`notice`: the manifest's line for the page and the log; a released checkpoint needs none (its name
    and languages say what it is)."""
    manifest = ModelManifest(
        name=name, architecture=SENSEVOICE.architecture, dimensions=model.dims.to_dict(), files={}, source=source,
        container_seconds=container, tag_tokens=tag_token_ids(tokens), opset=OPSET, notice=notice,
    )
    return write_model_dir(model, tokens, out, manifest, precisions)
