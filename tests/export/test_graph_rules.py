"""The seeds' rules (export/graph_rules.py) over every graph: the committed ones, each a real export refused when
it breaks one, and verify failing on one.

Every graph the suite exports goes through write_graphs_atomically, which refuses a graph with a hazard before
the directory exists, so a hazard in the exporter fails the test that exports; the committed exports are the
exporter's output (tests/test_committed_exports.py keeps them current), scanned here with the shipped models.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.graph_rules import RULES, GraphRuleError, graph_hazards, hazards
from export.onnx_export import write_graphs_atomically
from pipeline.modeldir import ModelManifest

ROOT = Path(__file__).resolve().parents[2]
SILERO = "pipeline/data/silero_vad.onnx"  # Silero's own graph (LSTM, If): our VAD, on the CPU provider only


def committed_graphs() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.onnx"], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(listed.stdout.split())


def test_the_repository_commits_the_demo_model_and_the_suites_exports() -> None:
    graphs = committed_graphs()
    assert {"models/demo/model.onnx", "models/demo/model.int8.onnx", SILERO} <= set(graphs)
    assert sum(g.startswith("tests/fixtures/exports/") for g in graphs) >= 30


@pytest.mark.parametrize("graph", [g for g in committed_graphs() if g != SILERO])
def test_no_committed_graph_breaks_a_rule(graph: str) -> None:
    assert [str(h) for h in hazards(ROOT / graph)] == []


def test_silero_breaks_the_rules_and_runs_only_on_the_cpu() -> None:
    """The exemption is checked, not assumed: Silero's graph holds the hazards, and its session never meets a GPU."""
    from pipeline.vad import silero_session

    assert {h.rule for h in hazards(ROOT / SILERO)} == {"control-flow", "recurrent"}
    assert silero_session().get_providers() == ["CPUExecutionProvider"]


def model_with(nodes: list, inits: list | None = None) -> onnx.ModelProto:
    """A graph with the model directory's first two inputs, `nodes` writing `out`."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"]),
         helper.make_tensor_value_info("audio_lengths", TensorProto.INT32, ["batch"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializer=inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def test_each_refused_operator_is_named_with_its_rule() -> None:
    zero, one = const("zero", np.int64(0)), const("one", np.int64(1))
    for rule in (r for r in RULES if r.ops):
        op = sorted(rule.ops)[0]
        node = helper.make_node(op, ["zero", "n", "one"] if op == "Range" else ["audio"], ["out"], name=f"the_{op}")
        found = graph_hazards(model_with([helper.make_node("Shape", ["audio"], ["n"]), node], [zero, one]).graph)
        assert [(h.rule, h.node, h.op) for h in found] == [(rule.name, f"the_{op}", op)]


def test_a_shape_read_from_the_lengths_values_is_refused_and_one_read_from_a_shape_is_not() -> None:
    """audio[:, :audio_lengths[0]] (a slice by a value) against audio[:, :samples] (by the tensor's own shape)."""
    inits = [const("starts", np.array([0], np.int64)), const("axes", np.array([1], np.int64))]
    by_value = [helper.make_node("Cast", ["audio_lengths"], ["ends"], to=TensorProto.INT64),
                helper.make_node("Slice", ["audio", "starts", "ends", "axes"], ["out"], name="cut")]
    by_shape = [helper.make_node("Shape", ["audio"], ["shape"]),
                helper.make_node("Gather", ["shape", "axes"], ["ends"], axis=0),
                helper.make_node("Slice", ["audio", "starts", "ends", "axes"], ["out"], name="cut")]
    assert [(h.rule, h.node) for h in graph_hazards(model_with(by_value, inits).graph)] == [("value-dependent-shape", "cut")]
    assert graph_hazards(model_with(by_shape, inits).graph) == []


def test_a_real_export_names_the_model_line(tmp_path: Path) -> None:
    """torch's exporter records where each node came from: the refusal names this file and the arange's line."""
    import torch

    class Positions(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(x.shape[1]).view(1, -1).to(x.dtype)  # the seeds' forbidden pattern

    path = tmp_path / "positions.onnx"
    samples = torch.export.Dim("samples", min=2, max=1000)
    torch.onnx.export(Positions().eval(), (torch.zeros(1, 8),), dynamic_shapes={"x": {1: samples}},
                      dynamo=True, opset_version=18).save(str(path))
    [found] = hazards(path)
    assert found.rule == "range" and "arange" in found.origin
    assert f"test_graph_rules.py:{Positions.forward.__code__.co_firstlineno + 1}" in found.origin


def test_no_model_directory_is_written_with_a_hazard(tmp_path: Path) -> None:
    def build(tmp: Path) -> None:
        onnx.save(model_with([helper.make_node("NonZero", ["audio"], ["out"], name="nz")]), str(tmp / "model.onnx"))

    manifest = ModelManifest(name="hazard", architecture="sensevoice", dimensions={}, files={"fp32": "model.onnx"},
                             source={})
    with pytest.raises(GraphRuleError, match=r"NonZero node 'nz'.*value-dependent-size.*seed 001 3.1"):
        write_graphs_atomically(tmp_path / "out", build, manifest, ["<blank>"])
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its temporary sibling


def test_verify_fails_a_graph_with_a_range(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A Range beside an otherwise sound export: verify prints the refused node and exits non-zero."""
    directory = tmp_path / "model"
    shutil.copytree(tiny_model_dir, directory)
    model = onnx.load(str(directory / "model.onnx"))
    model.graph.initializer.extend([const("r_start", np.int64(0)), const("r_delta", np.int64(1))])
    model.graph.node.extend([helper.make_node("Shape", ["audio"], ["r_n"]),
                             helper.make_node("Gather", ["r_n", "r_delta"], ["r_limit"], axis=0),
                             helper.make_node("Range", ["r_start", "r_limit", "r_delta"], ["r_positions"],
                                              name="added_range")])
    model.graph.output.append(helper.make_tensor_value_info("r_positions", TensorProto.INT64, None))
    onnx.save(model, str(directory / "model.onnx"))
    done = subprocess.run([sys.executable, "-m", "export", "verify", str(directory), "--precision", "fp32",
                           "--lengths", "0.3,1"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "[fp32] REFUSED model: Range node 'added_range'" in done.stdout
    assert '"forbidden_ops": ["Range"]' in done.stdout and "FAILED" in done.stdout
