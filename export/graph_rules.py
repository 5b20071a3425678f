"""The seeds' rules for a graph that DirectML serves at fixed shapes, checked on the ONNX graph itself.

`hazards(path)` lists every node that breaks one of RULES, naming the node and, from the torch exporter's
metadata, the module and the model line it came from. The exporter refuses to write a model directory that
holds one (write_graphs_atomically) and `export verify` fails on one, for every family and precision, so a
hazard cannot come back unnoticed: we cannot run DirectML here, and these rules are what protects its users.

The rules and where each comes from (../shared/seeds, docs/architecture.md "Graph rules"):
    range                  no Range: `arange(...).view(...)` made DirectML fail at the Reshape that follows
                           (8007023E); positions come from `ones_like(...).cumsum(...)` (seed 001 4.1,
                           seed 003 2C, seed 004 2). Tensor.unfold exports one too (issue 60).
    control-flow           no Loop, If, Scan: Python control flow breaks the graph into pieces the provider
                           cannot specialise once (seed 004 1)
    value-dependent-size   no NonZero, Unique, NonMaxSuppression: outputs whose size depends on the input
                           values, what `tensor[:valid]` becomes (seed 001 3.1, seed 003 2D)
    value-dependent-shape  no shape, slice bound, repeat count or pad taken from an input's values rather
                           than from a shape: the same slicing by a valid length in another form (seed 001
                           3.1-3.2: masks instead of slices); the static-shape check (non_static_shapes) then
                           proves every shape folds to a constant once the container is fixed (seed 004 3, 9)
    recurrent              no LSTM, GRU, RNN: DirectML lacks LSTM and it cannot be padded away (seed 000 2)
    where-mask             no Where: masked_fill exports as Where, which blocks DirectML's fusion (40-50 ms
                           over 70 layers); masks are added: scores + (mask - 1) * 10000 (seed 001 4.2)
Not graph rules, because the graph cannot break them: torch.gather wants int64 indices (seed 001 4.3: torch
refuses others while tracing) and Conv takes no bool input (seed 000 1: ONNX's Conv has no bool type).
Mod stays allowed: seed 004 8 praises a graph without it, but ours compute lengths with it (Qwen3-ASR's tokens
per chunk), elementwise values that no shape reads; a Mod feeding a shape is caught as value-dependent-shape.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GraphRule:
    name: str
    ops: frozenset[str]  # operators refused wherever they are (empty: the rule is a check of the data flow)
    why: str
    seeds: str


RULES = (
    GraphRule("range", frozenset({"Range"}), "arange(...).view(...) breaks DirectML's Reshape; build indices with "
              "ones_like(...).cumsum(...)", "seed 001 4.1, 003 2C, 004 2"),
    GraphRule("control-flow", frozenset({"Loop", "If", "Scan"}), "control flow: write it as tensor arithmetic",
              "seed 004 1"),
    GraphRule("value-dependent-size", frozenset({"NonZero", "Unique", "NonMaxSuppression"}),
              "an output sized by the input's values: mask instead of slicing", "seed 001 3.1, 003 2D"),
    GraphRule("value-dependent-shape", frozenset(), "a shape, slice bound or count read from an input's values: "
              "mask instead of slicing", "seed 001 3.1-3.2, 003 2D"),
    GraphRule("recurrent", frozenset({"LSTM", "GRU", "RNN"}), "DirectML has no LSTM kernel", "seed 000 2"),
    GraphRule("where-mask", frozenset({"Where"}), "masked_fill blocks DirectML's fusion; add the mask: "
              "scores + (mask - 1) * 10000", "seed 001 4.2"),
)
RULE_BY_NAME = {rule.name: rule for rule in RULES}
REFUSED_OPS = {op: rule for rule in RULES for op in rule.ops}

# The inputs (by position) that decide an output's shape, per operator: a value there must come from shapes.
SHAPE_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Pad": (1, 3), "Resize": (2, 3), "Upsample": (1,), "TopK": (1,), "Split": (1,), "OneHot": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL2": (1,), "ReduceLogSumExp": (1,), "CenterCropPad": (1,),
}
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})  # their outputs depend on the input's shape, never its values
STACK_TRACE = "pkg.torch.onnx.stack_trace"
NAMESPACE = "namespace"
TRACE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclass(frozen=True)
class Hazard:
    rule: str
    node: str
    op: str
    origin: str  # the module path and model line the node came from, or "" when the graph does not say

    def __str__(self) -> str:
        rule = RULE_BY_NAME[self.rule]
        where = f" from {self.origin}" if self.origin else ""
        return f"{self.op} node {self.node!r}{where}: {rule.name} ({rule.why}; {rule.seeds})"


class GraphRuleError(ValueError):
    """A graph breaks the seeds' rules; carries the hazards and builds its message from them."""

    def __init__(self, path: Path, found: list[Hazard]) -> None:
        super().__init__(path, found)
        self.path, self.hazards = Path(path), found

    def __str__(self) -> str:
        listed = "; ".join(str(h) for h in self.hazards[:5])
        more = f" (and {len(self.hazards) - 5} more)" if len(self.hazards) > 5 else ""
        return f"{self.path}: {len(self.hazards)} node(s) DirectML cannot serve at fixed shapes: {listed}{more}"


def hazards(path: Path) -> list[Hazard]:
    """Every node of the graph at `path` (its subgraphs included) that breaks one of RULES, in graph order."""
    from .onnx_export import load_graph

    return graph_hazards(load_graph(path, load_external_data=False).graph)


def graph_hazards(graph) -> list[Hazard]:
    """hazards() of an in-memory onnx.GraphProto."""
    found: list[Hazard] = []
    from_values = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    for node in graph.node:
        origin = node_origin(node)
        if node.op_type in REFUSED_OPS:
            found.append(Hazard(REFUSED_OPS[node.op_type].name, node.name, node.op_type, origin))
        elif any(i < len(node.input) and node.input[i] in from_values for i in SHAPE_INPUTS.get(node.op_type, ())):
            found.append(Hazard("value-dependent-shape", node.name, node.op_type, origin))
        for attribute in node.attribute:  # a subgraph is already refused as control flow; its nodes are listed too
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                found += graph_hazards(subgraph)
        if node.op_type not in SHAPE_ONLY_OPS and any(name in from_values for name in node.input):
            from_values.update(node.output)
    return found


def refuse_hazards(path: Path) -> None:
    """Raise GraphRuleError when the graph at `path` holds any hazard."""
    found = hazards(path)
    if found:
        raise GraphRuleError(path, found)


def node_origin(node) -> str:
    """Where the torch exporter says a node came from: "frontend: models.frontend.Frontend/unfold:
    aten.unfold.default at models/frontend.py:170" (the two innermost scopes and the stack trace's last line), or "" for a graph without that metadata."""
    metadata = {p.key: p.value for p in node.metadata_props}
    scope_text = "/".join(metadata.get(NAMESPACE, "").split("/")[-2:])
    lines = TRACE_LINE.findall(metadata.get(STACK_TRACE, ""))
    line_text = f"{_repository_path(lines[-1][0])}:{lines[-1][1]}" if lines else ""
    return " at ".join(part for part in (scope_text, line_text) if part)


def _repository_path(file: str) -> str:
    """A traced file's path from the repository's top-level package on (models/frontend.py), or as written."""
    parts = Path(file).parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in ("models", "export", "pipeline"):
            return "/".join(parts[index:])
    return file


def rules_entry(paths: dict[str, Path]) -> dict:
    """verify's report of the rules over a precision's graphs (label -> path): "hazards", each "label: hazard",
    and "forbidden_ops", the operators they name, sorted and once each."""
    found = [(label, h) for label, path in paths.items() for h in hazards(path)]
    return {"hazards": [f"{label}: {h}" for label, h in found], "forbidden_ops": sorted({h.op for _, h in found})}
