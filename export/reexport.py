"""`python -m export reexport DIR [--out DIR]`: a SenseVoice model directory exported again by today's exporter,
its weights read back from its own fp32 graph.

For a directory with no checkpoint beside it (the shipped demo model: train-demo exports what it trained and
keeps no model.pt) when the exporter changes how a graph is written but not what it computes (issue 60: the
frames gathered instead of unfolded, so no Range). The weights are the same numbers: each state_dict entry
is found in the graph by its name, or, for the ones the torch exporter stores anonymously (a Linear's weight
transposed for its MatMul, an FSMN kernel reshaped for its Conv), by the module path it records on the node
that reads it. Before anything is replaced the new fp32 graph must answer verify's test clips as the old one
did (tokens equal, the fp32 padding bound), and the directory's other files (its model card) are kept.
"""
from __future__ import annotations

import argparse
import ast
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.families import SENSEVOICE, family_of
from pipeline.modeldir import read_model_directory

from .onnx_export import NAME_SCOPES, load_graph, write_model_dir
from .sensevoice import user_path
from .verify import DEFAULT_LENGTHS, compare, make_session, run_session, scaled_err_bound, test_clips

# Where the torch exporter reads a parameter it did not name, by the parameter's last name part: the operator
# and input position (a Linear: MatMul's B and an Add; a LayerNorm's scale and bias; a Conv; an Embedding).
PARAMETER_INPUTS = {
    "weight": {("MatMul", 1), ("Gemm", 1), ("Conv", 1), ("LayerNormalization", 1), ("Gather", 0)},
    "bias": {("Add", 0), ("Add", 1), ("Gemm", 2), ("Conv", 2), ("LayerNormalization", 2)},
}
REQUIRED_BUFFERS = ("frontend.cmvn_shift", "frontend.cmvn_scale")  # outside the state_dict, the model's own CMVN


def state_dict_from_graph(graph, model) -> dict:
    """`model`'s state_dict with every entry's value taken from `graph` (onnx.GraphProto) exported from a model
    of the same geometry. Raises ValueError naming the first entry the graph does not hold exactly once."""
    import torch
    from onnx import numpy_helper

    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, dict[str, set]] = {}  # module path -> {initializer read inside it: {(operator, input)}}
    for node in graph.node:
        scopes = next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == NAME_SCOPES), [])
        for position, name in enumerate(node.input):
            if name in initializers:
                for scope in scopes:
                    readers.setdefault(scope, {}).setdefault(name, set()).add((node.op_type, position))
    state = {}
    for key, reference in model.state_dict().items():
        if key in initializers:
            value = numpy_helper.to_array(initializers[key])
        else:
            module, kind = key.rpartition(".")[::2]
            read = readers.get(module) or readers.get(module.rpartition(".")[0], {})  # an FSMN kernel: its parent's Conv
            candidates = [n for n, uses in read.items() if uses & PARAMETER_INPUTS.get(kind, uses)
                          and int(np.prod(initializers[n].dims)) == reference.numel()]
            values = [_as_parameter(numpy_helper.to_array(initializers[n]), read[n]) for n in candidates]
            # Several only where they hold the same numbers (the exporter shares equal constants: fresh norms)
            if not values or any(not np.array_equal(v, values[0]) for v in values[1:]):
                raise ValueError(f"the graph holds {len(candidates)} candidates for {key} (not an export of this geometry)")
            value = values[0]
        if value.size != reference.numel():
            raise ValueError(f"the graph's {key} has {value.size} values, the model {reference.numel()}")
        state[key] = torch.from_numpy(np.ascontiguousarray(value).reshape(reference.shape).copy())
    return state


def _as_parameter(value: np.ndarray, uses: set) -> np.ndarray:
    """An initializer as the parameter it was exported from: a MatMul's B is a Linear's weight transposed."""
    return value.T if ("MatMul", 1) in uses else value


def reexported_model(directory):
    """The SenseVoice of `directory` (a pipeline.modeldir.ModelDirectory) with its fp32 graph's weights."""
    import torch
    from onnx import numpy_helper

    from models.sensevoice import ModelDimensions, SenseVoice

    if family_of(directory.manifest) is not SENSEVOICE or "fp32" not in directory.manifest.files:
        raise ValueError(f"{directory.path}: reexport reads a SenseVoice directory's fp32 graph; this one is "
                         f"{directory.manifest.architecture} with {', '.join(directory.manifest.files)}")
    graph = load_graph(directory.onnx_path("fp32")).graph
    model = SenseVoice(ModelDimensions.from_dict(directory.manifest.dimensions))
    model.load_state_dict(state_dict_from_graph(graph, model), strict=True)
    # The buffers outside the state_dict too (CMVN; the timescales, whose float32 exp differs in the last bit
    # between CPUs): the graph's constants by name, where it has them (a buffer new to the exporter it has not).
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    missing = [name for name in REQUIRED_BUFFERS if name not in constants]
    if missing:
        raise ValueError(f"{directory.path}: its fp32 graph has no {', '.join(missing)}")
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in constants and constants[name].shape == tuple(buffer.shape):
                buffer.copy_(torch.from_numpy(constants[name].copy()))
    return model.eval()


def same_answers(old: Path, new: Path, blocks: int) -> dict[str, dict]:
    """verify's test clips through both fp32 graphs alone: tokens equal and within the fp32 bound, or ValueError."""
    sessions = [make_session(path, None) for path in (old, new)]
    results = {}
    for label, clip in test_clips(DEFAULT_LENGTHS).items():
        result = compare(*(run_session(s, clip, len(clip))[0] for s in sessions))
        if not result["tokens_equal"] or result["max_scaled_err"] > scaled_err_bound("fp32", blocks):
            raise ValueError(f"the re-exported graph answers the {label} clip otherwise: {result}")
        results[label] = result
    return results


def reexport(model_dir: Path, out: Path) -> dict[str, dict]:
    """Write `model_dir` exported again into `out` (which may be `model_dir`); returns the fp32 comparison."""
    from .verify import model_blocks

    directory = read_model_directory(model_dir)
    model = reexported_model(directory)
    manifest = replace(directory.manifest, files={})
    with tempfile.TemporaryDirectory(prefix=".reexport.", dir=Path(out).resolve().parent) as tmp:
        staged = write_model_dir(model, directory.tokens, Path(tmp) / "model", manifest, tuple(directory.manifest.files))
        results = same_answers(directory.onnx_path("fp32"), staged / directory.manifest.files["fp32"],
                               model_blocks(directory.manifest.dimensions))
        for extra in sorted(set(p.name for p in Path(model_dir).iterdir()) - set(p.name for p in staged.iterdir())):
            if (Path(model_dir) / extra).is_file():  # the model card and anything else beside the graphs
                shutil.copy2(Path(model_dir) / extra, staged / extra)
        if Path(out).exists():
            shutil.rmtree(out)
        staged.rename(out)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=user_path, help="a SenseVoice model directory with its fp32 graph")
    parser.add_argument("--out", type=user_path, help="where to write it (default: in place of MODEL_DIR)")


def run(args: argparse.Namespace) -> int:
    out = args.out or args.model_dir
    results = reexport(args.model_dir, out)
    worst = max(r["max_scaled_err"] for r in results.values())
    print(f"wrote {out}: the fp32 graph answers verify's {len(results)} clips with equal tokens "
          f"(max scaled error {worst:.3g} against the old graph)")
    return 0
