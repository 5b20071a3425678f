"""Greedy and top-k decoding inside the graph: a graph step that appends them to an exported model.

    logprobs f32 [batch, frames, vocab] -> TopK(k, axis=-1, largest, sorted)
        topk_logprobs  f32 [batch, frames, k]   the k best log-probs of each frame, best first
        topk_ids       i32 [batch, frames, k]   their token ids (ties: the lower id first, as np.argmax)
        best_logprobs  f32 [batch, frames]      ReduceMax: column 0 of the above
        best_ids       i32 [batch, frames]      ArgMax (the first best id, as np.argmax)

The serving path fetches only these, so the host never receives the full [frames, vocab] log-probs (50 MB
per 30 s segment for SenseVoiceSmall) unless a caller asks. The step works on any model directory, so
an existing one (the shipped demo, which has no torch checkpoint) is upgraded in place by
`python -m export add-decoding DIR`; the manifest records k as `top_k`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

from pipeline.modeldir import DECODING_OUTPUT_NAMES, MANIFEST_FILE, read_model_directory

DEFAULT_TOP_K = 8


def add_decoding_outputs(model, k: int = DEFAULT_TOP_K):
    """Return `model` (an onnx.ModelProto with a `logprobs` output) with the four decoding outputs added.

    k is clipped to the vocabulary. A model that has them already is returned unchanged. Needs opset >= 18
    (ReduceMax with an axes input), which every exported graph has."""
    from onnx import TensorProto, helper, numpy_helper

    import numpy as np

    graph = model.graph
    outputs = {o.name: o for o in graph.output}
    if all(name in outputs for name in DECODING_OUTPUT_NAMES):
        return model
    logprobs = outputs["logprobs"].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in logprobs.shape.dim]
    batch, frames, vocab = dims
    if isinstance(vocab, int) and vocab > 0:
        k = min(k, vocab)
    best_ids, best_logprobs, topk_ids, topk_logprobs = DECODING_OUTPUT_NAMES
    graph.initializer.extend([numpy_helper.from_array(np.array([k], np.int64), "decoding_k"),
                              numpy_helper.from_array(np.array([-1], np.int64), "decoding_axes")])
    # The best id and log-prob come from their own ArgMax and ReduceMax rather than from TopK's first
    # column, so that the serving path, which fetches only them, does not pay for the top-k.
    graph.node.extend([
        helper.make_node("ArgMax", ["logprobs"], ["decoding_best_ids64"], axis=-1, keepdims=0,
                         select_last_index=0, name="decoding_argmax"),
        helper.make_node("Cast", ["decoding_best_ids64"], [best_ids], to=TensorProto.INT32, name="decoding_cast_best"),
        helper.make_node("ReduceMax", ["logprobs", "decoding_axes"], [best_logprobs], keepdims=0, name="decoding_max"),
        helper.make_node("TopK", ["logprobs", "decoding_k"], [topk_logprobs, "decoding_topk_ids64"],
                         axis=-1, largest=1, sorted=1, name="decoding_topk"),
        helper.make_node("Cast", ["decoding_topk_ids64"], [topk_ids], to=TensorProto.INT32, name="decoding_cast_topk"),
    ])
    graph.output.extend([
        helper.make_tensor_value_info(best_ids, TensorProto.INT32, [batch, frames]),
        helper.make_tensor_value_info(best_logprobs, logprobs.elem_type, [batch, frames]),
        helper.make_tensor_value_info(topk_ids, TensorProto.INT32, [batch, frames, k]),
        helper.make_tensor_value_info(topk_logprobs, logprobs.elem_type, [batch, frames, k]),
    ])
    return model


def add_decoding_to_file(path: Path, k: int = DEFAULT_TOP_K) -> int:
    """Rewrite one .onnx file with the decoding outputs (external data kept beside it); returns k used,
    0 for a graph without CTC log-probs (left as it is)."""
    import onnx

    from .onnx_export import load_graph, save_graph  # here: onnx_export imports this module

    model = load_graph(path)
    if "logprobs" not in {o.name for o in model.graph.output}:
        return 0  # not a CTC graph (Paraformer outputs its tokens already): nothing to add
    model = add_decoding_outputs(model, k)
    onnx.checker.check_model(model, full_check=False)
    save_graph(model, path)
    return next(int(d.dim_value) for o in model.graph.output if o.name == DECODING_OUTPUT_NAMES[2]
                for d in o.type.tensor_type.shape.dim[2:])


def upgrade_model_dir(model_dir: Path, k: int = DEFAULT_TOP_K) -> int:
    """Add the decoding outputs to every graph of a model directory, atomically (a copy is changed, then
    swapped in); the manifest gets `top_k`. Returns k."""
    directory = read_model_directory(model_dir)
    model_dir = Path(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
        used = [add_decoding_to_file(tmp / name, k) for name in directory.manifest.files.values()]
        manifest = dataclasses.replace(directory.manifest, top_k=min(used))
        (tmp / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
        os.chmod(tmp, 0o755)
        old = model_dir.with_name(f".{model_dir.name}.old")
        model_dir.rename(old)
        tmp.rename(model_dir)
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return min(used)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, help="a model directory (its graphs are rewritten in place)")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="ids and log-probs kept per frame")


def run(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    k = upgrade_model_dir(args.model_dir, args.top_k)
    print(json.dumps({"model": str(args.model_dir), "top_k": k, "outputs": list(DECODING_OUTPUT_NAMES)}))
    return 0
