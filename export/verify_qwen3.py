"""The Qwen3-ASR side of `python -m export verify`: padding invariance of the three graphs.

Each test clip is decoded twice with pipeline/qwen3_decoding.py: alone, at the smallest shapes that hold it
(its own whole attention windows, a prompt of exactly its length, a cache that grows by one slot a step,
so each step runs over exactly the slots written so far and its own), and served, at the manifest's fixed
shapes (the container with random garbage after the clip, the padded prompt, the full cache). What must
agree: the encoder's valid embeddings, the prefill logits, every step's logits (within verify's bounds)
and the greedy tokens (exactly). Reported in verify.py's shape, so the
summary, thresholds and exit status are shared. The served sessions fix every free axis; the static-shape
check runs on them.

Agreement with fp32 (each precision other than fp32): the clips are decoded served, AGREEMENT_TOKENS
greedy tokens past any end token, by fp32 and by the precision; figures: the share of fp32's tokens kept
until the first difference (the "token_agreement" held against QWEN3_AGREEMENT) and overall, and, with
the precision fed fp32's tokens (teacher forcing, so every step sees the same history), the largest
logit difference on prefill and on the steps, and the encoder's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import ModelDirectory
from pipeline.qwen3_decoding import ENCODER, GRAPHS, Qwen3Decoder, Qwen3Shapes, audio_slots, prompt_length, window_geometry

from .onnx_export import deterministic_waveform, forbidden_ops, non_static_shapes, op_histogram
from .verify import AgreementBound, _passed, errors, make_session, precision_agreement

VERIFY_TOKENS = 8  # greedy steps compared per clip
AGREEMENT_TOKENS = 32  # greedy tokens compared with fp32's per clip
# Faithful: 90 % of fp32's greedy tokens kept until the first difference, and no logit (fp32's tokens fed)
# more than a quarter off; fp16 keeps 100 % within 0.02 on the tiny geometry. No int8 recipe tried meets
# it on fully random weights (0.6B: per-tensor 1.0, blockwise 0.63; docs/benchmarks.md, issue 40).
QWEN3_AGREEMENT = AgreementBound(min_token_agreement=0.9, max_err=0.25)


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
    precisions = precisions or sorted(manifest.graphs)
    if "fp32" in manifest.graphs and set(precisions) - {"fp32"}:
        reference(directory, device, lengths)  # before any precision's sessions: one set in memory at a time
    for precision in precisions:
        served, served_overrides = sessions(directory, precision, device, shapes.container_samples,
                                            shapes.prompt_slots, audio_slots(dims, shapes), shapes.cache_slots)
        histogram: dict[str, int] = {}
        static_problems = []
        for graph in GRAPHS:
            path = directory.path / manifest.graphs[precision][graph]
            for op, count in op_histogram(path).items():
                histogram[op] = histogram.get(op, 0) + count
            static_problems += [f"{graph}: {p}" for p in non_static_shapes(path, 0, served_overrides[graph])]
        entry: dict = {"ops": dict(sorted(histogram.items())), "forbidden_ops": forbidden_ops(histogram),
                       "non_static_shapes": static_problems[:20], "lengths": {}}
        served_decoder = Qwen3Decoder(served, dims["prompt"], shapes)
        for seconds in lengths:
            audio = deterministic_waveform(seconds, seed=int(seconds * 10))
            container = np.random.default_rng(1).uniform(-1, 1, (1, shapes.container_samples)).astype(np.float32)
            container[0, : len(audio)] = audio  # garbage after the clip must not matter
            padded = served_decoder.decode_container(container, len(audio), VERIFY_TOKENS)
            own_samples = -(-len(audio) // window) * window
            own_prompt = prompt_length(dims["prompt"], padded.audio_tokens)
            own_cache = own_prompt + len(padded.tokens)
            alone_sessions, _ = sessions(directory, precision, device, own_samples, own_prompt,
                                         own_samples // window * window_tokens, None)
            own = np.zeros((1, own_samples), np.float32)
            own[0, : len(audio)] = audio
            alone = Qwen3Decoder(alone_sessions, dims["prompt"], replace(shapes, cache_step=1)).decode_container(
                own, len(audio), VERIFY_TOKENS, prompt_slots=own_prompt, cache_slots=own_cache)
            embeds = [s[ENCODER].run(None, {"audio": c, "audio_lengths": np.array([len(audio)], np.int32)})[0]
                      for s, c in ((alone_sessions, own), (served, container))]
            tokens = padded.audio_tokens
            a = np.concatenate([embeds[0][0, :tokens].ravel(), alone.first_logits, *alone.step_logits])
            b = np.concatenate([embeds[1][0, :tokens].ravel(), padded.first_logits, *padded.step_logits])
            same = a.shape == b.shape and alone.tokens == padded.tokens
            result = errors(a.astype(np.float64), b.astype(np.float64)) if same else {
                "max_abs_err": float("inf"), "max_scaled_err": float("inf"), "cosine": 0.0}
            entry["lengths"][f"{seconds:g}s"] = {**result, "tokens_equal": alone.tokens == padded.tokens,
                                                 "frames": tokens, "tokens": len(padded.tokens)}
            del alone_sessions, alone, embeds  # before the next length's: at 0.6B each set holds 2.6 GB
        entry["passed"] = _passed(precision, entry)
        if precision != "fp32" and "fp32" in manifest.graphs:
            entry["agreement"] = agreement(precision, reference(directory, device, lengths), served_decoder, lengths)
            entry["passed"] = entry["passed"] and entry["agreement"]["passed"]
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



def decode_clip(decoder: Qwen3Decoder, audio: np.ndarray, forced: list[int] | None = None):
    """(Qwen3Result, valid encoder embeddings) of one clip served: AGREEMENT_TOKENS tokens past any end
    token, greedy or `forced`."""
    container = np.zeros((1, decoder.shapes.container_samples), np.float32)
    container[0, : len(audio)] = audio
    result = decoder.decode_container(container, len(audio), AGREEMENT_TOKENS, ignore_eos=True, forced_tokens=forced)
    embeds = decoder.sessions[ENCODER].run(None, {"audio": container, "audio_lengths": np.array([len(audio)], np.int32)})
    return result, embeds[0][0, : result.audio_tokens]


_references: dict = {}  # (model dir, device, lengths) -> fp32's decodes: computed once per verify


def reference(directory: ModelDirectory, device: str, lengths: tuple[float, ...]) -> dict:
    """fp32's served decode of each clip (its sessions released before the precision's are made: at 0.6B
    each set holds 2.6 GB)."""
    key = (str(directory.path), device, tuple(lengths))
    if key not in _references:
        _references.clear()
        shapes = Qwen3Shapes.from_dimensions(directory.manifest.dimensions)
        made, _ = sessions(directory, "fp32", device, shapes.container_samples, shapes.prompt_slots,
                           audio_slots(directory.manifest.dimensions, shapes), shapes.cache_slots)
        decoder = Qwen3Decoder(made, directory.manifest.dimensions["prompt"], shapes)
        _references[key] = {f"{s:g}s": decode_clip(decoder, deterministic_waveform(s, seed=int(s * 10)))
                            for s in lengths}
    return _references[key]


def agreement(precision: str, references: dict, decoder: Qwen3Decoder, lengths: tuple[float, ...]) -> dict:
    """The precision behind `decoder` against fp32's `references` (verify.precision_agreement's figures)."""
    clips = {}
    for seconds in lengths:
        label, audio = f"{seconds:g}s", deterministic_waveform(seconds, seed=int(seconds * 10))
        expected, expected_embeds = references[label]
        greedy, _ = decode_clip(decoder, audio)
        forced, embeds = decode_clip(decoder, audio, expected.tokens)
        same = [a == b for a, b in zip(expected.tokens, greedy.tokens)]
        first_difference = same.index(False) if False in same else len(same)
        steps = [np.abs(a - b).max() for a, b in zip(expected.step_logits, forced.step_logits)]
        prefill_err = float(np.abs(expected.first_logits - forced.first_logits).max())
        clips[label] = {
            "tokens": len(expected.tokens), "token_agreement": first_difference / len(expected.tokens),
            "token_agreement_overall": sum(same) / len(expected.tokens),
            # each step's choice given fp32's history: a flip here is the precision's own, not a consequence
            "token_agreement_forced": float(np.mean([int(logits.argmax()) == token for logits, token in zip(
                [forced.first_logits, *forced.step_logits], expected.tokens)])),
            "prefill_logit_err": prefill_err, "step_logit_err": float(max(steps, default=0.0)),
            "max_err": max(prefill_err, float(max(steps, default=0.0))),
            "encoder_err": float(np.abs(expected_embeds - embeds).max()) if embeds.shape == expected_embeds.shape
            else float("inf"),
            "logit_scale": float(np.abs(expected.first_logits).max()),
        }
    return precision_agreement(precision, clips, QWEN3_AGREEMENT, "logits")
