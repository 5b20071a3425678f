"""`python -m bench fsmn`: what the FSMN memory block costs on a device, written four ways.

On an H100 (2026-11-26, onnxruntime-gpu 1.31.1, cuDNN 9) a full-size SenseVoice session's first run took
12-14 s, all of it in its Conv nodes (about 250 ms each, every node, every session, whatever
`cudnn_conv_algo_search` said short of DEFAULT, whose algorithm then ran 15x slower), and sessions warmed
in parallel threads took no less in all. Those Conv nodes are the FSMN blocks' depthwise convolutions
(models/sensevoice.py fsmn_memory: a 2-D conv of height 1, chosen for the CPU). This command builds a stack
of LAYERS such blocks (x + depthwise_conv(x), D channels, kernel 11, padding 5 each side) as plain ONNX
graphs in each formulation and times, per formulation and (batch, frames): the session's creation, its
first run and the median of later runs, and how far its output is from the conv2d one's; then, for the conv
forms, one session of free shape run at each shape in turn (is a first run's cost per node, or per node
and shape? if per node, one session per graph would warm a whole grid for the price of one):

    conv2d   [B, T, D] -> [B, D, 1, T], Conv kernel [1, 11], back (what fp32 and int8 graphs export)
    conv1d   [B, T, D] -> [B, D, T], Conv kernel [11], back (what fp16 graphs export: docs/history.md,
             "Capacity": a tenth of conv2d's first run on CUDA)
    taps     pad T by 5 each side, then 11 shifted slices, each times its tap's weights, summed
    gather   pad, Gather the [T, 11] windows ([B, T, 11, D]), times the weights, ReduceSum over the taps

No model and no torch: the graphs are made here with onnx.helper, so a GPU lease runs it on its own.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.providers import provider_config

FORMS = ("conv2d", "conv1d", "taps", "gather")
KERNEL = 11
PAD = KERNEL // 2
CHANNELS = 512  # SenseVoiceSmall's and Paraformer-large's d_model
LAYERS = 20  # a full-size SenseVoice has 70 such blocks; the cost per node is the question
FRAMES = 500  # a 30 s container after the frontend (60 ms frames)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp16", choices=("fp16", "fp32"))
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}")
    parser.add_argument("--shapes", default=f"1x{FRAMES},16x{FRAMES}", help="batch x frames, comma-separated")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result here")


def block(form: str, x: str, weight: np.ndarray, i: int, frames: int) -> tuple[list, list, str]:
    """(nodes, initializers, output name) of one block y = x + memory(x), x [B, T, D]."""
    n = f"l{i}_"
    nodes, inits = [], []
    if form in ("conv2d", "conv1d"):
        w = weight.T[:, None, :]  # [D, 1, K]
        if form == "conv2d":
            w = w[:, :, None, :]  # [D, 1, 1, K], over [B, D, 1, T]
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w), n + "w"))
        nodes.append(helper.make_node("Transpose", [x], [n + "t"], perm=[0, 2, 1]))  # [B, D, T]
        source = n + "t"
        if form == "conv2d":
            inits.append(numpy_helper.from_array(np.array([2], np.int64), n + "ax"))
            nodes.append(helper.make_node("Unsqueeze", [n + "t", n + "ax"], [n + "u"]))
            source = n + "u"
        pads = [0, PAD, 0, PAD] if form == "conv2d" else [PAD, PAD]
        nodes.append(helper.make_node("Conv", [source, n + "w"], [n + "c"], group=CHANNELS, pads=pads,
                                      kernel_shape=[1, KERNEL] if form == "conv2d" else [KERNEL]))
        out = n + "c"
        if form == "conv2d":
            nodes.append(helper.make_node("Squeeze", [n + "c", n + "ax"], [n + "s"]))
            out = n + "s"
        nodes.append(helper.make_node("Transpose", [out], [n + "m"], perm=[0, 2, 1]))
    else:
        inits.append(numpy_helper.from_array(np.array([0, PAD, 0, 0, PAD, 0], np.int64), n + "pads"))
        nodes.append(helper.make_node("Pad", [x, n + "pads"], [n + "p"]))
        if form == "taps":
            terms = []
            for k in range(KERNEL):
                for name, value in (("s", [k]), ("e", [k + frames]), ("a", [1])):
                    inits.append(numpy_helper.from_array(np.array(value, np.int64), f"{n}{name}{k}"))
                inits.append(numpy_helper.from_array(weight[k], f"{n}w{k}"))
                nodes.append(helper.make_node("Slice", [n + "p", f"{n}s{k}", f"{n}e{k}", f"{n}a{k}"], [f"{n}x{k}"]))
                nodes.append(helper.make_node("Mul", [f"{n}x{k}", f"{n}w{k}"], [f"{n}y{k}"]))
                terms.append(f"{n}y{k}")
            total = terms[0]
            for k, term in enumerate(terms[1:], 1):
                nodes.append(helper.make_node("Add", [total, term], [f"{n}sum{k}"]))
                total = f"{n}sum{k}"
            nodes.append(helper.make_node("Identity", [total], [n + "m"]))
        else:
            windows = np.arange(frames)[:, None] + np.arange(KERNEL)[None, :]  # [T, K]
            inits.append(numpy_helper.from_array(windows.astype(np.int64), n + "idx"))
            inits.append(numpy_helper.from_array(weight, n + "w"))  # [K, D], broadcast over [B, T, K, D]
            inits.append(numpy_helper.from_array(np.array([2], np.int64), n + "ax"))
            nodes.append(helper.make_node("Gather", [n + "p", n + "idx"], [n + "g"], axis=1))  # [B, T, K, D]
            nodes.append(helper.make_node("Mul", [n + "g", n + "w"], [n + "gw"]))
            nodes.append(helper.make_node("ReduceSum", [n + "gw", n + "ax"], [n + "m"], keepdims=0))
    nodes.append(helper.make_node("Add", [x, n + "m"], [n + "y"]))
    return nodes, inits, n + "y"


def stack(form: str, layers: int, batch: int | str, frames: int | str, precision: str) -> bytes:
    """The serialized graph of `layers` blocks; weights seeded by layer, so every form has the same ones.
    A conv form may have named (free) batch and frames."""
    dtype = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.FLOAT
    np_type = np.float16 if precision == "fp16" else np.float32
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        weight = (np.random.default_rng(i).standard_normal((KERNEL, CHANNELS)) * 0.05).astype(np_type)  # [K, D]
        more, more_inits, x = block(form, x, weight, i, frames)
        nodes += more
        inits += more_inits
    shape = [batch, frames, CHANNELS]
    graph = helper.make_graph(nodes, f"fsmn_{form}", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info(x, dtype, shape)], inits)
    # IR 8: a newer onnx writes its own latest (14 on the lease's host), which onnxruntime-gpu 1.31 refuses
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def time_form(form: str, batch: int, frames: int, args: argparse.Namespace, x: np.ndarray) -> dict[str, Any]:
    config = provider_config(args.device)
    options = ort.SessionOptions()
    for key, value in config.session_config.items():
        options.add_session_config_entry(key, value)
    began = time.perf_counter()
    session = ort.InferenceSession(stack(form, args.layers, batch, frames, args.precision), options,
                                   providers=list(zip(config.providers, config.provider_options)))
    created = time.perf_counter()
    out = session.run(None, {"x": x})[0]
    first = time.perf_counter()
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return {"provider": session.get_providers()[0], "create_s": round(created - began, 3),
            "first_run_s": round(first - created, 3), "run_ms": round(statistics.median(times) * 1e3, 3),
            "out": out}


def first_runs_in_one_session(form: str, shapes: list[tuple[int, int]], args: argparse.Namespace) -> list[float]:
    """The first run's seconds at each shape in turn, in one session of free batch and frames: whether what
    a first run pays is per node (once per session) or per node and shape."""
    config = provider_config(args.device)
    session = ort.InferenceSession(stack(form, args.layers, "batch", "frames", args.precision),
                                   providers=list(zip(config.providers, config.provider_options)))
    seconds = []
    for batch, frames in shapes:
        x = np.zeros((batch, frames, CHANNELS), np.float16 if args.precision == "fp16" else np.float32)
        began = time.perf_counter()
        session.run(None, {"x": x})
        seconds.append(round(time.perf_counter() - began, 3))
    return seconds


def run(args: argparse.Namespace) -> int:
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or any(f not in FORMS for f in forms):
        raise ValueError(f"--forms must be some of {', '.join(FORMS)}, got {args.forms!r}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
    rows = []
    print(f"{args.layers} FSMN blocks ({CHANNELS} channels, kernel {KERNEL}), {args.precision} on {args.device}")
    print(f"{'form':<7} {'shape':>8} {'create s':>9} {'first run s':>12} {'run ms':>8} {'max |diff|':>11}")
    for batch, frames in shapes:
        x = (np.random.default_rng(99).standard_normal((batch, frames, CHANNELS)) * 0.5).astype(
            np.float16 if args.precision == "fp16" else np.float32)
        reference = None
        for form in forms:
            row = time_form(form, batch, frames, args, x)
            out = row.pop("out").astype(np.float32)
            reference = out if reference is None else reference
            row.update(form=form, batch=batch, frames=frames,
                       max_diff=float(np.max(np.abs(out - reference))), finite=bool(np.isfinite(out).all()))
            rows.append(row)
            print(f"{form:<7} {batch:>3}x{frames:<4} {row['create_s']:9.2f} {row['first_run_s']:12.3f} "
                  f"{row['run_ms']:8.2f} {row['max_diff']:11.2e}", flush=True)
    shared = {}
    for form in (f for f in forms if f.startswith("conv")):
        shared[form] = first_runs_in_one_session(form, shapes, args)
        print(f"{form}, one session of free shape: first runs at {', '.join(f'{b}x{t}' for b, t in shapes)}: "
              f"{', '.join(f'{s:.3f}' for s in shared[form])} s", flush=True)
    result = {"device": args.device, "precision": args.precision, "layers": args.layers, "rows": rows,
              "one_session_first_runs": shared}
    if args.save is not None:
        args.save.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
