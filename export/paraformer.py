"""`python -m export paraformer`: a released Paraformer-large (paraformer-zh) checkpoint, or seeded random
weights, to a self-describing model directory (ONNX graphs, tokens.txt, manifest.json).

A released directory holds model.pt, config.yaml, am.mvn and tokens.json (or tokens.txt). Only the plain
Paraformer is supported: SANMEncoder, CifPredictorV2 and ParaformerSANMDecoder; BiCif/SeACo/contextual
variants (LSTM timestamps, bias encoders) are refused with one line naming what the config describes.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.audio import FBANK_SHIFT, FBANK_WINDOW, LFR_SHIFT, LFR_WINDOW, N_MELS, SAMPLE_RATE
from pipeline.families import PARAFORMER
from pipeline.modeldir import ModelManifest

from .onnx_export import OPSET, Int8Recipe, write_model_dir
from .sensevoice import add_export_arguments, run_export

CHECKPOINT_FILES = ("model.pt", "config.yaml", "am.mvn")
TOKEN_FILES = ("tokens.json", "tokens.txt")
DEFAULT_SEED = 20261123
SUPPORTED = {"model": "Paraformer", "encoder": "SANMEncoder", "predictor": "CifPredictorV2",
             "decoder": "ParaformerSANMDecoder"}
# What the in-graph frontend computes (models/frontend.py); a config asking for anything else is refused.
FRONTEND = {"fs": SAMPLE_RATE, "window": "hamming", "n_mels": N_MELS, "frame_length": FBANK_WINDOW * 1000 // SAMPLE_RATE,
            "frame_shift": FBANK_SHIFT * 1000 // SAMPLE_RATE, "lfr_m": LFR_WINDOW, "lfr_n": LFR_SHIFT}  # ms, as config.yaml
RELEASE = "ModelScope's iic/speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch"
# Paraformer's int8 recipe, after FunASR's own (funasr/utils/export_utils.py `_onnx`, quantize=True:
# per-channel QUInt8 weights on MatMul, every node named "output" left float): per-channel weights, and the
# decoder's projection to the vocabulary left float. The CIF weight projection, FunASR's other "output", is
# no MatMul here (models/paraformer.py computes it as a float32 row sum), so it stays float too. QInt8 rather
# than FunASR's QUInt8: the same agreement with fp32 on the released size, but onnxruntime's u8 x u8 kernels
# took 1.6-1.8 times the CPU time of u8 x s8 on this AVX-512 VNNI machine (docs/history.md,
# "Fidelity"). Our old per-tensor QInt8 of every MatMul moved the token count on 7 of 8 released-size
# clips (issue 40).
INT8 = Int8Recipe(per_channel=True, weight_type="QInt8", op_types=("MatMul",), float_modules=("decoder.output_layer",))
SYNTHETIC_WORDS = ("open", "the", "window", "please", "now", "hel@@", "lo")


def synthetic_tokens(vocab_size: int) -> list[str]:
    """A placeholder vocabulary laid out like the released one: <blank>, <s>, </s>, Chinese characters,
    a few English words and pieces, and <unk> last."""
    count = vocab_size - 4 - len(SYNTHETIC_WORDS)
    if count < 8:
        raise ValueError(f"vocab_size {vocab_size} is too small for a synthetic vocabulary")
    chinese = [chr(0x4E00 + i) for i in range(count)]
    return ["<blank>", "<s>", "</s>"] + chinese + list(SYNTHETIC_WORDS) + ["<unk>"]


def random_model(size: str, seed: int):
    """Seeded random weights and a fixed synthetic CMVN; deterministic for a given size and seed."""
    import torch

    from models.paraformer import Paraformer, ParaformerDimensions

    dims = ParaformerDimensions.preset(size)
    torch.manual_seed(seed)
    model = Paraformer(dims)
    k = np.arange(dims.input_size) % 80  # typical log-mel magnitudes, so the encoder sees unit-scale inputs
    model.set_cmvn(-(8.0 + 4.0 * np.cos(np.pi * k / 80)), np.full(dims.input_size, 0.3))
    return model.eval(), synthetic_tokens(dims.vocab_size)


def read_funasr_config(directory: Path, files: tuple[str, ...], release: str) -> dict:
    """A FunASR release directory's config.yaml, once `files` are all there (every exporter of a FunASR release:
    this one, export/ct_punc.py); each problem one FileNotFoundError or ValueError line."""
    import yaml

    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory")
    for name in files:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory}: {name} is missing (expected a released {release} directory)")
    path = directory / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable YAML file ({type(exc).__name__})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a FunASR model configuration")
    return config


def read_config(directory: Path) -> dict:
    config = read_funasr_config(directory, CHECKPOINT_FILES, "Paraformer")
    path = directory / "config.yaml"
    described = {key: config.get(key) for key in SUPPORTED}
    wrong = {k: v for k, v in described.items() if v != SUPPORTED[k]}
    if wrong:
        found = ", ".join(f"{k} {v}" for k, v in wrong.items())
        raise ValueError(f"{path} describes {found}: only the plain Paraformer-large (Paraformer with SANMEncoder, "
                         f"CifPredictorV2 and ParaformerSANMDecoder: {RELEASE}) is supported, not its SeACo, BiCif "
                         "or contextual variants (FunASR's `paraformer-zh` alias downloads SeACo-Paraformer)")
    frontend = config.get("frontend_conf") or {}
    mismatched = [f"{k} {frontend[k]!r} (expected {v!r})" for k, v in FRONTEND.items() if k in frontend and frontend[k] != v]
    if mismatched:
        raise ValueError(f"{path}: frontend_conf {', '.join(mismatched)} differs from the in-graph frontend")
    return config


def dimensions_from_checkpoint(config: dict, state: dict):
    """Geometry from the tensors themselves; heads, shifts and CIF constants from config.yaml."""
    from models.frontend import FEATURE_SIZE
    from models.paraformer import ParaformerDimensions

    required = ("encoder.encoders0.0.norm1.weight", "encoder.encoders0.0.feed_forward.w_1.weight",
                "encoder.encoders0.0.self_attn.fsmn_block.weight", "predictor.cif_conv1d.weight",
                "decoder.output_layer.weight", "decoder.decoders3.0.feed_forward.w_1.weight",
                "decoder.decoders.0.self_attn.fsmn_block.weight")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint does not match the model: {len(missing)} missing: {', '.join(missing)}")
    input_size = state["encoder.encoders0.0.norm1.weight"].shape[0]
    if input_size != FEATURE_SIZE:
        raise ValueError(f"checkpoint takes {input_size} input features; the frontend makes {FEATURE_SIZE} (LFR 7 x 80)")
    encoder, decoder = config.get("encoder_conf") or {}, config.get("decoder_conf") or {}
    predictor = config.get("predictor_conf") or {}
    if float(predictor.get("threshold", 1.0)) != 1.0:
        raise ValueError(f"predictor threshold {predictor['threshold']} is not supported (CIF fires at 1.0)")

    def count(prefix: str) -> int:
        return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})

    decoder_blocks = count("decoder.decoders.")
    if count("decoder.decoders2.") or int(decoder.get("att_layer_num", decoder_blocks)) != decoder_blocks:
        raise ValueError("decoder layers without cross-attention (decoders2) are not supported")
    vocab, size = state["decoder.output_layer.weight"].shape
    return ParaformerDimensions(
        input_size=input_size, output_size=size, attention_heads=int(encoder.get("attention_heads", 4)),
        linear_units=state["encoder.encoders0.0.feed_forward.w_1.weight"].shape[0],
        num_blocks=1 + count("encoder.encoders."),
        kernel_size=state["encoder.encoders0.0.self_attn.fsmn_block.weight"].shape[-1],
        sanm_shift=int(encoder.get("sanm_shfit", 0)),
        decoder_attention_heads=int(decoder.get("attention_heads", 4)),
        decoder_linear_units=state["decoder.decoders3.0.feed_forward.w_1.weight"].shape[0],
        decoder_blocks=decoder_blocks,
        decoder_kernel_size=state["decoder.decoders.0.self_attn.fsmn_block.weight"].shape[-1],
        decoder_sanm_shift=int(decoder.get("sanm_shfit", 0)),
        predictor_l_order=int(predictor.get("l_order", 1)), predictor_r_order=int(predictor.get("r_order", 1)),
        tail_threshold=float(predictor.get("tail_threshold", 0.45)),
        smooth_factor=float(predictor.get("smooth_factor", 1.0)),
        noise_threshold=float(predictor.get("noise_threshold", 0.0)),
        vocab_size=vocab,
    )


def checkpoint_tokens(directory: Path, vocab_size: int, layer: str = "output layer",
                      names: tuple[str, ...] = TOKEN_FILES) -> list[str]:
    """tokens.json (a JSON list, as released) or tokens.txt (one token per line); as many as the checkpoint's
    `layer` has rows."""
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if name.endswith(".json"):
            try:
                tokens = json.loads(text)
            except ValueError:
                raise ValueError(f"{path}: not valid JSON") from None
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise ValueError(f"{path}: expected a JSON list of token strings")
        else:
            lines = text.split("\n")
            if lines and lines[-1] == "":  # the final newline
                lines.pop()
            tokens = [line.split()[0] if line.split() else line for line in lines]  # "token" or "token id"
        if len(tokens) != vocab_size:
            raise ValueError(f"{path} has {len(tokens)} tokens but the checkpoint's {layer} has {vocab_size}")
        return tokens
    raise FileNotFoundError(f"{directory}: no {' or '.join(names)} (the token list is needed to serve text)")


def checkpoint_model(directory: Path):
    """Load a released model directory strictly; every problem is one ValueError/FileNotFoundError line."""
    from models.frontend import read_am_mvn
    from models.paraformer import Paraformer
    from models.sensevoice import load_checkpoint_state, load_state_strict

    config = read_config(directory)
    state = load_checkpoint_state(directory / "model.pt")
    dims = dimensions_from_checkpoint(config, state)
    tokens = checkpoint_tokens(directory, dims.vocab_size)
    model = Paraformer(dims)
    load_state_strict(model, state)
    model.set_cmvn(*read_am_mvn(directory / "am.mvn"))
    return model.eval(), tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_export_arguments(parser, "released model directory (model.pt, config.yaml, am.mvn, tokens.json)", DEFAULT_SEED)


def run(args: argparse.Namespace) -> int:
    return run_export(args, "paraformer", "paraformer-large", export_checkpoint, random_model, _write)


def export_checkpoint(directory: Path, out: Path, precisions: tuple[str, ...], name: str, source: dict,
                      container: float = 30.0) -> Path:
    """A released checkpoint directory to the model directory `out` (written atomically); the exporter
    contract of pipeline/catalog.py, which `python -m export pull` calls."""
    model, tokens = checkpoint_model(Path(directory))
    return _write(model, tokens, out, precisions, name, source, container)


def _write(model, tokens: list[str], out: Path, precisions: tuple[str, ...], name: str, source: dict,
           container: float, notice: str = "") -> Path:
    manifest = ModelManifest(
        name=name, architecture=PARAFORMER.architecture, notice=notice, dimensions=model.dims.to_dict(), files={},
        source=source, container_seconds=container, prompt_frames=0, languages={"auto": 0, "zh": 0, "en": 0}, tag_tokens={},
        opset=OPSET,
    )
    return write_model_dir(model, tokens, out, manifest, precisions, int8=INT8)
