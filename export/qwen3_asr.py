"""`python -m export qwen3-asr --checkpoint CKPT | --random-init tiny|0.6b|1.7b --out DIR`: Qwen3-ASR as three
ONNX graphs (a released checkpoint: export/qwen3_checkpoint.py).

    DIR/encoder.onnx   audio float32 [1, windows * window samples], audio_lengths int32 [1]
                       -> audio_embeds float32 [1, windows * window tokens, H], audio_token_lengths int64 [1]
    DIR/prefill.onnx   prompt_ids int64 [1, prompt], prompt_lengths int64 [1], audio_embeds [1, audio_tokens, H]
                       -> logits float32 [1, V], keys, values float32 [layers, 1, kv_heads, prompt, head_dim]
    DIR/step.onnx      token_ids int64 [1, 1], positions int64 [1], cache_keys, cache_values
                       [layers, 1, kv_heads, cache, head_dim] -> logits [1, V], keys, values [.., 1, head_dim]
    DIR/*.int8.onnx    the same with 8-bit MatMul weights (export/qwen3_quantize.py; on request: it does not
                       keep fp32's answer, so the CPU default is fp32)
    DIR/*.fp16.onnx    the same in fp16 (the GPU precision): audio in, the log-mel, RoPE angles and logits
                       stay float32; audio_embeds, keys, values and the caches are float16
    DIR/merges.txt     the tokenizer's merges, copied from a checkpoint that has them (to encode hotwords)
    DIR/manifest.json  architecture "qwen3-asr"; dimensions: models.qwen3_asr.Qwen3ASRDimensions plus
                       "shapes" (pipeline/families/qwen3_asr/decoding.py's Qwen3Shapes); graphs: precision -> graph -> file
The free axes (windows, prompt, audio_tokens, cache) are fixed per session by the server, at the shapes
of the manifest; verification also runs them at a clip's own size. The container is a whole number of
attention windows (8 s for the released models), so the default 30 s becomes 32 s.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

from pipeline.audio import SAMPLE_RATE
from pipeline.catalog import QWEN3_ASR_0_6B
from pipeline.families import QWEN3_ASR
from pipeline.families.qwen3_asr.bpe import MERGES_FILE
from pipeline.families.qwen3_asr.decoding import ENCODER, PREFILL, STEP, Qwen3Shapes
from pipeline.families.qwen3_asr.runtime import CONTENT_NAME_PREFIX
from pipeline.modeldir import ModelManifest
from pipeline.families.qwen3_asr.text import ASR_TEXT_TAG, LANGUAGE_CODES

from .graph_weights import quantize_int8_streaming, rename_weights_by_content
from .onnx_export import OPSET, needs_external_data, write_graphs_atomically
from .qwen3_quantize import DEFAULT_RECIPE, RECIPES, Qwen3Int8Recipe, quantize_graph
from .sensevoice import RANDOM_INIT_NOTICE, parse_precisions, user_path

DEFAULT_SEED = 20261124
SYNTHETIC_LANGUAGE_IDS = 100  # random weights' "language" id; "<asr_text>" and the names follow it
DEFAULT_MAX_NEW_TOKENS = 256
# Prompt slots kept for a context (hotwords; pipeline/families/qwen3_asr/context.py), so that a prompt with one keeps the
# fixed shape. On the CPU prefill runs over the prompt in use, so the room costs nothing without a context;
# a GPU's prefill and cache always span it.
DEFAULT_CONTEXT_TOKENS = 128
# --random-init draws every parameter, biases and norm gains included: norms of exactly 1 and biases of 0
# hide the per-channel outliers that make int8 hard (issue 39), so the random checks would flatter it.
RANDOM_BIAS_STD = 0.1
# An int8 graph's weights past this go to external data, written a weight at a time: held inline, the graph
# is serialised whole in memory (0.6B's fp32 + int8 export peaked at 10.6 GiB that way, 4.6 GiB streamed).
INT8_INLINE_BYTES = 256 << 20
RANDOM_NORM_LOG_STD = 0.5  # gains exp(N(0, 0.5)): 0.22 to 4.5 at three sigma
GRAPH_FILES = {"fp32": {g: f"{g}.onnx" for g in (ENCODER, PREFILL, STEP)},
               "int8": {g: f"{g}.int8.onnx" for g in (ENCODER, PREFILL, STEP)},
               "fp16": {g: f"{g}.fp16.onnx" for g in (ENCODER, PREFILL, STEP)}}


class EncoderGraph(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio, audio_lengths):
        return self.model.encode(*self.model.features(audio, audio_lengths))


class PrefillGraph(EncoderGraph):
    def forward(self, prompt_ids, prompt_lengths, audio_embeds):
        return self.model.prefill(prompt_ids, prompt_lengths, audio_embeds)


class StepGraph(EncoderGraph):
    def forward(self, token_ids, positions, cache_keys, cache_values):
        return self.model.step(token_ids, positions, cache_keys, cache_values)


def window_samples(dims) -> int:
    return dims.audio.n_window_infer * SAMPLE_RATE // 100  # 100 mel frames a second


def serving_shapes(model, container_seconds: float, max_new_tokens: int) -> Qwen3Shapes:
    from models.qwen3_asr import prompt_capacity

    dims = model.dims
    windows = max(1, math.ceil(container_seconds * SAMPLE_RATE / window_samples(dims)))
    prompt_slots = prompt_capacity(dims, windows * dims.audio.window_tokens)
    return Qwen3Shapes(windows * window_samples(dims), prompt_slots, prompt_slots + max_new_tokens, max_new_tokens)


def export_graphs(model, directory: Path, shapes: Qwen3Shapes, precision: str = "fp32",
                  external_data: bool | None = None) -> None:
    """The three graphs of `precision` (fp32 or fp16, the model's own dtype) into `directory`, each with
    its free axes; their weights in "<file>.data" with `external_data` (default: past protobuf's 2 GB)."""
    dims = model.dims
    dtype = model.thinker.lm_head.weight.dtype
    windows = torch.export.Dim("windows", min=1, max=max(2, 600 * SAMPLE_RATE // window_samples(dims)))
    prompt, audio_tokens = torch.export.Dim("prompt", min=2, max=65536), torch.export.Dim("audio_tokens", min=1, max=65536)
    cache = torch.export.Dim("cache", min=2, max=65536)
    text = dims.text
    audio_slots = shapes.container_samples // window_samples(dims) * dims.audio.window_tokens
    cache_shape = (text.num_hidden_layers, 1, text.num_key_value_heads, shapes.cache_slots, text.head_dim)
    graphs = {
        ENCODER: (EncoderGraph(model), (torch.zeros(1, shapes.container_samples),
                                        torch.tensor([shapes.container_samples], dtype=torch.int32)),
                  ("audio", "audio_lengths"), ("audio_embeds", "audio_token_lengths"),
                  {"audio": {1: window_samples(dims) * windows}, "audio_lengths": {}}),
        PREFILL: (PrefillGraph(model), (torch.zeros(1, shapes.prompt_slots, dtype=torch.int64),
                                        torch.tensor([shapes.prompt_slots]),
                                        torch.zeros(1, audio_slots, text.hidden_size, dtype=dtype)),
                  ("prompt_ids", "prompt_lengths", "audio_embeds"), ("logits", "keys", "values"),
                  {"prompt_ids": {1: prompt}, "prompt_lengths": {}, "audio_embeds": {1: audio_tokens}}),
        STEP: (StepGraph(model), (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([shapes.prompt_slots]),
                                  torch.zeros(cache_shape, dtype=dtype), torch.zeros(cache_shape, dtype=dtype)),
               ("token_ids", "positions", "cache_keys", "cache_values"), ("logits", "keys", "values"),
               {"token_ids": {}, "positions": {}, "cache_keys": {3: cache}, "cache_values": {3: cache}}),
    }
    # Past protobuf's 2 GB (the 0.6B decoder: 2.4 GB in fp32) the weights go to "<file>.data".
    external_data = needs_external_data(model) if external_data is None else external_data
    for name, (graph, example, inputs, outputs, dynamic) in graphs.items():
        with torch.no_grad():
            program = torch.onnx.export(graph.eval(), example, input_names=list(inputs), output_names=list(outputs),
                                        dynamic_shapes=dynamic, opset_version=OPSET, dynamo=True, verbose=False)
        program.save(str(directory / GRAPH_FILES[precision][name]), external_data=external_data)
        del program  # before the next graph's: one exported program at a time
        gc.collect()


def name_weights_by_content(path: Path) -> None:
    """Rename each initializer of the graph at `path` to a hash of its content (CONTENT_NAME_PREFIX + sha1),
    merging identical ones. torch.onnx names weights val_N, differently in each graph; named by content,
    prefill and step give their shared decoder weights the same names, and the engine loads them once.
    A tensor at a time (export/graph_weights.py): the graph's weights are never all in memory."""
    rename_weights_by_content(path, CONTENT_NAME_PREFIX)


def release_weights(model) -> None:
    """Free what can be freed of the model's weights once its graphs are written. torch.onnx keeps references
    to them after the export (moving the module to the meta device alone freed nothing), so each storage is
    shrunk to nothing where torch allows it (not those it has handed to numpy: most MatMul weights), then
    the tensors go to the meta device: a spent model fails loudly if used."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.untyped_storage().resizable():  # not the few constants made from numpy arrays
                tensor.untyped_storage().resize_(0)
    model.to(torch.device("meta"))
    gc.collect()


def synthetic_languages() -> dict[str, tuple[int, ...]]:
    """Forced-language ids for random weights, laid out as a tokenizer's: "language", " <Name>", "<asr_text>"
    (synthetic_tokens names them, so the text reads as the real model's would)."""
    return {code: (SYNTHETIC_LANGUAGE_IDS, SYNTHETIC_LANGUAGE_IDS + 2 + i, SYNTHETIC_LANGUAGE_IDS + 1)
            for i, code in enumerate(LANGUAGE_CODES.values())}


def synthetic_tokens(dims) -> list[str]:
    """Random weights carry no tokenizer: <|tok{i}|> for every id, the prompt's own ids named for their role."""
    prompt = dims.prompt
    tokens = [f"<|tok{i}|>" for i in range(dims.text.vocab_size)]
    tokens[prompt.audio_token_id] = "<|audio_pad|>"
    tokens[prompt.prefix[-1]], tokens[prompt.suffix[0]] = "<|audio_start|>", "<|audio_end|>"
    tokens[prompt.eos_token_ids[0]], tokens[prompt.eos_token_ids[-1]] = "<|im_end|>", "<|endoftext|>"
    names = {code: name.capitalize() for name, code in LANGUAGE_CODES.items()}
    for code, (word, name, tag) in prompt.languages.items():
        tokens[word], tokens[name], tokens[tag] = "language", "Ġ" + names[code], ASR_TEXT_TAG
    return tokens


def synthetic_dimensions(size: str):
    """The `size` preset's dimensions with synthetic_languages as its forced languages (random weights carry
    no tokenizer)."""
    from models.qwen3_asr import Qwen3ASRDimensions

    dims = Qwen3ASRDimensions.preset(size)
    return dataclasses.replace(dims, prompt=dataclasses.replace(dims.prompt, languages=synthetic_languages()))


def random_model(size: str, seed: int):
    from models.qwen3_asr import Qwen3ASR

    torch.manual_seed(seed)
    model = Qwen3ASR(synthetic_dimensions(size)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.dim() >= 2:  # unit-scale activations: N(0, 1/fan_in) (torch's default init is smaller)
                parameter.copy_(noise / parameter[0].numel() ** 0.5)
            elif name.endswith("bias"):
                parameter.copy_(RANDOM_BIAS_STD * noise)
            else:  # a norm's gain: positive, spread per channel (channel outliers, as trained models have)
                parameter.copy_(torch.exp(RANDOM_NORM_LOG_STD * noise))
    return model


def write(model, tokens: list[str], out: Path, precisions: tuple[str, ...], name: str, source: dict,
          container: float, max_new_tokens: int, notice: str = "", context_tokens: int = DEFAULT_CONTEXT_TOKENS,
          copies: tuple[Path, ...] = (), int8_recipe: Qwen3Int8Recipe = RECIPES[DEFAULT_RECIPE],
          external_data: bool | None = None) -> Path:
    """Export `model` to the model directory `out`; `copies`: files copied into it as they are (the
    tokenizer's merges). The model is spent: fp16 halves it in place (no copy) and its weights are released
    once its graphs are written; int8 is then made from the fp32 files by `int8_recipe`
    (export/qwen3_quantize.py), "per-tensor" a weight at a time (export/graph_weights.py), so the export's
    peak is about the model once, not the model plus copies of a graph (docs/benchmarks.md).
    `external_data`: weights in "<graph>.data" files (default: when the fp32 weights pass protobuf's 2 GB;
    int8 graphs by their own size)."""
    unsupported = [p for p in precisions if p not in GRAPH_FILES]
    if unsupported:
        raise ValueError(f"qwen3-asr exports {', '.join(GRAPH_FILES)} (not {unsupported[0]} yet)")
    model.dims = dataclasses.replace(model.dims, prompt=dataclasses.replace(model.dims.prompt,
                                                                            context_tokens=context_tokens))
    shapes = serving_shapes(model, container, max_new_tokens)

    external = needs_external_data(model) if external_data is None else external_data
    # int8 weights are a quarter of fp32's: they go to "<graph>.data" past protobuf's limit on their own
    int8_external_bytes = INT8_INLINE_BYTES if external_data is None else 0 if external_data else sys.maxsize
    dims = model.dims

    def build(directory: Path) -> None:
        for path in copies:
            shutil.copyfile(path, directory / path.name)
        export_graphs(model, directory, shapes, external_data=external)
        if "fp16" in precisions:  # from PyTorch, as SenseVoice's: a converter would keep the log-mel float32
            export_graphs(model.half_model(), directory, shapes, "fp16", external_data=external)
        release_weights(model)
        if "int8" in precisions:
            for graph, file in GRAPH_FILES["int8"].items():
                src, dst = directory / GRAPH_FILES["fp32"][graph], directory / file
                if int8_recipe in (RECIPES["per-tensor"], RECIPES["per-channel"]):  # quantize_dynamic's graph,
                    quantize_int8_streaming(src, dst, int8_external_bytes,  # without its copies
                                            per_channel=int8_recipe == RECIPES["per-channel"])
                else:
                    quantize_graph(src, dst, graph, int8_recipe)
        for precision in precisions:
            for graph in (PREFILL, STEP):
                name_weights_by_content(directory / GRAPH_FILES[precision][graph])
        if "fp32" not in precisions:
            for file in GRAPH_FILES["fp32"].values():
                for path in directory.glob(f"{file}*"):  # the graph and its external weights
                    path.unlink()

    # how prompt and cache follow a clip is the server's choice, not the export's
    exported = {k: v for k, v in vars(shapes).items() if k not in ("cache_step", "prompt_step")}
    manifest_dims = dims.to_dict() | {"shapes": exported, "vocab_size": dims.text.vocab_size}
    manifest = ModelManifest(
        name=name, architecture=QWEN3_ASR.architecture, dimensions=manifest_dims, source=source, notice=notice, opset=OPSET,
        files={p: GRAPH_FILES[p][ENCODER] for p in precisions}, graphs={p: GRAPH_FILES[p] for p in precisions},
        container_seconds=shapes.container_samples / SAMPLE_RATE, prompt_frames=0,
        languages={code: i for i, code in enumerate(["auto", *dims.prompt.languages])},
        tag_tokens={},
    )
    return write_graphs_atomically(out, build, manifest, tokens)


def export_checkpoint(directory: Path, out: Path, precisions: tuple[str, ...], name: str, source: dict,
                      container: float = 30.0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                      context_tokens: int = DEFAULT_CONTEXT_TOKENS,
                      int8_recipe: Qwen3Int8Recipe = RECIPES[DEFAULT_RECIPE]) -> Path:
    """A released checkpoint directory to the model directory `out` (written atomically), its merges.txt
    copied when it has one; the exporter contract of pipeline/catalog.py, which `python -m export pull` calls."""
    from .qwen3_checkpoint import checkpoint_model

    model, tokens = checkpoint_model(Path(directory))
    merges = Path(directory) / MERGES_FILE
    return write(model, tokens, out, precisions, name, source, container, max_new_tokens,
                 context_tokens=context_tokens, copies=(merges,) if merges.is_file() else (), int8_recipe=int8_recipe)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", type=user_path,
                         help="a released checkpoint directory (Qwen/Qwen3-ASR-0.6B's or -1.7B's config.json, "
                              "model.safetensors or its shards and index, vocab.json, merges.txt, "
                              "tokenizer_config.json)")
    weights.add_argument("--random-init", choices=("tiny", "0.6b", "1.7b"), help="seeded random weights of this size")
    parser.add_argument("--out", type=user_path, required=True, help="model directory to create (must not exist)")
    parser.add_argument("--precision", default=QWEN3_ASR_0_6B.precisions,
                        help=f"comma list of fp32, int8, fp16 (default {QWEN3_ASR_0_6B.precisions}, as `pull`'s: no int8 "
                             "keeps fp32's answer, export/qwen3_quantize.py)")
    parser.add_argument("--container", type=float, default=30.0,
                        help="container seconds, rounded up to whole attention windows (default 30 -> 32)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"decoder cache room past the prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS,
                        help=f"prompt room for a context, i.e. hotwords (default {DEFAULT_CONTEXT_TOKENS}; 0: none)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for --random-init")
    parser.add_argument("--name", help="model name recorded in the manifest")
    parser.add_argument("--int8-recipe", choices=RECIPES, default=DEFAULT_RECIPE,
                        help=f"how int8 quantises each graph (export/qwen3_quantize.py; default {DEFAULT_RECIPE}, "
                             "the one that keeps fp32's answer)")


def run(args: argparse.Namespace) -> int:
    precisions = parse_precisions(args.precision)
    if not 0 < args.container <= 600 or not 0 < args.max_new_tokens <= 4096 or not 0 <= args.context_tokens <= 4096:
        raise ValueError("--container must be in (0, 600] seconds, --max-new-tokens in 1..4096 and "
                         "--context-tokens in 0..4096")
    if args.out.exists():
        raise FileExistsError(f"{args.out} already exists (choose another --out or remove it)")
    if args.checkpoint:
        out = export_checkpoint(args.checkpoint, args.out, precisions, args.name or "qwen3-asr",
                                {"kind": "checkpoint", "path": str(args.checkpoint)}, args.container, args.max_new_tokens,
                                args.context_tokens, RECIPES[args.int8_recipe])
        print(f"wrote {out} ({', '.join(precisions)})")
        return 0
    model = random_model(args.random_init, args.seed)
    source = {"kind": "random-init", "size": args.random_init, "seed": args.seed,
              "note": "random weights and synthetic tokens: for speed and padding checks, not recognition"}
    out = write(model, synthetic_tokens(model.dims), args.out, precisions,
                args.name or f"qwen3-asr-random-{args.random_init}", source, args.container, args.max_new_tokens,
                notice=RANDOM_INIT_NOTICE, context_tokens=args.context_tokens, int8_recipe=RECIPES[args.int8_recipe])
    print(f"wrote {out} ({', '.join(precisions)})")
    return 0
