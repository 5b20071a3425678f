"""Rewriting an ONNX graph's weights one tensor at a time, so a multi-gigabyte graph is never held in memory.

`onnx.load` of a graph with its external data, the numpy arrays made from it and the new TensorProtos are
three copies of the weights (7 GiB for Qwen3-ASR-0.6B's 2.4 GB prefill, the export's peak). Here the graph
is read without its external data, each weight is read from the data file only while it is
hashed and copied to the new data file, and the file written is the one `onnx.save_model` writes
(export/onnx_export.py save_graph: one data file, size_threshold 1024, tensors in order and unpadded).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

from .onnx_export import INT8_REDUCE_RANGE, external_data_file, load_graph

QUANTIZE_SLICE = 1 << 24  # elements quantised at once (64 MB of float32)
QUANTIZE_COLUMNS = 4096  # output channels quantised at once, per channel
SIZE_THRESHOLD = 1024
_PLAIN_FIELDS = {"dims", "data_type", "name", "raw_data"}  # save_graph's: onnx moves a tensor out when sys.getsizeof(raw_data) >= this
_EMPTY_BYTES_SIZE = sys.getsizeof(b"")


def _external_entries(tensor) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _goes_external(nbytes: int) -> bool:
    return _EMPTY_BYTES_SIZE + nbytes >= SIZE_THRESHOLD


def _write_external(tensor, raw, out, location: str) -> None:
    """Append `raw` to the open data file `out` and point `tensor` at it, as onnx.save_model does."""
    from onnx.external_data_helper import set_external_data

    offset = out.tell()
    out.write(raw)
    tensor.raw_data = b""  # set_external_data requires the field; onnx clears it once written
    set_external_data(tensor, location, offset, len(raw))
    tensor.ClearField("raw_data")


class _WeightReader:
    """Each initializer's bytes: inline ones from the proto, external ones read from their file when asked
    (plain reads, not a memory map: the mapped pages would count as the process's memory until unmapped)."""

    def __init__(self, directory: Path, stack: contextlib.ExitStack) -> None:
        self.directory, self.stack, self.files = directory, stack, {}

    def __call__(self, tensor) -> bytes:
        from onnx import TensorProto, numpy_helper

        if tensor.data_location != TensorProto.EXTERNAL:
            return tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
        entries = _external_entries(tensor)
        location = entries["location"]
        if location not in self.files:
            self.files[location] = self.stack.enter_context(open(self.directory / location, "rb"))
        handle = self.files[location]
        handle.seek(int(entries.get("offset", 0)))
        data = handle.read(int(entries["length"])) if "length" in entries else handle.read()
        return data


def rename_weights_by_content(path: Path, prefix: str) -> None:
    """Rename each initializer of the graph at `path` to `prefix` + the sha1 of its dtype, shape and bytes,
    merging identical ones, with its layout kept (its weights in one external file when it had one). The
    names and files are those of onnx.load + numpy_helper + save_graph, byte for byte."""
    import onnx
    from onnx import TensorProto, helper

    path = Path(path)
    model = load_graph(path, load_external_data=False)
    data = external_data_file(path)
    external = data.exists()
    staging = data.with_name(data.name + ".partial")
    renamed, seen, duplicates = {}, set(), []
    with contextlib.ExitStack() as stack:
        read = _WeightReader(path.parent, stack)
        out = stack.enter_context(open(staging, "wb")) if external else None
        for index, tensor in enumerate(model.graph.initializer):  # changed in place: no copy of an inline graph
            raw, old = read(tensor), tensor.name
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            digest = hashlib.sha1(f"{dtype.str}{tuple(tensor.dims)}".encode())
            digest.update(raw)
            renamed[old] = name = prefix + digest.hexdigest()
            if name in seen:
                duplicates.append(index)
            elif out is not None and _goes_external(len(raw)):
                tensor.CopyFrom(TensorProto(dims=tensor.dims, data_type=tensor.data_type, name=name))
                _write_external(tensor, raw, out, data.name)
            elif {field.name for field, _ in tensor.ListFields()} == _PLAIN_FIELDS:
                tensor.name = name  # the layout numpy_helper.from_array writes: kept as it is
            else:
                tensor.CopyFrom(TensorProto(dims=tensor.dims, data_type=tensor.data_type, name=name, raw_data=bytes(raw)))
            seen.add(name)
            del raw
    for node in model.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for index in reversed(duplicates):
        del model.graph.initializer[index]
    if external:
        os.replace(staging, data)  # once the old file is closed (Windows refuses otherwise)
        data.chmod(path.stat().st_mode & 0o777)
    onnx.save_model(model, str(path))


def _float_weight(tensor) -> bool:
    from onnx import TensorProto

    return tensor is not None and tensor.data_type == TensorProto.FLOAT


def _gemms_as_matmuls(graph, initializers: dict, transposed: dict[str, str]) -> list:
    """ONNX Runtime's quantizer first rewrites each Gemm (alpha = beta = 1, A not transposed) as a MatMul
    (plus an Add for its bias); a transposed constant B becomes the initializer "<B>_Transposed", made here
    only when it is quantized (`transposed`: its name -> B's). Others stay as they are."""
    from onnx import helper

    nodes = []
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0 \
                or attributes.get("transA", 0):
            nodes.append(node)
            continue
        b = node.input[1]
        if attributes.get("transB", 0):
            if b in initializers:
                name = next(f"{b}_Transposed" + (f"_{i}" if i else "") for i in range(1 << 30)
                            if f"{b}_Transposed" + (f"_{i}" if i else "") not in initializers)
                transposed.setdefault(b, name)
                b = transposed[b]
            else:
                nodes.append(helper.make_node("Transpose", [b], [b + "_Transposed"],
                                              name=node.name + "_Transpose" if node.name else ""))
                b += "_Transposed"
        biased = len(node.input) > 2
        out = node.output[0] + ("_MatMul" if biased else "")
        nodes.append(helper.make_node("MatMul", [node.input[0], b], [out],
                                      name=node.name + "_MatMul" if node.name else ""))
        if biased:
            nodes.append(helper.make_node("Add", [out, node.input[2]], list(node.output),
                                          name=node.name + "_Add" if node.name else ""))
    return nodes


def quantize_weight(data):
    """(zero point, scale, int8 values) of the flat float32 `data` as ONNX Runtime's quantize_data gives them
    for symmetric QInt8 in INT8_REDUCE_RANGE's 7 bits (its own two steps: the range of the whole tensor, then
    each element), the elements a slice at a time: its temporaries are a few copies of the tensor, 6 GB for the
    1.7B lm_head."""
    import numpy as np
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_data_quant_params, quantize_nparray

    zero_point, scale = compute_data_quant_params(data, TensorProto.INT8, True, INT8_REDUCE_RANGE, None, None, None)
    values = np.empty(data.shape, np.int8)
    for start in range(0, len(data), QUANTIZE_SLICE):
        values[start:start + QUANTIZE_SLICE] = quantize_nparray(TensorProto.INT8, data[start:start + QUANTIZE_SLICE],
                                                                scale, zero_point)
    return zero_point, scale, values


def quantize_weight_per_channel(array):
    """(zero points [N], scales [N], int8 values [K, N]) of the float32 weight `array` [K, N], one range per
    output channel (a column), as ONNX Runtime's quantize_weight_per_channel makes them for a MatMul (axis 1,
    symmetric QInt8, quantize_data per column); QUANTIZE_COLUMNS columns at a time, so that its temporaries
    stay small beside the weight itself (the 1.7B lm_head is 1.2 GB)."""
    import numpy as np

    k, n = array.shape
    values = np.empty((k, n), np.int8)
    zero_points, scales = np.empty(n, np.int8), np.empty(n, np.float32)
    for start in range(0, n, QUANTIZE_COLUMNS):
        columns = np.ascontiguousarray(array[:, start:start + QUANTIZE_COLUMNS].T)
        quantized = np.empty(columns.shape, np.int8)
        for j, column in enumerate(columns):
            zero_points[start + j], scales[start + j], quantized[j] = quantize_weight(column)
        values[:, start:start + len(columns)] = quantized.T
    return zero_points, scales, values


def quantize_int8_streaming(src: Path, dst: Path, external_bytes: int, per_channel: bool = False) -> None:
    """Dynamic int8 of the graph at `src` into `dst`, as onnxruntime.quantization.quantize_dynamic makes it
    with export/onnx_export.py quantize_int8's options (MatMul/Gemm, constant B only, QInt8 weights per
    tensor, or per output channel with `per_channel`, symmetric; uint8 activations by DynamicQuantizeLinear),
    one weight at a time: the same MatMulInteger nodes, the same quantized values (its own quantize_data),
    so the same outputs, without quantize_dynamic's several in-memory copies of the graph (11.5 GiB over
    0.6B's 2.4 GB prefill; the 1.7B decoder would need 40). Its weights go to "<dst>.data" when they pass
    `external_bytes`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.quantization.quant_utils import __producer__, __version__

    src, dst = Path(src), Path(dst)
    model = load_graph(src, load_external_data=False)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    transposed: dict[str, str] = {}  # B -> "<B>_Transposed"
    nodes = _gemms_as_matmuls(graph, initializers, transposed)
    source_of = {name: b for b, name in transposed.items()}
    quantized = [n for n in nodes if n.op_type == "MatMul" and len(n.input) > 1
                 and _float_weight(initializers.get(source_of.get(n.input[1], n.input[1])))]
    weights, chosen = {n.input[1] for n in quantized}, {id(n) for n in quantized}
    used = {name for n in nodes if id(n) not in chosen for name in n.input} | {n.input[0] for n in quantized}
    kept = [t for t in graph.initializer if t.name in used]
    size = sum(int(np.prod(initializers[source_of.get(w, w)].dims)) for w in weights) + sum(
        int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in kept)
    data = external_data_file(dst)
    external = size > external_bytes
    new_nodes, new_initializers, activations, products = [], [], {}, set()
    with contextlib.ExitStack() as stack:
        read = _WeightReader(src.parent, stack)
        out = stack.enter_context(open(data, "wb")) if external else None

        def add(tensor, raw) -> None:
            if out is not None and _goes_external(len(raw)):
                _write_external(tensor, raw, out, data.name)
            else:
                tensor.raw_data = bytes(raw)
            new_initializers.append(tensor)

        for tensor in kept:
            add(TensorProto(dims=tensor.dims, data_type=tensor.data_type, name=tensor.name), read(tensor))
        done = set()
        for node in nodes:
            if id(node) not in chosen:
                new_nodes.append(node)
                continue
            a, b = node.input[0], node.input[1]
            if a not in activations:
                activations[a] = (a + "_quantized", a + "_scale", a + "_zero_point")
                new_nodes.append(helper.make_node("DynamicQuantizeLinear", [a], list(activations[a]),
                                                  a + "_QuantizeLinear"))
            if b not in done:
                source = initializers[source_of.get(b, b)]
                array = np.frombuffer(read(source), dtype=np.float32).reshape(tuple(source.dims))
                if b in source_of:
                    array = np.ascontiguousarray(array.T)
                if per_channel:
                    zero_point, scale, values = quantize_weight_per_channel(array)
                else:
                    zero_point, scale, values = quantize_weight(array.ravel())
                del array
                shape = [len(scale)] if per_channel else []
                new_initializers.append(helper.make_tensor(b + "_scale", TensorProto.FLOAT, shape,
                                                           scale.reshape(-1).tolist()))
                new_initializers.append(helper.make_tensor(b + "_zero_point", TensorProto.INT8, shape,
                                                           zero_point.reshape(-1).tolist()))
                dims = source.dims[::-1] if b in source_of else source.dims
                add(TensorProto(dims=dims, data_type=TensorProto.INT8, name=b + "_quantized"),
                    np.ascontiguousarray(values, dtype=np.int8).tobytes())
                del values
                done.add(b)
            name = node.name + "_quant" if node.name else ""
            integer = node.output[0] + "_output_quantized"
            a_q, a_scale, a_zero = activations[a]
            new_nodes.append(helper.make_node("MatMulInteger", [a_q, b + "_quantized", a_zero, b + "_zero_point"],
                                              [integer], name))
            new_nodes.append(helper.make_node("Cast", [integer], [integer + "_cast_output"], integer + "_cast",
                                              to=TensorProto.FLOAT))
            scales = name + "_scales_mul" if name else f"{a_scale}_{b}_scale_mul"
            if scales not in products:
                products.add(scales)
                new_nodes.append(helper.make_node("Mul", [a_scale, b + "_scale"], [scales + ":0"], scales))
            new_nodes.append(helper.make_node("Mul", [integer + "_cast_output", scales + ":0"], [node.output[0]],
                                              name + "_output_scale_mul" if name else ""))
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_initializers)
    model.producer_name, model.producer_version = __producer__, __version__
    onnx.save_model(model, str(dst))
    if external:
        data.chmod(dst.stat().st_mode & 0o777)
