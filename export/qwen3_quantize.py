"""Qwen3-ASR's int8 graphs: which MatMuls become 8-bit, and how (issue 39 part 2, issue 40).

A recipe names, per graph, the form of its MatMul weights:
    "dynamic"      MatMulInteger with per-tensor int8 weights and a per-tensor uint8 range measured on each
                   input at run time (ONNX Runtime's quantize_dynamic; what every model had before)
    "per-channel"  the same with one weight scale per output channel
    "weight-only"  MatMulNBits: 8-bit weights with a scale per block of WEIGHT_ONLY_BLOCK inputs of each output
                   channel, activations left in float (accuracy_level 0: computed in float32)
    "blockwise"    the same weights, activations quantised to int8 per block of each row at run time and
                   multiplied in int8 (accuracy_level 4): a range per WEIGHT_ONLY_BLOCK inputs of one token,
                   not one range per tensor
    "float"        left in float32
and, apart from the body, the form of the graph's last MatMul (`head`): the decoder's lm_head (logits over
the vocabulary) and the encoder's final projection (proj2, what the decoder reads as audio embeddings).
The embedding table (a Gather) stays float32 in every recipe.

Measured at 0.6B (docs/benchmarks.md, "int8 against fp32"), against fp32 on verify's clips. On a checkpoint made by
the qwen-asr package's own class and initialisation (bench/make_qwen3_checkpoint.py), "per-channel" moves
the logits by at most 0.18 (RMS 0.03 of a 0.64 spread) and turns only fp32's near-ties (leads of at most
0.06): verify passes, padding exact; it is the recipe when int8 is asked for, made a weight at a time
(export/graph_weights.py quantize_int8_streaming). "blockwise" is as close (0.15) but not padding-exact:
ONNX Runtime's MatMulNBits int8 kernel rounds a row differently with the number of rows (0.04 between a clip
alone and in the container at 0.3 s and 10 s), which breaks the promise that int8 answers alike in any
container. On --random-init's spread norm gains (channel outliers) no recipe meets verify's bound: "dynamic"
moves the logits by up to 1.0, "blockwise" 0.63 (8-10 % RMS): one activation range per tensor leaves the
small channels few bits. So Qwen3-ASR's CPU default stays fp32 (pipeline/catalog.py): a trained checkpoint's
outliers are not known here. "weight-only" keeps activations in float, but ONNX Runtime computes its 8-bit
form without an optimised kernel on the CPU: 4.2 s per token at 0.6B.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.families.qwen3_asr.decoding import ENCODER

FORMS = ("dynamic", "per-channel", "weight-only", "blockwise", "float")
WEIGHT_ONLY_BLOCK = 128  # inputs per weight scale (and per activation range in "blockwise")


@dataclass(frozen=True)
class Qwen3Int8Recipe:
    """Qwen3-ASR's int8 by graph part: the form (FORMS) of the encoder's and the decoder's MatMuls, and of
    each one's head. Its own kind, not export/onnx_export.py's Int8Recipe: that one is one dynamic
    quantisation per graph; these mix ONNX Runtime's quantisers (MatMulNBits has no dynamic form)."""

    encoder: str
    encoder_head: str
    decoder: str
    decoder_head: str

    def __post_init__(self) -> None:
        unknown = [f for f in (self.encoder, self.encoder_head, self.decoder, self.decoder_head) if f not in FORMS]
        if unknown:
            raise ValueError(f"unknown int8 form {unknown[0]!r} (choose from {', '.join(FORMS)})")

    def forms(self, graph: str) -> tuple[str, str]:
        """(body, head) of `graph`."""
        return (self.encoder, self.encoder_head) if graph == ENCODER else (self.decoder, self.decoder_head)


RECIPES = {
    "per-tensor": Qwen3Int8Recipe("dynamic", "dynamic", "dynamic", "dynamic"),  # before issue 40
    "per-channel": Qwen3Int8Recipe("per-channel", "per-channel", "per-channel", "per-channel"),
    "per-channel-float-head": Qwen3Int8Recipe("per-channel", "float", "per-channel", "float"),
    "weight-only": Qwen3Int8Recipe("weight-only", "weight-only", "weight-only", "weight-only"),
    "blockwise": Qwen3Int8Recipe("blockwise", "blockwise", "blockwise", "blockwise"),
    "float-encoder": Qwen3Int8Recipe("float", "float", "blockwise", "blockwise"),
}
DEFAULT_RECIPE = "per-channel"


def head_node(model) -> str:
    """The graph's last MatMul with a constant weight: lm_head (prefill, step) or proj2 (encoder)."""
    constants = {tensor.name for tensor in model.graph.initializer}
    names = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in constants]
    return names[-1]


def quantize_graph(src: Path, dst: Path, graph: str, recipe: Qwen3Int8Recipe) -> None:
    """The int8 graph `dst` of the float32 graph `src` (encoder, prefill or step) by `recipe`."""
    import onnx

    from .onnx_export import external_data_file, save_graph

    model = onnx.load(str(src))
    body, head = recipe.forms(graph)
    last = head_node(model)
    everything = [n.name for n in model.graph.node]
    for form in dict.fromkeys((body, head)):  # each form once, over the nodes that take it
        chosen = [last] if form == head and form != body else None
        excluded = [last] if form == body and form != head else []
        model = _apply(model, form, chosen, excluded, everything)
    del model.graph.value_info[:]  # shapes of tensors a form replaced; ONNX Runtime infers them again
    if external_data_file(src).exists():  # save_graph keeps a graph's layout: past 2 GB, its weights apart
        external_data_file(dst).touch()
    save_graph(model, dst)


def _apply(model, form: str, chosen: list[str] | None, excluded: list[str], everything: list[str]):
    if form == "float":
        return model
    if form in ("weight-only", "blockwise"):
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        _gemm_as_matmul(model, set(chosen or everything) - set(excluded))
        # nodes_to_include adds to the op types rather than narrowing them: the others are excluded instead
        skipped = set(excluded) | (set(everything) - set(chosen) if chosen else set())
        quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=WEIGHT_ONLY_BLOCK, is_symmetric=True,
                                         accuracy_level=4 if form == "blockwise" else 0, nodes_to_exclude=sorted(skipped),
                                         op_types_to_quantize=("MatMul",))
        quantizer.process()
        return quantizer.model.model
    return _dynamic(model, form == "per-channel", chosen, excluded)


def _gemm_as_matmul(model, names: set[str]) -> None:
    """Each Gemm of `names` with a constant transposed weight and no bias (a tied lm_head: the embedding
    table [V, H] read as B^T) as a MatMul over a [H, V] copy, which MatMulNBits quantises (it takes MatMul
    only); the embedding's Gather keeps the original table."""
    from onnx import helper, numpy_helper

    constants = {tensor.name: tensor for tensor in model.graph.initializer}
    for index, node in enumerate(model.graph.node):
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.name not in names or node.input[1] not in constants or len(node.input) > 2
                or attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0):
            continue
        weight = numpy_helper.to_array(constants[node.input[1]])
        if attributes.get("transB", 0):
            weight = weight.T.copy()
        name = f"{node.input[1]}_matmul"
        model.graph.initializer.append(numpy_helper.from_array(weight, name))
        model.graph.node[index].CopyFrom(helper.make_node("MatMul", [node.input[0], name], list(node.output), name=node.name))


def _dynamic(model, per_channel: bool, chosen: list[str] | None, excluded: list[str]):
    """quantize_dynamic of an in-memory graph (it reads and writes files: through a temporary directory)."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .onnx_export import INT8_REDUCE_RANGE

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save_model(model, str(src), save_as_external_data=True, location="in.onnx.data", size_threshold=1024)
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul", "Gemm"], weight_type=QuantType.QInt8,
                         per_channel=per_channel, reduce_range=INT8_REDUCE_RANGE, nodes_to_quantize=chosen or [],
                         nodes_to_exclude=excluded, use_external_data_format=True,
                         extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(dst))
