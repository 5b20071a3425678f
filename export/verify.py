"""`python -m export verify DIR`: padding invariance, graph operators and static shapes of a model directory.

For each test length, the audio is run once alone at its own length and once placed in the container;
the valid log-prob frames must agree (for Paraformer: the tokens, their log-probs and the CIF outputs,
export/verify_paraformer.py). The last line printed is one JSON object with the figures; the
exit status is non-zero when any check fails.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import FREE_DIMENSIONS, read_model_directory

from .onnx_export import deterministic_waveform, forbidden_ops, non_static_shapes, op_histogram

MAX_ABS_ERR = 1e-5
MIN_COSINE = 0.999999
# fp16 arithmetic on the CPU provider rounds differently per shape; the figures for fp16 are a sanity
# check that the graph runs and keeps its tokens, not the padding-invariance proof (fp32 and int8 are).
FP16_MAX_ABS_ERR = 5e-3
FP16_MIN_COSINE = 0.99999
DEFAULT_LENGTHS = (5.0, 10.0, 29.0)


def make_session(path: Path, samples: int | None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if samples is not None:
        options.add_free_dimension_override_by_name(FREE_DIMENSIONS[0], 1)
        options.add_free_dimension_override_by_name(FREE_DIMENSIONS[1], samples)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(session, audio: np.ndarray, valid: int) -> np.ndarray:
    feeds = {
        "audio": audio[None, :].astype(np.float32),
        "audio_lengths": np.array([valid], dtype=np.int32),
        "language": np.zeros(1, dtype=np.int32),
        "textnorm": np.full(1, 15, dtype=np.int32),
    }
    logprobs, lengths = session.run(None, feeds)
    return logprobs[0, : int(lengths[0])]


def greedy_tokens(logprobs: np.ndarray) -> list[int]:
    best = logprobs.argmax(-1)
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return best[keep].tolist()


def compare(alone: np.ndarray, padded: np.ndarray) -> dict:
    if alone.shape != padded.shape:
        return {"max_abs_err": float("inf"), "cosine": 0.0, "tokens_equal": False, "frames": [len(alone), len(padded)]}
    a, b = alone.astype(np.float64).ravel(), padded.astype(np.float64).ravel()
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return {
        "max_abs_err": float(np.max(np.abs(a - b))),
        "cosine": cosine,
        "tokens_equal": greedy_tokens(alone) == greedy_tokens(padded),
        "frames": int(len(alone)),
    }


def verify(model_dir: Path, precisions: list[str] | None, container: float | None, lengths: tuple[float, ...]) -> dict:
    directory = read_model_directory(model_dir)
    container = container or directory.manifest.container_seconds
    container_samples = int(round(container * SAMPLE_RATE))
    too_long = [s for s in lengths if s * SAMPLE_RATE > container_samples]
    if too_long:
        raise ValueError(f"the container ({container:g} s) is shorter than the {max(too_long):g} s test audio")
    precisions = precisions or sorted(directory.manifest.files)
    report: dict = {"model": str(model_dir), "container_seconds": container, "precisions": {}}
    for precision in precisions:
        path = directory.onnx_path(precision)
        histogram = op_histogram(path)
        entry: dict = {"ops": histogram, "forbidden_ops": forbidden_ops(histogram),
                       "non_static_shapes": non_static_shapes(path, container_samples)[:20], "lengths": {}}
        padded_session = make_session(path, container_samples)
        alone_session = make_session(path, None)
        run, check = (run_session, compare)
        if directory.manifest.architecture == "paraformer":
            from .verify_paraformer import compare as check, run_session as run
        for seconds in lengths:
            audio = deterministic_waveform(seconds, seed=int(seconds * 10))
            padded = np.zeros(container_samples, dtype=np.float32)
            padded[: len(audio)] = audio
            # Garbage after the valid samples must not matter either: the graph zeroes it itself.
            padded[len(audio):] = np.random.default_rng(1).uniform(-1, 1, container_samples - len(audio))
            entry["lengths"][f"{seconds:g}s"] = check(
                run(alone_session, audio, len(audio)), run(padded_session, padded, len(audio))
            )
        report["precisions"][precision] = entry
        entry["passed"] = _passed(precision, entry)
    exact = [r for p, e in report["precisions"].items() if p != "fp16" for r in e["lengths"].values()]
    results = exact or [r for e in report["precisions"].values() for r in e["lengths"].values()]
    report["max_abs_err"] = max(r["max_abs_err"] for r in results)
    report["cosine"] = min(r["cosine"] for r in results)
    report["tokens_equal"] = all(r["tokens_equal"] for e in report["precisions"].values() for r in e["lengths"].values())
    report["forbidden_ops"] = sorted({op for e in report["precisions"].values() for op in e["forbidden_ops"]})
    report["static_shapes"] = not any(e["non_static_shapes"] for e in report["precisions"].values())
    report["passed"] = all(e["passed"] for e in report["precisions"].values())
    return report


def _passed(precision: str, entry: dict) -> bool:
    max_err, min_cos = (FP16_MAX_ABS_ERR, FP16_MIN_COSINE) if precision == "fp16" else (MAX_ABS_ERR, MIN_COSINE)
    results = entry["lengths"].values()
    return (
        all(r["max_abs_err"] <= max_err and r["cosine"] >= min_cos and r["tokens_equal"] for r in results)
        and not entry["forbidden_ops"] and not entry["non_static_shapes"]
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, help="a model directory written by `python -m export sensevoice`")
    parser.add_argument("--precision", help="comma list (default: every precision in the directory)")
    parser.add_argument("--container", type=float, help="container seconds (default: the manifest's)")
    parser.add_argument("--lengths", default=",".join(f"{s:g}" for s in DEFAULT_LENGTHS), help="test audio seconds")


def run(args: argparse.Namespace) -> int:
    precisions = [p.strip() for p in args.precision.split(",")] if args.precision else None
    lengths = tuple(float(s) for s in args.lengths.split(","))
    report = verify(args.model_dir, precisions, args.container, lengths)
    for precision, entry in report["precisions"].items():
        ops = ", ".join(f"{op} {n}" for op, n in entry["ops"].items())
        print(f"[{precision}] operators: {ops}")
        for label, r in entry["lengths"].items():
            print(f"[{precision}] {label} in {report['container_seconds']:g} s: max_abs_err {r['max_abs_err']:.3g}, "
                  f"cosine {r['cosine']:.9f}, tokens equal {r['tokens_equal']}")
        if entry["forbidden_ops"]:
            print(f"[{precision}] FORBIDDEN operators for fixed-shape serving: {', '.join(entry['forbidden_ops'])}")
        if entry["non_static_shapes"]:
            print(f"[{precision}] shapes still dynamic with the container fixed: {entry['non_static_shapes'][:5]}")
    print("PASSED" if report["passed"] else "FAILED")
    # max_abs_err and cosine summarise fp32/int8 (the exact precisions); fp16 has its own entry.
    summary = {k: report[k] for k in ("max_abs_err", "cosine", "tokens_equal", "forbidden_ops", "static_shapes", "passed")}
    summary["precisions"] = {p: e["lengths"] for p, e in report["precisions"].items()}
    print(json.dumps(summary))
    return 0 if report["passed"] else 1
