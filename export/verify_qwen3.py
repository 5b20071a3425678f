"""The Qwen3-ASR side of `python -m export verify`: padding invariance of the three graphs.

Each test clip is decoded twice with pipeline/families/qwen3_asr/decoding.py: alone, at the smallest shapes that hold it
(its own whole attention windows, a prompt of exactly its length, a cache that grows by one slot a step,
so each step runs over exactly the slots written so far and its own), and served, at the manifest's fixed
shapes (the container with random garbage after the clip, the padded prompt, the full cache). What must
agree: the encoder's valid embeddings, the prefill logits, every step's logits (within verify's bounds)
and the greedy tokens (exactly). Reported in verify.py's shape, so the
summary, thresholds and exit status are shared. The served sessions fix every free axis; the static-shape
check runs on them.

Agreement with fp32 (each precision other than fp32; export/agreement.py): the clips are decoded served,
AGREEMENT_TOKENS greedy tokens past any end token, by fp32 and by the precision. The precision's ClipOutput
holds its greedy tokens (compared until the first difference that is not a tie, the bounded "tokens_kept";
until the first difference at all, "equal_prefix"; and by edit distance) and its logits with fp32's tokens
fed (teacher forcing, so every step sees the same history: the largest logit difference, bounded, and
"argmax_agreement", each choice given fp32's history, ties kept); the prefill logits and the encoder's
output are reported apart ("max_aligned_err").
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import ModelDirectory
from pipeline.families.qwen3_asr.decoding import ENCODER, GRAPHS, Qwen3Decoder, Qwen3Shapes, audio_slots, prompt_length, window_geometry

from .graph_rules import rules_entry
from .onnx_export import non_static_shapes, op_histogram
from .agreement import AgreementBound, ClipOutput, add_agreement, read_clips
from .verify import TIE_MARGIN, _passed, errors, make_session, model_blocks, summarise, test_clips

VERIFY_TOKENS = 8  # greedy steps compared per clip
AGREEMENT_TOKENS = 32  # greedy tokens compared with fp32's per clip
# Faithful: no logit (fp32's tokens fed) more than a quarter off, and 90 % of fp32's greedy tokens kept until
# the first difference fp32 itself decided by more than verify.TIE_MARGIN (random weights are full of ties:
# the qwen-asr class's own init gives logits of std 0.64 whose top two lie a median 0.08 apart, so even fp16
# turns some). fp16 keeps 100 % within 0.02 on the tiny geometry. At 0.6B (docs/benchmarks.md, "int8 against fp32"), on
# the qwen-asr class's own init, per-channel int8 meets it (max 0.18, leads turned at most 0.06); on
# --random-init's spread norm gains no int8 recipe does.
AGREEMENT = AgreementBound(min_tokens_kept=0.9, max_logprob_err=0.25, tie_margin=TIE_MARGIN)


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


def verify(directory: ModelDirectory, precisions: list[str] | None, lengths: tuple[float, ...], device: str,
           agreement_audio: tuple[Path, ...] = ()) -> dict:
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
    clips = {**test_clips(lengths), **read_clips(agreement_audio, shapes.container_samples)}
    references = (reference(directory, device, clips)  # before any precision's sessions: one set in memory at a time
                  if "fp32" in manifest.graphs and set(precisions) - {"fp32"} else None)
    outputs: dict[str, dict[str, ClipOutput]] = {}  # precision -> clip -> its answer (agreement)
    for precision in precisions:
        # One set of sessions at a time (the served set, then each clip's own): at 1.7B a set of fp32 graphs
        # holds 17 GB, and two would not fit in the memory the export itself needs.
        served, served_overrides = sessions(directory, precision, device, shapes.container_samples,
                                            shapes.prompt_slots, audio_slots(dims, shapes), shapes.cache_slots)
        served_decoder = Qwen3Decoder(served, dims["prompt"], shapes)
        padded_results = {}
        for label, audio in test_clips(lengths).items():
            container = np.random.default_rng(1).uniform(-1, 1, (1, shapes.container_samples)).astype(np.float32)
            container[0, : len(audio)] = audio  # garbage after the clip must not matter
            padded = served_decoder.decode_container(container, len(audio), VERIFY_TOKENS)
            embeds = served[ENCODER].run(None, {"audio": container, "audio_lengths": np.array([len(audio)], np.int32)})[0]
            padded_results[label] = (padded, embeds[0, :padded.audio_tokens])
        if precision != "fp32":
            outputs[precision] = {} if references is None else {
                label: clip_output(served_decoder, audio, references[label].tokens) for label, audio in clips.items()}
        del served, served_decoder
        histogram: dict[str, int] = {}
        static_problems = []
        for graph in GRAPHS:
            path = directory.path / manifest.graphs[precision][graph]
            for op, count in op_histogram(path).items():
                histogram[op] = histogram.get(op, 0) + count
            static_problems += [f"{graph}: {p}" for p in non_static_shapes(path, 0, served_overrides[graph])]
        entry: dict = {"ops": dict(sorted(histogram.items())),
                       **rules_entry({graph: directory.path / manifest.graphs[precision][graph] for graph in GRAPHS}),
                       "non_static_shapes": static_problems[:20], "lengths": {}}
        for label, audio in test_clips(lengths).items():
            padded, padded_embeds = padded_results[label]
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
            entry["lengths"][label] = {**result, "tokens_equal": alone.tokens == padded.tokens,
                                                 "frames": tokens, "tokens": len(padded.tokens)}
            del alone_sessions, alone, embeds  # before the next length's
        entry["passed"] = _passed(precision, entry, model_blocks(dims))
        report["precisions"][precision] = entry
    add_agreement(report, outputs, AGREEMENT, lambda: references)
    return summarise(report)



def clip_output(decoder: Qwen3Decoder, audio: np.ndarray, forced: tuple[int, ...] | None = None) -> ClipOutput:
    """One clip served as verify compares precisions: AGREEMENT_TOKENS greedy tokens past any end token; the
    logits (one row per token), the prefill's and the encoder's valid embeddings with `forced` fed when given
    (fp32's tokens), else with the greedy tokens."""
    container = np.zeros((1, decoder.shapes.container_samples), np.float32)
    container[0, : len(audio)] = audio
    greedy = decoder.decode_container(container, len(audio), AGREEMENT_TOKENS, ignore_eos=True)
    fed = greedy if forced is None else decoder.decode_container(container, len(audio), AGREEMENT_TOKENS,
                                                                 ignore_eos=True, forced_tokens=list(forced))
    embeds = decoder.sessions[ENCODER].run(None, {"audio": container, "audio_lengths": np.array([len(audio)], np.int32)})
    logits = np.stack([fed.first_logits, *fed.step_logits])
    return ClipOutput(tuple(greedy.tokens), logits, aligned=(("encoder", embeds[0][0, : fed.audio_tokens]),
                                                             ("prefill_logits", fed.first_logits)))


def reference(directory: ModelDirectory, device: str, clips: dict[str, np.ndarray]) -> dict[str, ClipOutput]:
    """fp32's served answer on each clip, decoded before any precision's sessions are made (its own are
    released on return: at 0.6B each set holds 2.6 GB)."""
    shapes = Qwen3Shapes.from_dimensions(directory.manifest.dimensions)
    made, _ = sessions(directory, "fp32", device, shapes.container_samples, shapes.prompt_slots,
                       audio_slots(directory.manifest.dimensions, shapes), shapes.cache_slots)
    decoder = Qwen3Decoder(made, directory.manifest.dimensions["prompt"], shapes)
    return {label: clip_output(decoder, audio) for label, audio in clips.items()}
