"""`python -m export verify DIR [--device cpu|cuda|directml]`: padding and batch invariance, graph
operators and static shapes of a model directory, on the provider that will serve it; and every precision's
answers against fp32's.

For each test length (0.3 s to 29 s: short clips are where the clip alone, a few frames, and the container,
hundreds, sum most differently), the audio is run once alone at its own length and once placed in the
container (padding invariance), and once as row 0 of a batch of BATCH_ROWS whose other rows hold other clips,
against the same container at batch 1 (batch invariance); the valid log-prob frames must agree (for
Paraformer: both graphs, the decoder on every token container the device serves, the tokens, their
log-probs and the CIF outputs, int8 identical across token containers, export/verify_paraformer.py; no
batch check, Paraformer serves one clip per call). Bounds per precision:
    fp32   scaled error (max |a - b| / max(1, |a|)) at most max(1e-5, 3e-7 per block of the model),
           cosine >= 0.999999, greedy tokens equal (on CUDA with TF32 off, which the engine's default is:
           TF32 gave 1.7e-3 and moved 1.1 % of the argmaxes on an H100). Scaled, because float32 resolves a
           log-prob of -24 only to 1.9e-6, and an attention softmax over 504 key frames instead of 84 (the
           masked ones add exact zeros) sums in another order: the last bits differ (the demo model: 1.3e-5
           absolute at a log-prob of -24.5, 1.7e-6 scaled). By depth, because each block passes those
           last-bit differences on through the residual stream and adds its own: they grow at most linearly
           with the blocks a value passes (model_blocks: encoder + decoder blocks or layers). The budget,
           3e-7 per block, is 1.5 times the worst measured per block: a released-size Paraformer-large
           checkpoint (66 blocks: 50 encoder, 16 decoder) gave 1.36e-5 at 29 s (issue 37: 2.1e-7 per block,
           over the old flat 1e-5); the bound keeps 1e-5 up to 33 blocks and allows 1.98e-5 at 66. A real
           padding defect is far beyond it: without the attention mask, the tiny Paraformer emits other
           tokens (or another count) in the container than alone at 0.3, 1 and 5 s
           (tests/export/test_int8_agreement.py). docs/benchmarks.md, "fp32 padding bound at depth".
    int8   same bounds for padding (bit-identical on the CPU, and across token containers there); no batch
           check: int8 serves one clip per call (its dynamic quantisation ranges span the batch)
    fp16   5e-3 and cosine >= 0.99999 (a sanity check; fp16 rounds differently per shape). Paraformer's
           decoder reads no token back, so a token its fp16 run picks otherwise in the container than
           alone, with log-probs within that bound in both, is a near-tie that rounding broke, not a
           padding defect: counted in "ties", not as tokens unequal (random weights are full of them: the
           tiny model flipped one of 287 tokens at 29 s on the CPU, some at 5 and 10 s on CUDA). Likewise a
           CIF fire that moves to the next frame because its cumulative weight met the whole number within
           rounding of the frame's edge ("fires_moved"; its peaks then differ by about 1 at two frames).
           fp16 compares the peaks by the cumulative weight they encode, relative to it: that weight sums
           every frame's rounding (the tiny model's 29 s clip on CUDA, 2026-11-27: 6.1e-3 with two fires
           moved). fp32 and int8 compare the peaks themselves and allow no fire to move
The in-graph decoding outputs, where present, must equal the host's argmax and top-k of the log-probs.

Precisions against fp32 (issue 40): every other precision's answers alone on the same clips (the test
clips, and any --agreement-audio speech) are compared with fp32's (export/agreement.py: token counts, token
agreement by edit distance and until the first difference, score errors, the family's aligned values), and
must meet the family's AgreementBound, what a faithful quantisation meets (docs/benchmarks.md, "int8 against fp32"):
    Paraformer  the CIF token count within 5 % of fp32's on every clip (verify_paraformer.AGREEMENT)
    SenseVoice  CTC greedy tokens >= 0.85 of fp32's by edit distance, the log-prob of the token fp32 picks
                in each frame within 0.5 (CTC_AGREEMENT)
    Qwen3-ASR   >= 90 % of fp32's greedy tokens kept until the first difference, logits within 0.25 with
                fp32's tokens fed (verify_qwen3.AGREEMENT)
A choice fp32 itself made by a lead of at most TIE_MARGIN (its chosen token's score over the precision's, in
its own row) is a tie: random weights' outputs are full of them, so the precision may break them either way
(SenseVoice's frames are read as fp32's there; Qwen3-ASR's tokens count as kept after such a difference).
(One token lost is always allowed: verify's 0.3-1 s clips have 5-9 tokens, where one flipped near-tie is
11-20 %; the tiny random SenseVoice's int8 flips one of 5 at 0.7 s.)
A punctuation model (ct-punc) has words, not audio: export/verify_ct_punc.py checks it (each text alone against
padded into every word container, the same bounds; int8 against fp32 as SenseVoice's frames are).
The last line printed is one JSON object with the figures ("agreement" per precision); the exit status is
non-zero when any check fails.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.families import CT_TRANSFORMER, PARAFORMER, QWEN3_ASR, family_for
from pipeline.modeldir import DECODING_OUTPUT_NAMES, FREE_DIMENSIONS, OUTPUT_NAMES, read_model_directory
from pipeline.providers import provider_config

from .agreement import AgreementBound, ClipOutput, add_agreement, agreement_line, read_clips
from .graph_rules import rules_entry
from .onnx_export import deterministic_waveform, non_static_shapes, op_histogram
from .sensevoice import user_path

MAX_SCALED_ERR = 1e-5  # absolute for |log-prob| <= 1, relative beyond; the floor of the depth-scaled bound
SCALED_ERR_PER_BLOCK = 3e-7  # float32 rounding per block a value passes (module docstring)
MIN_COSINE = 0.999999
# fp16 arithmetic on the CPU provider rounds differently per shape; the figures for fp16 are a sanity
# check that the graph runs and keeps its tokens, not the padding-invariance proof (fp32 and int8 are).
FP16_MAX_SCALED_ERR = 5e-3
FP16_MIN_COSINE = 0.99999
# Short clips first: a few frames alone against hundreds in the container is where summation orders differ
# most (issue 37: int8 moved by 0.03 at 0.4 s while 5, 10 and 29 s were bit-identical).
DEFAULT_LENGTHS = (0.3, 0.4, 0.7, 1.0, 5.0, 10.0, 29.0)
BATCH_ROWS = 4  # the batch-invariance check: the clip as row 0, other speech-like clips in the other rows


# SenseVoice's CTC output: greedy tokens (1 - edit distance / fp32's, each frame fp32 led by at most
# TIE_MARGIN read as fp32's: a tie) and the log-prob of the token fp32 picks in each frame. int8 (per-tensor
# dynamic MatMul) keeps 0.93-1.0 of the trained demo model's tokens within 0.33 (its WER 2.72 % against
# fp32's 2.68 %); on full-size random weights (ours, and FunASR's own init: flat posteriors, fp32's best a
# median 0.14 nats ahead) it moves fp32's token by 0.04-0.06 and turns only frames fp32 led by <= 0.06
# (docs/benchmarks.md, "int8 against fp32"; docs/history.md, "Fidelity").
# A lead of a tenth of a nat (or logit), odds of 1.1 to 1 between two tokens. Faithful int8 turns leads of at
# most 0.06 on full-size random weights (SenseVoice, FunASR's own init; Qwen3-ASR, qwen-asr's), the tiny
# SenseVoice's 0.009; a 4-bit quantisation of the tiny SenseVoice turns 0.16 (tests/export).
TIE_MARGIN = 0.1
CTC_AGREEMENT = AgreementBound(min_token_agreement=0.85, max_reference_token_err=0.5, tie_margin=TIE_MARGIN)


def make_session(path: Path, samples: int | None, device: str = "cpu", batch: int = 1,
                 overrides: dict[str, int] | None = None):
    """A plain session on `device` (the engine's provider settings, so TF32 is off on CUDA), with batch and
    samples fixed, or the free dimensions `overrides` (name -> size: a Paraformer decoder's, Qwen3-ASR's graphs).
    No fixed dimension with samples None and no overrides."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if samples is not None:
        overrides = {FREE_DIMENSIONS[0]: batch, FREE_DIMENSIONS[1]: samples}
    for name, value in (overrides or {}).items():
        options.add_free_dimension_override_by_name(name, value)
    config = provider_config(device)
    session = ort.InferenceSession(str(path), options, providers=list(config.providers),
                                   provider_options=list(config.provider_options))
    if session.get_providers()[0] != config.provider:
        raise RuntimeError(f"{config.provider} did not start (this onnxruntime has {ort.get_available_providers()})")
    return session


def run_session(session, audio: np.ndarray, valid: int, names: tuple[str, ...] = OUTPUT_NAMES[:1]) -> list[np.ndarray]:
    """Row 0 of one run: a [samples] clip, or [batch, samples] rows whose lengths are `valid` (an int for
    row 0 and full-length other rows). Returns the outputs `names`, cut to row 0's valid frames."""
    audio = audio[None, :] if audio.ndim == 1 else audio
    lengths = np.full(len(audio), audio.shape[1], np.int32)
    lengths[0] = valid
    feeds = {"audio": audio.astype(np.float32), "audio_lengths": lengths,
             "language": np.zeros(len(audio), dtype=np.int32), "textnorm": np.full(len(audio), 15, dtype=np.int32)}
    fetch = list(dict.fromkeys(OUTPUT_NAMES + tuple(names)))
    out = dict(zip(fetch, session.run(fetch, feeds)))
    frames = int(out[OUTPUT_NAMES[1]][0])
    return [out[name][0, :frames] for name in names]


def greedy_tokens(logprobs: np.ndarray) -> list[int]:
    return list(ctc_collapse(logprobs.argmax(-1)))


def ctc_collapse(best: np.ndarray) -> tuple[int, ...]:
    """CTC's greedy answer from each frame's choice: repeats merged, blanks (id 0) dropped."""
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return tuple(best[keep].tolist())


def compare(alone: np.ndarray, padded: np.ndarray) -> dict:
    if alone.shape != padded.shape:
        return {"max_abs_err": float("inf"), "max_scaled_err": float("inf"), "cosine": 0.0, "tokens_equal": False,
                "frames": [len(alone), len(padded)]}
    a, b = alone.astype(np.float64).ravel(), padded.astype(np.float64).ravel()
    return {
        **errors(a, b),
        "tokens_equal": greedy_tokens(alone) == greedy_tokens(padded),
        "frames": int(len(alone)),
    }


def errors(a: np.ndarray, b: np.ndarray) -> dict:
    """max_abs_err, max_scaled_err (|a - b| / max(1, |a|): the bound's measure) and cosine of two float64 vectors."""
    diff = np.abs(a - b)
    return {"max_abs_err": float(diff.max(initial=0.0)),
            "max_scaled_err": float((diff / np.maximum(1.0, np.abs(a))).max(initial=0.0)),
            "cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))}


def verify(model_dir: Path, precisions: list[str] | None, container: float | None, lengths: tuple[float, ...],
           device: str = "cpu", agreement_audio: tuple[Path, ...] = ()) -> dict:
    directory = read_model_directory(model_dir)
    if directory.manifest.architecture == CT_TRANSFORMER.architecture:  # a punctuation model: words, not audio
        from .verify_ct_punc import verify as verify_ct_punc

        return verify_ct_punc(directory, precisions, device)
    family = family_for(directory)
    if family is QWEN3_ASR:
        from .verify_qwen3 import verify as verify_qwen3

        return verify_qwen3(directory, precisions, lengths, device, agreement_audio)
    container = container or directory.manifest.container_seconds
    container_samples = int(round(container * SAMPLE_RATE))
    too_long = [s for s in lengths if s * SAMPLE_RATE > container_samples]
    if too_long:
        raise ValueError(f"the container ({container:g} s) is shorter than the {max(too_long):g} s test audio")
    precisions = precisions or sorted(directory.manifest.files)
    report: dict = {"model": str(model_dir), "container_seconds": container, "device": device, "precisions": {}}
    paraformer = family is PARAFORMER
    extra_clips = read_clips(agreement_audio, container_samples)
    outputs: dict[str, dict[str, ClipOutput]] = {}  # precision -> clip -> its answer alone (agreement)
    for precision in precisions:
        path = directory.onnx_path(precision)
        if paraformer:  # two graphs, the decoder on every token container (export/verify_paraformer.py)
            from .verify_paraformer import Stages

            stages = Stages(directory, precision, container_samples, device)
            entry = stages.graph_checks(container_samples)
        else:
            histogram = op_histogram(path)
            entry = {"ops": histogram, **rules_entry({"model": path}),
                     "non_static_shapes": non_static_shapes(path, container_samples)[:20], "lengths": {}}
            padded_session = make_session(path, container_samples, device)
            alone_session = make_session(path, None, device)
        batch_session = (make_session(path, container_samples, device, BATCH_ROWS)
                         if precision != "int8" and not paraformer else None)
        decoding = directory.manifest.top_k > 0
        for label, audio in test_clips(lengths).items():
            padded = np.zeros(container_samples, dtype=np.float32)
            padded[: len(audio)] = audio
            # Garbage after the valid samples must not matter either: the graph zeroes it itself.
            padded[len(audio):] = np.random.default_rng(1).uniform(-1, 1, container_samples - len(audio))
            if paraformer:
                entry["lengths"][label], outputs.setdefault(precision, {})[label] = stages.check(audio, padded)
                continue
            alone = run_session(alone_session, audio, len(audio))[0]
            outputs.setdefault(precision, {})[label] = ctc_output(alone)
            in_container = run_session(padded_session, padded, len(audio), OUTPUT_NAMES[:1] + (
                DECODING_OUTPUT_NAMES if decoding else ()))
            result = compare(alone, in_container[0])
            if batch_session is not None:
                rows = np.stack([padded] + [deterministic_waveform(container, seed=100 + r)
                                            for r in range(1, BATCH_ROWS)])
                batch = compare(in_container[0], run_session(batch_session, rows, len(audio))[0])
                result["batch"] = {k: batch[k] for k in ("max_abs_err", "max_scaled_err", "cosine", "tokens_equal")}
            if decoding:
                result["decoding_outputs_equal"] = decoding_equal(*in_container, directory.manifest.top_k)
            entry["lengths"][label] = result
        answer = stages.clip_output if paraformer else lambda clip: ctc_output(run_session(alone_session, clip, len(clip))[0])
        outputs[precision] |= {name: answer(clip) for name, clip in extra_clips.items()}
        report["precisions"][precision] = entry
        entry["passed"] = _passed(precision, entry, model_blocks(directory.manifest.dimensions), device)
    clips = {**test_clips(lengths), **extra_clips}
    if paraformer:
        from .verify_paraformer import AGREEMENT, reference_outputs

        add_agreement(report, outputs, AGREEMENT, lambda: reference_outputs(directory, container_samples, device, clips))
    else:
        add_agreement(report, outputs, CTC_AGREEMENT, lambda: ctc_reference(directory, device, clips))
    return summarise(report, exact_only=True)


def summarise(report: dict, exact_only: bool = False) -> dict:
    """The report's summary figures from its precisions' entries (every family's verify ends with it): the
    worst errors and cosine (with `exact_only`, of fp32 and int8 where either was verified: fp16 has its own
    bound), whether every token was equal, the refused operators, static shapes, and whether all passed."""
    entries = report["precisions"]
    every = [r for e in entries.values() for r in e["lengths"].values()]
    exact = [r for p, e in entries.items() if p != "fp16" for r in e["lengths"].values()] if exact_only else []
    results = exact or every
    report["max_abs_err"] = max(r["max_abs_err"] for r in results)
    report["max_scaled_err"] = max(r["max_scaled_err"] for r in results)
    report["cosine"] = min(r["cosine"] for r in results)
    report["tokens_equal"] = all(r["tokens_equal"] for r in every)
    report["forbidden_ops"] = sorted({op for e in entries.values() for op in e["forbidden_ops"]})
    report["static_shapes"] = not any(e["non_static_shapes"] for e in entries.values())
    report["passed"] = all(e["passed"] for e in entries.values())
    return report


def test_clips(lengths: tuple[float, ...]) -> dict[str, np.ndarray]:
    """verify's speech-like test clips by label ("5s")."""
    return {f"{seconds:g}s": deterministic_waveform(seconds, seed=int(seconds * 10)) for seconds in lengths}


def ctc_output(logprobs: np.ndarray) -> ClipOutput:
    """A clip's CTC log-probs [frames, vocab] as verify compares precisions: the greedy tokens, each frame's row."""
    return ClipOutput(tuple(greedy_tokens(logprobs)), logprobs, collapse=ctc_collapse)


def ctc_reference(directory, device: str, clips: dict[str, np.ndarray]) -> dict[str, ClipOutput] | None:
    """fp32's answers on `clips` alone when fp32 was not among the verified precisions (None: no fp32)."""
    if "fp32" not in directory.manifest.files:
        return None
    session = make_session(directory.onnx_path("fp32"), None, device)
    return {name: ctc_output(run_session(session, audio, len(audio))[0]) for name, audio in clips.items()}


def decoding_equal(logprobs: np.ndarray, best_ids, best_logprobs, topk_ids, topk_logprobs, k: int) -> bool:
    """Whether the graph's decoding outputs equal the host's argmax and top-k of its log-probs."""
    order = np.argsort(-logprobs, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logprobs, order, axis=-1)
    return bool(np.array_equal(best_ids, order[:, 0]) and np.array_equal(topk_ids, order)
                and np.array_equal(best_logprobs, top[:, 0]) and np.array_equal(topk_logprobs, top))


def model_blocks(dimensions: dict) -> int:
    """The blocks a value passes through: every "*blocks" and "*layers" count of the manifest's dimensions
    (Paraformer-large: 50 encoder + 16 decoder blocks; nested dimensions, Qwen3-ASR's, are summed too)."""
    total = 0
    for key, value in dimensions.items():
        if isinstance(value, dict):
            total += model_blocks(value)
        elif key.endswith(("blocks", "layers")) and isinstance(value, int):
            total += value
    return total


def scaled_err_bound(precision: str, blocks: int) -> float:
    """The padding bound on the scaled error of a model `blocks` deep (module docstring: why it grows with
    depth, and from what)."""
    if precision == "fp16":
        return FP16_MAX_SCALED_ERR
    return max(MAX_SCALED_ERR, SCALED_ERR_PER_BLOCK * blocks)


def _passed(precision: str, entry: dict, blocks: int = 0, device: str = "cpu") -> bool:
    max_err, min_cos = scaled_err_bound(precision, blocks), FP16_MIN_COSINE if precision == "fp16" else MIN_COSINE
    entry["max_scaled_err_bound"] = max_err
    results = list(entry["lengths"].values())
    checks = results + [r["batch"] for r in results if "batch" in r]
    return (
        all(r["max_scaled_err"] <= max_err and r["cosine"] >= min_cos and r["tokens_equal"] for r in checks)
        and all(r.get("decoding_outputs_equal", True) for r in results)
        # bit-identical on the CPU, where one session serves every token container; on a GPU each token
        # container is its own session with its own kernels (CUDA, H100: within 1.2e-6 of each other)
        and (precision != "int8" or device != "cpu" or all(r.get("token_containers_identical", True) for r in results))
        and not entry["hazards"] and not entry["non_static_shapes"]
    )


def _seconds_list(text: str) -> tuple[float, ...]:
    """--lengths/--container: comma-separated positive seconds (argparse names the flag in its error)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected positive seconds such as 5,10,29, got {text!r}")
    return values


def _seconds(text: str) -> float:
    values = _seconds_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one number of seconds, got {text!r}")
    return values[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=user_path, help="a model directory written by `python -m export sensevoice`")
    parser.add_argument("--precision", help="comma list (default: every precision in the directory)")
    parser.add_argument("--container", type=_seconds, help="container seconds (default: the manifest's)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "directml"),
                        help="the provider to check on (the one that will serve)")
    parser.add_argument("--lengths", type=_seconds_list, default=DEFAULT_LENGTHS,
                        help=f"test audio seconds (default {','.join(f'{s:g}' for s in DEFAULT_LENGTHS)})")
    parser.add_argument("--agreement-audio", type=user_path, nargs="+", default=(), metavar="WAV",
                        help="16 kHz speech files on which every precision is also compared with fp32")


def run(args: argparse.Namespace) -> int:
    precisions = [p.strip() for p in args.precision.split(",")] if args.precision else None
    report = verify(args.model_dir, precisions, args.container, args.lengths, args.device, tuple(args.agreement_audio))
    container = (f"word containers {','.join(map(str, report['containers']))}" if "containers" in report
                 else f"{report['container_seconds']:g} s")
    for precision, entry in report["precisions"].items():
        ops = ", ".join(f"{op} {n}" for op, n in entry["ops"].items())
        print(f"[{precision}] operators: {ops}")
        if "decoder_ops" in entry:
            print(f"[{precision}] decoder operators: {', '.join(f'{op} {n}' for op, n in entry['decoder_ops'].items())}")
        for label, r in entry["lengths"].items():
            print(f"[{precision}] {label} in {container}: max_abs_err {r['max_abs_err']:.3g} "
                  f"(scaled {r['max_scaled_err']:.3g}), cosine {r['cosine']:.9f}, tokens equal {r['tokens_equal']}"
                  + (f" ({r['ties']} near-tie(s) turned)" if r.get("ties") else "")
                  + (f" ({r['fires_moved']} CIF fire(s) moved a frame)" if r.get("fires_moved") else "")
                  + (f", worst in {r['worst_part']}" if "worst_part" in r else "")
                  + (f"; in a batch of {BATCH_ROWS}: scaled error {r['batch']['max_scaled_err']:.3g}, tokens equal "
                     f"{r['batch']['tokens_equal']}" if "batch" in r else "")
                  + (f"; decoding outputs equal {r['decoding_outputs_equal']}" if "decoding_outputs_equal" in r else "")
                  + (f"; token containers {', '.join(r['token_containers'])}, identical "
                     f"{r['token_containers_identical']}" if "token_containers" in r else ""))
        if entry.get("agreement"):
            print(f"[{precision}] {agreement_line(entry['agreement'])}")
        for hazard in entry["hazards"]:  # export/graph_rules.py: what DirectML cannot serve at fixed shapes
            print(f"[{precision}] REFUSED {hazard}")
        if entry["non_static_shapes"]:
            print(f"[{precision}] shapes still dynamic with the container fixed: {entry['non_static_shapes'][:5]}")
    print("PASSED" if report["passed"] else "FAILED")
    # the errors and cosine summarise fp32/int8 (the exact precisions); fp16 has its own entry.
    summary = {k: report[k] for k in ("device", "max_abs_err", "max_scaled_err", "cosine", "tokens_equal", "forbidden_ops",
                                      "static_shapes", "passed")}
    summary["precisions"] = {p: e["lengths"] for p, e in report["precisions"].items()}
    summary["agreement"] = {p: e["agreement"] for p, e in report["precisions"].items() if "agreement" in e}
    print(json.dumps(summary))
    return 0 if report["passed"] else 1
