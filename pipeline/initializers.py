"""Read an ONNX graph's weights (initializers) without the `onnx` package, to share them between sessions.

The engine keeps one ONNX Runtime session per container shape; `SessionOptions.add_initializer` lets all of
them use one copy of the weights. That needs each initializer as a numpy array, and `pipeline/` does not
depend on `onnx`, so this module walks the protobuf wire format itself: ModelProto.graph (field 7) ->
GraphProto.initializer (field 5) -> TensorProto. Only dense tensors with `raw_data` or external data (the
forms torch.onnx and onnx.save_model write for weights) are read; anything else is skipped and stays
inside each session.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# TensorProto.DataType -> numpy dtype (STRING, complex and the 4-bit/8-bit float types are not shared)
_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
    9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# Operators whose CPU kernels prepack a constant weight (input 1, B or W) into their own layout when the
# session is created. Shared with add_initializer, such a weight is either packed again by each session
# (the Python API has no shared prepacked-weights container) or, with prepacking off, used unpacked on
# every run: a quarter slower per token for Qwen3-ASR's int8 decoder (docs/history.md, "Speed").
_PREPACKING_OPS = frozenset({"MatMul", "MatMulInteger", "Gemm", "DynamicQuantizeMatMul", "MatMulNBits",
                             "FusedMatMul", "Conv", "ConvInteger", "QLinearMatMul", "QLinearConv"})


@dataclass(frozen=True)
class _Field:
    number: int
    wire: int  # 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
    value: int | memoryview


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview):
    """Yield the top-level fields of one protobuf message; nested messages stay unparsed (memoryviews)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield _Field(number, wire, value)


def _packed_varints(field: _Field) -> list[int]:
    if field.wire == 0:
        return [field.value]  # type: ignore[list-item]
    values, pos, buf = [], 0, field.value
    while pos < len(buf):  # type: ignore[arg-type]
        value, pos = _varint(buf, pos)  # type: ignore[arg-type]
        values.append(value)
    return values


def _tensor(buf: memoryview, base: Path, skipped: set[str]) -> tuple[str, np.ndarray] | None:
    dims: list[int] = []
    name, dtype, raw, external, location = "", 0, None, {}, 0
    for f in _fields(buf):
        if f.number == 1:
            dims += _packed_varints(f)
        elif f.number == 2:
            dtype = f.value
        elif f.number == 8:
            name = bytes(f.value).decode("utf-8")
        elif f.number == 9:
            raw = f.value
        elif f.number == 13:
            entry = {g.number: bytes(g.value).decode("utf-8") for g in _fields(f.value)}
            external[entry.get(1, "")] = entry.get(2, "")
        elif f.number == 14:
            location = f.value
        elif f.number in (3, 4, 5, 6, 7, 10, 11):  # segments or typed *_data fields: leave to ORT
            return None
    if dtype not in _DTYPES or not name or name in skipped:
        return None
    np_dtype = np.dtype(_DTYPES[dtype])
    count = int(np.prod(dims)) if dims else 1
    if location == _EXTERNAL:
        path = base / external["location"]
        offset = int(external.get("offset", 0))
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(count * np_dtype.itemsize)
    elif raw is not None:
        data = raw
    else:
        return None
    array = np.frombuffer(data, dtype=np_dtype, count=count).reshape(dims).copy()  # own, aligned, writable
    return name, array


def _prepacked_names(graph: memoryview) -> set[str]:
    """Names given as input 1 to a _PREPACKING_OPS node (GraphProto.node is field 1; NodeProto.input 1,
    op_type 4)."""
    names = set()
    for f in _fields(graph):
        if f.number == 1 and f.wire == 2:
            node = list(_fields(f.value))  # type: ignore[arg-type]
            op = next((bytes(g.value).decode("utf-8") for g in node if g.number == 4), "")
            inputs = [bytes(g.value).decode("utf-8") for g in node if g.number == 1]
            if op in _PREPACKING_OPS and len(inputs) > 1:
                names.add(inputs[1])
    return names


def read_initializers(path: str | Path, min_bytes: int = 1024,
                      skip_prepacked: bool = False) -> dict[str, np.ndarray]:
    """The dense initializers of the ONNX graph at `path` at least `min_bytes` large, by name; with
    `skip_prepacked`, not those a CPU kernel prepacks (_PREPACKING_OPS): each session keeps its own.

    Small tensors (shape constants, scalars) are left out: they are cheap and some are folded away by
    ONNX Runtime's graph optimisations. Raises ValueError (or OSError) on a file that is not an ONNX model.
    """
    path = Path(path)
    blob = memoryview(path.read_bytes())
    try:
        graphs = [f.value for f in _fields(blob) if f.number == 7 and f.wire == 2]
        if len(graphs) != 1:
            raise ValueError("no graph")
        skipped = _prepacked_names(graphs[0]) if skip_prepacked else set()  # type: ignore[arg-type]
        out: dict[str, np.ndarray] = {}
        for f in _fields(graphs[0]):  # type: ignore[arg-type]
            if f.number == 5 and f.wire == 2:
                tensor = _tensor(f.value, path.parent, skipped)  # type: ignore[arg-type]
                if tensor is not None and tensor[1].nbytes >= min_bytes:
                    out[tensor[0]] = tensor[1]
    except (IndexError, KeyError, UnicodeDecodeError, ValueError) as exc:  # truncated or not protobuf
        raise ValueError(f"{path}: not a readable ONNX model ({exc or type(exc).__name__})") from None
    return out
