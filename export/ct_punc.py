"""`python -m export ct-punc --checkpoint DIR | --random-init tiny|full --out DIR`: FunASR's CT-Transformer
punctuation model (ct-punc) to a model directory (pipeline/punctuation.py runs it).

    DIR/model.onnx       token_ids int32 [batch, tokens], token_lengths int32 [batch]
                         -> punc_logits float32 [batch, tokens, classes] (zero past each length)
    DIR/model.int8.onnx  the same with per-channel 7-bit weights on the encoder's MatMuls
    DIR/tokens.txt       the vocabulary, one word a line
    DIR/manifest.json    architecture "ct-transformer"; dimensions: models.ct_punc.CTPuncDimensions (with the
                         punctuation classes and the sentence-end class) and the vocabulary's unknown symbol
`batch` and `tokens` are free: the runtime pads each call into a word container (pipeline/shapes.py), and
`python -m export verify DIR` checks that a sentence padded gives what it gives alone (export/verify_ct_punc.py).

A released directory (Hugging Face's funasr/ct-punc, the 471,067-word zh-en model, or ModelScope's 272,727-word
punc_ct-transformer_zh-cn-common-vocab272727-pytorch, FunASR's "ct-punc-c") holds model.pt, config.yaml and
tokens.json. Refused, each in one line: another model or encoder than CTTransformer with a "pe" SANMEncoder, a
jieba dictionary beside them (ModelScope's copy of the zh-en model has one: FunASR then splits Chinese text into
jieba's words, which pipeline/punctuation.py does not), a tokenizer with a segmentation dictionary.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from pipeline.families import CT_TRANSFORMER
from pipeline.modeldir import ONNX_FILES, PUNCTUATION_FREE_DIMENSIONS, ModelManifest

from .onnx_export import OPSET, Int8Recipe, quantize_int8, write_graphs_atomically
from .paraformer import checkpoint_tokens, read_funasr_config
from .sensevoice import parse_precisions, user_path

CHECKPOINT_FILES = ("model.pt", "config.yaml", "tokens.json")
DEFAULT_SEED = 20261201
PRECISIONS = ("fp32", "int8")
EXAMPLE_WORDS = 40  # the traced example's word rows (27 of them valid); the axis stays free
MAX_WORDS = 1 << 16
# The int8 recipe, after FunASR's own export (funasr/utils/export_utils.py `_onnx`, quantize=True: per-channel
# MatMul weights): per-channel 7-bit QInt8 MatMuls, the decoder (the projection to the classes, which decides
# each word's punctuation) kept float. The embedding table is a Gather, not a MatMul: it stays float32 as in
# FunASR's int8 graph, so int8 shrinks only the encoder (the released model is mostly its 272,727 x 256 table).
INT8 = Int8Recipe(per_channel=True, weight_type="QInt8", op_types=("MatMul",), float_modules=("decoder",))
UNK_SYMBOL = "<unk>"  # FunASR's CharTokenizer default
JIEBA_DICTIONARY = "jieba_usr_dict"
RANDOM_INIT_NOTICE = "Random weights: for speed and padding checks; it punctuates nothing."  # manifest notice
SUPPORTED = {"model": "CTTransformer", "encoder": "SANMEncoder"}
ENCODER = {"input_layer": "pe", "selfattention_layer_type": "sanm", "normalize_before": True,
           "pos_enc_class": "SinusoidalPositionEncoder"}  # what models/ct_punc.py computes
SYNTHETIC_WORDS = ("hello", "world", "open", "the", "window", "please", "ok", "it's")


def synthetic_tokens(vocab_size: int) -> list[str]:
    """A placeholder vocabulary for random weights: <blank>, <s>, </s>, Chinese characters (then the code points
    after them, the surrogates skipped: UTF-8 cannot write those, and the full size's 272,727 words reach them),
    a few English words, and <unk> last."""
    count = vocab_size - 4 - len(SYNTHETIC_WORDS)
    if count < 8:
        raise ValueError(f"vocab_size {vocab_size} is too small for a synthetic vocabulary")
    characters = (chr(c) for c in itertools.count(0x4E00) if not 0xD800 <= c <= 0xDFFF)
    return (["<blank>", "<s>", "</s>"] + list(itertools.islice(characters, count)) + list(SYNTHETIC_WORDS)
            + [UNK_SYMBOL])


def random_model(size: str, seed: int):
    import torch

    from models.ct_punc import CTPuncDimensions, CTTransformer

    dims = CTPuncDimensions.preset(size)
    torch.manual_seed(seed)
    return CTTransformer(dims).eval(), synthetic_tokens(dims.vocab_size)


def read_config(directory: Path) -> dict:
    config = read_funasr_config(directory, CHECKPOINT_FILES, "ct-punc")
    path = directory / "config.yaml"
    wrong = [f"{k} {config.get(k)!r}" for k, v in SUPPORTED.items() if config.get(k) != v]
    encoder = config.get("encoder_conf") or {}
    wrong += [f"encoder_conf.{k} {encoder[k]!r}" for k, v in ENCODER.items() if k in encoder and encoder[k] != v]
    if wrong:
        raise ValueError(f"{path} describes {', '.join(wrong)}: only FunASR's CTTransformer with a SANMEncoder "
                         "(input_layer pe, sanm attention, pre-norm), the released ct-punc, is supported")
    model_conf = config.get("model_conf") or {}
    # FunASR gives the model a jieba dictionary when the directory holds the file (funasr/download/
    # download_model_from_hub.py), and then splits Chinese text into jieba's words: not ported.
    if (directory / JIEBA_DICTIONARY).exists() or JIEBA_DICTIONARY in config or JIEBA_DICTIONARY in model_conf:
        raise ValueError(f"{directory} has a jieba dictionary ({JIEBA_DICTIONARY}): FunASR then splits Chinese "
                         "text into jieba's words (ModelScope's 471,067-word zh-en ct-punc), which the punctuation "
                         "runtime does not do; without it (Hugging Face's funasr/ct-punc, the 272,727-word "
                         "ct-punc-c) FunASR splits it into characters, as the runtime does")
    tokenizer = config.get("tokenizer_conf") or {}
    if config.get("tokenizer", "CharTokenizer") != "CharTokenizer" or tokenizer.get("seg_dict") or tokenizer.get(
            "seg_dict_file"):
        raise ValueError(f"{path}: tokenizer {config.get('tokenizer')!r} with {sorted(tokenizer)}: only a "
                         "CharTokenizer without a segmentation dictionary is supported")
    return config


def dimensions_from_checkpoint(config: dict, state: dict):
    """Geometry from the tensors; heads, shift, classes and the sentence-end class from config.yaml."""
    from models.ct_punc import CTPuncDimensions

    required = ("embed.weight", "encoder.after_norm.weight", "encoder.encoders0.0.feed_forward.w_1.weight",
                "encoder.encoders0.0.self_attn.fsmn_block.weight", "decoder.weight")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint does not match the model: {len(missing)} missing: {', '.join(missing)}")
    model_conf, encoder = config.get("model_conf") or {}, config.get("encoder_conf") or {}
    vocab, embed_unit = state["embed.weight"].shape
    if int(encoder.get("input_size", embed_unit)) != embed_unit:
        raise ValueError(f"encoder_conf.input_size {encoder['input_size']} is not the embeddings' width {embed_unit}")
    punc_list = model_conf.get("punc_list")
    if not isinstance(punc_list, list) or len(punc_list) != state["decoder.weight"].shape[0]:
        raise ValueError(f"model_conf.punc_list {punc_list!r} does not name the decoder's "
                         f"{state['decoder.weight'].shape[0]} classes")
    return CTPuncDimensions(
        vocab_size=vocab, embed_unit=embed_unit, output_size=state["encoder.after_norm.weight"].shape[0],
        attention_heads=int(encoder.get("attention_heads", 4)),
        linear_units=state["encoder.encoders0.0.feed_forward.w_1.weight"].shape[0],
        num_blocks=1 + len({k.split(".")[2] for k in state if k.startswith("encoder.encoders.")}),
        kernel_size=state["encoder.encoders0.0.self_attn.fsmn_block.weight"].shape[-1],
        sanm_shift=int(encoder.get("sanm_shfit", 0)), punc_list=tuple(str(p) for p in punc_list),
        sentence_end_id=int(model_conf.get("sentence_end_id", 3)))


def vocabulary(directory: Path, vocab_size: int, unk_symbol: str) -> list[str]:
    """tokens.json, one word per embedding row, with the tokenizer's unknown symbol among them."""
    tokens = checkpoint_tokens(directory, vocab_size, "embedding", ("tokens.json",))
    if unk_symbol not in tokens:
        raise ValueError(f"{directory / 'tokens.json'} has no unknown symbol {unk_symbol!r}")
    return tokens


def checkpoint_model(directory: Path):
    """A released directory loaded strictly -> (model, vocabulary, unknown symbol); every problem one line."""
    from models.ct_punc import CTTransformer
    from models.sensevoice import load_checkpoint_state, load_state_strict

    config = read_config(directory)
    state = load_checkpoint_state(directory / "model.pt")
    dims = dimensions_from_checkpoint(config, state)
    unk_symbol = str((config.get("tokenizer_conf") or {}).get("unk_symbol", UNK_SYMBOL))
    tokens = vocabulary(directory, dims.vocab_size, unk_symbol)
    model = CTTransformer(dims)
    load_state_strict(model, state)
    return model.eval(), tokens, unk_symbol


def export_graph(model, path: Path) -> None:
    """The model with free `batch` and `tokens` axes to one .onnx file."""
    import torch

    batch = torch.export.Dim(PUNCTUATION_FREE_DIMENSIONS[0], min=1, max=64)
    words = torch.export.Dim(PUNCTUATION_FREE_DIMENSIONS[1], min=2, max=MAX_WORDS)
    example = (torch.zeros(1, EXAMPLE_WORDS, dtype=torch.int32), torch.tensor([27], dtype=torch.int32))
    inputs, outputs = model.onnx_signature()
    dynamic = {inputs[0]: {0: batch, 1: words}, inputs[1]: {0: batch}}
    with torch.no_grad():
        program = torch.onnx.export(model.eval(), example, input_names=list(inputs), output_names=list(outputs),
                                    dynamic_shapes=dynamic, opset_version=OPSET, dynamo=True, verbose=False)
    program.save(str(path))


def write(model, tokens: list[str], out: Path, precisions: tuple[str, ...], name: str, source: dict,
          unk_symbol: str = UNK_SYMBOL, notice: str = "") -> Path:
    """Export `model` to the model directory `out` (write_graphs_atomically: the graph rules apply)."""
    unsupported = [p for p in precisions if p not in PRECISIONS]
    if unsupported:
        raise ValueError(f"ct-punc exports {' and '.join(PRECISIONS)} (not {unsupported[0]})")

    def build(directory: Path) -> None:
        export_graph(model, directory / ONNX_FILES["fp32"])
        if "int8" in precisions:
            missing = set(INT8.float_modules) - quantize_int8(directory / ONNX_FILES["fp32"],
                                                              directory / ONNX_FILES["int8"], INT8)
            if missing:  # a renamed module would silently be quantised
                raise ValueError(f"the int8 recipe keeps {', '.join(sorted(missing))} float, but the graph has none")
        if "fp32" not in precisions:
            (directory / ONNX_FILES["fp32"]).unlink()

    manifest = ModelManifest(
        name=name, architecture=CT_TRANSFORMER.architecture,
        dimensions=model.dims.to_dict() | {"unk_symbol": unk_symbol},
        files={p: ONNX_FILES[p] for p in precisions}, source=source, container_seconds=0.0, prompt_frames=0,
        languages={}, textnorms={}, opset=OPSET, notice=notice)
    return write_graphs_atomically(out, build, manifest, tokens)


def export_checkpoint(directory: Path, out: Path, precisions: tuple[str, ...], name: str, source: dict) -> Path:
    """A released checkpoint directory to the model directory `out` (written atomically); the exporter
    contract of pipeline/catalog.py, which `python -m export pull` calls."""
    model, tokens, unk_symbol = checkpoint_model(Path(directory))
    return write(model, tokens, out, precisions, name, source, unk_symbol)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", type=user_path,
                         help="a released ct-punc directory (model.pt, config.yaml, tokens.json)")
    weights.add_argument("--random-init", choices=("tiny", "full"), help="seeded random weights of this size")
    parser.add_argument("--out", type=user_path, required=True, help="model directory to create (must not exist)")
    parser.add_argument("--precision", default="fp32,int8", help="comma list of fp32, int8 (default fp32,int8)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for --random-init")
    parser.add_argument("--name", help="model name recorded in the manifest")


def run(args: argparse.Namespace) -> int:
    precisions = parse_precisions(args.precision)
    if args.out.exists():
        raise FileExistsError(f"{args.out} already exists (choose another --out or remove it)")
    if args.checkpoint is not None:
        source = {"kind": "checkpoint", "path": str(args.checkpoint.resolve())}
        out = export_checkpoint(args.checkpoint, args.out, precisions, args.name or "ct-punc", source)
    else:
        model, tokens = random_model(args.random_init, args.seed)
        source = {"kind": "random-init", "size": args.random_init, "seed": args.seed,
                  "note": "random weights and synthetic words: for speed and padding checks, not punctuation"}
        out = write(model, tokens, args.out, precisions, args.name or f"ct-punc-random-{args.random_init}", source,
                    notice=RANDOM_INIT_NOTICE)
    print(f"wrote {out} ({', '.join(precisions)})")
    return 0
