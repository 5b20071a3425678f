"""The Qwen3-ASR side of `python -m export verify`: padding invariance of the three graphs.

Each test clip is decoded twice with pipeline/qwen3_decoding.py: alone, at the smallest shapes that hold it
(its own whole attention windows, a prompt of exactly its length, a cache that grows by one slot a step,
so each step runs over exactly the slots written so far and its own), and served, at the manifest's fixed
shapes (the container with random garbage after the clip, the padded prompt, the full cache). What must
agree: the encoder's valid embeddings, the prefill logits, every step's logits (within verify's bounds)
and the greedy tokens (exactly). Reported in verify.py's shape, so the
summary, thresholds and exit status are shared. The served sessions fix every free axis; the static-shape
check runs on them.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import ModelDirectory
from pipeline.qwen3_decoding import ENCODER, GRAPHS, Qwen3Decoder, Qwen3Shapes, audio_slots, prompt_length, window_geometry

from .onnx_export import deterministic_waveform, forbidden_ops, non_static_shapes, op_histogram
from .verify import _passed, errors, make_session

VERIFY_TOKENS = 8  # greedy steps compared per clip


def free_dimensions(path) -> list[str]:
    from .onnx_export import load_graph

    graph = load_graph(path, load_external_data=False).graph
    return sorted({d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim if d.dim_param})


def graph_overrides(path, samples: int, prompt: int, audio_tokens: int, cache: int | None) -> dict[str, int]:
    """Sizes for the graph's free axes (cache None: left free); the encoder's is named like
    "128000*windows" (a multiple)."""
    overrides = {}
    for name in free_dimensions(path):
        size = samples if name.endswith("windows") else {"prompt": prompt, "audio_tokens": audio_tokens,
                                                         "cache": cache}[name]
        if size is not None:
            overrides[name] = size
    return overrides


def sessions(directory: ModelDirectory, precision: str, device: str, samples: int, prompt: int, audio_tokens: int,
             cache: int | None) -> tuple[dict, dict]:
    made, overrides = {}, {}
    for graph in GRAPHS:
        path = directory.path / directory.manifest.graphs[precision][graph]
        overrides[graph] = graph_overrides(path, samples, prompt, audio_tokens, cache)
        made[graph] = make_session(path, None, device, overrides=overrides[graph])
    return made, overrides


def verify(directory: ModelDirectory, precisions: list[str] | None, lengths: tuple[float, ...], device: str) -> dict:
    manifest = directory.manifest
    dims, shapes = manifest.dimensions, Qwen3Shapes.from_dimensions(manifest.dimensions)
    window, window_tokens = window_geometry(dims)
    too_long = [s for s in lengths if s * SAMPLE_RATE > shapes.container_samples]
    if too_long:
        raise ValueError(f"the container ({shapes.container_samples / SAMPLE_RATE:g} s) is shorter than the "
                         f"{max(too_long):g} s test audio")
    report: dict = {"model": str(directory.path), "container_seconds": shapes.container_samples / SAMPLE_RATE,
                    "device": device, "precisions": {}}
    for precision in precisions or sorted(manifest.graphs):
        # One set of sessions at a time (the served set, then each clip's own): at 1.7B a set of fp32 graphs
        # holds 17 GB, and two would not fit in the memory the export itself needs.
        served, served_overrides = sessions(directory, precision, device, shapes.container_samples,
                                            shapes.prompt_slots, audio_slots(dims, shapes), shapes.cache_slots)
        served_decoder = Qwen3Decoder(served, dims["prompt"], shapes)
        padded_results = {}
        for seconds in lengths:
            audio = deterministic_waveform(seconds, seed=int(seconds * 10))
            container = np.random.default_rng(1).uniform(-1, 1, (1, shapes.container_samples)).astype(np.float32)
            container[0, : len(audio)] = audio  # garbage after the clip must not matter
            padded = served_decoder.decode_container(container, len(audio), VERIFY_TOKENS)
            embeds = served[ENCODER].run(None, {"audio": container, "audio_lengths": np.array([len(audio)], np.int32)})[0]
            padded_results[seconds] = (padded, embeds[0, :padded.audio_tokens])
        del served, served_decoder
        histogram: dict[str, int] = {}
        static_problems = []
        for graph in GRAPHS:
            path = directory.path / manifest.graphs[precision][graph]
            for op, count in op_histogram(path).items():
                histogram[op] = histogram.get(op, 0) + count
            static_problems += [f"{graph}: {p}" for p in non_static_shapes(path, 0, served_overrides[graph])]
        entry: dict = {"ops": dict(sorted(histogram.items())), "forbidden_ops": forbidden_ops(histogram),
                       "non_static_shapes": static_problems[:20], "lengths": {}}
        for seconds in lengths:
            audio = deterministic_waveform(seconds, seed=int(seconds * 10))
            padded, padded_embeds = padded_results[seconds]
            own_samples = -(-len(audio) // window) * window
            own_prompt = prompt_length(dims["prompt"], padded.audio_tokens)
            own_cache = own_prompt + len(padded.tokens)
            alone_sessions, _ = sessions(directory, precision, device, own_samples, own_prompt,
                                         own_samples // window * window_tokens, None)
            own = np.zeros((1, own_samples), np.float32)
            own[0, : len(audio)] = audio
            alone = Qwen3Decoder(alone_sessions, dims["prompt"], replace(shapes, cache_step=1)).decode_container(
                own, len(audio), VERIFY_TOKENS, prompt_slots=own_prompt, cache_slots=own_cache)
            embeds = alone_sessions[ENCODER].run(None, {"audio": own, "audio_lengths": np.array([len(audio)], np.int32)})[0]
            tokens = padded.audio_tokens
            a = np.concatenate([embeds[0, :tokens].ravel(), alone.first_logits, *alone.step_logits])
            b = np.concatenate([padded_embeds.ravel(), padded.first_logits, *padded.step_logits])
            same = a.shape == b.shape and alone.tokens == padded.tokens
            result = errors(a.astype(np.float64), b.astype(np.float64)) if same else {
                "max_abs_err": float("inf"), "max_scaled_err": float("inf"), "cosine": 0.0}
            entry["lengths"][f"{seconds:g}s"] = {**result, "tokens_equal": alone.tokens == padded.tokens,
                                                 "frames": tokens, "tokens": len(padded.tokens)}
            del alone_sessions, alone, embeds  # before the next length's
        entry["passed"] = _passed(precision, entry)
        report["precisions"][precision] = entry
    results = [r for e in report["precisions"].values() for r in e["lengths"].values()]
    report["max_abs_err"] = max(r["max_abs_err"] for r in results)
    report["max_scaled_err"] = max(r["max_scaled_err"] for r in results)
    report["cosine"] = min(r["cosine"] for r in results)
    report["tokens_equal"] = all(r["tokens_equal"] for r in results)
    report["forbidden_ops"] = sorted({op for e in report["precisions"].values() for op in e["forbidden_ops"]})
    report["static_shapes"] = not any(e["non_static_shapes"] for e in report["precisions"].values())
    report["passed"] = all(e["passed"] for e in report["precisions"].values())
    return report

