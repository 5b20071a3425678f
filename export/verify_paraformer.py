"""The Paraformer side of `python -m export verify`: both stages, alone and in the container, on every token
container the engine serves that container with (pipeline/families/paraformer/stages.py).

For each clip: stage one runs once at the clip's own length and once padded into the container; the
decoder runs once alone (free shape, exactly the CIF count of token rows) and once per token container that
holds the count, against the container's encoder output. What must not depend on the padding or on the
token container: the token count and ids (exactly), the valid token log-probs, CIF weights and CIF peaks
(within verify's tolerances); int8 must also be bit-identical between the token containers. `compare`
reports in the shape verify.py's SenseVoice comparison uses, so the summary, thresholds and exit status
are shared.
"""
from __future__ import annotations

import numpy as np

from pipeline.audio import encoder_frames
from pipeline.engine_options import default_token_containers
from pipeline.modeldir import DECODER_FREE_DIMENSIONS, PARAFORMER_ENCODER_OUTPUT_NAMES, ModelDirectory
from pipeline.families.paraformer.stages import DecoderGrid, decoder_feed
from pipeline.shapes import token_containers

from .graph_rules import rules_entry
from .onnx_export import non_static_shapes, op_histogram
from .agreement import AgreementBound, ClipOutput
from .verify import FP16_MAX_SCALED_ERR, errors, make_session

# What a faithful int8 keeps (issue 40): the CIF's token count within 5 % of fp32's on every clip (at least
# one token: a count is a rounded sum of weights), as FunASR's own int8 export of the same weights does.
# Tokens and log-probs are reported, not bounded: a random-weight model's near-uniform log-probs let any
# rounding change the argmax, so their agreement measures the weights, not the quantisation.
AGREEMENT = AgreementBound(max_count_change=0.05)


class Stages:
    """The sessions of one precision: stage one alone and in the container, the decoder alone and per
    token container of the container."""

    def __init__(self, directory: ModelDirectory, precision: str, container_samples: int, device: str) -> None:
        self.paths = directory.onnx_path(precision), directory.onnx_path(precision, decoder=True)
        self.tie_bound = FP16_MAX_SCALED_ERR if precision == "fp16" else 0.0  # verify.py's docstring, fp16
        self.frames = encoder_frames(container_samples)
        self.token_containers = token_containers(self.frames, default_token_containers(device))
        self.histograms = [op_histogram(path) for path in self.paths]  # first: names a damaged file in one line
        self.encoder_alone = make_session(self.paths[0], None, device)
        self.encoder_padded = make_session(self.paths[0], container_samples, device)
        self.decoder_alone = make_session(self.paths[1], None, device)
        # As the engine runs them: on the CPU one session serves every token container (sessions.runner_on)
        self.decoders = {k: self.decoder_alone if device == "cpu" else
                         make_session(self.paths[1], None, device, overrides=self.overrides(k)) for k in self.token_containers}

    def overrides(self, tokens: int) -> dict[str, int]:
        return dict(zip(DECODER_FREE_DIMENSIONS, (1, self.frames, tokens)))

    def graph_checks(self, container_samples: int) -> dict:
        """Operators of both graphs, the seeds' rules over them, and shapes left free once each session's are fixed."""
        histograms = self.histograms
        shapes = non_static_shapes(self.paths[0], container_samples)
        for k in self.token_containers:
            shapes += [f"decoder[{k}] {s}" for s in non_static_shapes(self.paths[1], 0, self.overrides(k))]
        return {"ops": histograms[0], "decoder_ops": histograms[1],
                **rules_entry({"encoder": self.paths[0], "decoder": self.paths[1]}),
                "non_static_shapes": shapes[:20], "token_containers": list(self.token_containers), "lengths": {}}

    def alone(self, audio: np.ndarray):
        """The clip at its own length: stage one, then the decoder at exactly its token count."""
        first = run_encoder(self.encoder_alone, audio, len(audio))
        return decode(self.decoder_alone, first, max(int(first["token_counts"][0]), 1))

    def clip_output(self, audio: np.ndarray) -> ClipOutput:
        return clip_output(self.alone(audio))

    def check(self, audio: np.ndarray, padded: np.ndarray) -> tuple[dict, ClipOutput]:
        """Padding and token-container invariance of one clip; and its answer alone, for the precisions'
        agreement (verify.agreement)."""
        valid = len(audio)
        alone = self.alone(audio)
        first = run_encoder(self.encoder_padded, padded, valid)
        in_containers = {k: decode(session, first, k) for k, session in self.decoders.items()
                         if k >= int(first["token_counts"][0])}
        results = {k: compare(alone, out, self.tie_bound) for k, out in in_containers.items()}
        worst = max(results.values(), key=lambda r: (not r["tokens_equal"], r["max_scaled_err"]))
        outputs = list(in_containers.values())
        identical = all(np.array_equal(outputs[0].token_logprobs, o.token_logprobs) for o in outputs[1:])
        return {**worst, "token_containers": {str(k): r["max_abs_err"] for k, r in results.items()},
                "token_containers_identical": identical}, clip_output(alone)


def clip_output(output) -> ClipOutput:
    """A ParaformerOutput as verify compares precisions: the CIF count bounded, the CIF weights aligned by
    encoder frame (the same frames in every precision), the tokens' log-probs compared where both have rows."""
    return ClipOutput(tuple(output.token_ids.tolist()), output.token_logprobs, len(output.token_ids),
                      (("cif_weights", output.alphas),))


def reference_outputs(directory: ModelDirectory, container_samples: int, device: str,
                      clips: dict[str, np.ndarray]) -> dict[str, ClipOutput] | None:
    """fp32's answers on `clips` when fp32 was not among the verified precisions (None: no fp32 graphs)."""
    if "fp32" not in directory.manifest.files:
        return None
    stages = Stages(directory, "fp32", container_samples, device)
    return {name: stages.clip_output(audio) for name, audio in clips.items()}


def run_encoder(session, audio: np.ndarray, valid: int) -> dict[str, np.ndarray]:
    feeds = {"audio": audio[None, :].astype(np.float32), "audio_lengths": np.array([valid], dtype=np.int32)}
    return dict(zip(PARAFORMER_ENCODER_OUTPUT_NAMES, session.run(list(PARAFORMER_ENCODER_OUTPUT_NAMES), feeds)))


def decode(session, first: dict[str, np.ndarray], tokens: int):
    return DecoderGrid.output(first, 0, session.run(None, decoder_feed(first, 0, tokens)))


def compare(alone, padded, tie_bound: float = 0.0) -> dict:
    """Tokens, log-probs and CIF outputs of one clip in the container against alone."""
    ties = near_ties(alone, padded, tie_bound)
    same_frames = len(alone.peaks) == len(padded.peaks)
    moved = fires_moved(alone.peaks, padded.peaks) if same_frames else None
    if ties is None or moved is None or (moved and tie_bound == 0):
        return {"max_abs_err": float("inf"), "max_scaled_err": float("inf"), "cosine": 0.0, "tokens_equal": False,
                "frames": [len(alone.peaks), len(padded.peaks)], "tokens": [len(alone.token_ids), len(padded.token_ids)],
                "fires_moved": moved}
    # fp16 compares the peaks by the cumulative weight they encode, scaled by it (verify's errors): its
    # rounding, summed over the frames, grows with the clip (0.7e-3 at 29 s on the CPU against 0.4e-3 at
    # 5 s), as a whole number met at a frame's edge moves a fire, where the peaks jump by 1. The per-frame
    # weights keep the per-value bound. fp32 and int8 compare the peaks themselves.
    peaks = ((integrated(alone.peaks), integrated(padded.peaks)) if tie_bound else (alone.peaks, padded.peaks))
    parts = {"token_logprobs": (alone.token_logprobs, padded.token_logprobs), "cif_weights": (alone.alphas, padded.alphas),
             "cif_peaks": peaks}
    a, b = (np.concatenate([pair[i] for pair in parts.values()]).astype(np.float64) for i in (0, 1))
    scaled = {name: errors(*(np.asarray(x, np.float64) for x in pair))["max_scaled_err"] for name, pair in parts.items()}
    return {
        **errors(a, b),
        "worst_part": max(scaled, key=scaled.get),  # which output a failure comes from
        "tokens_equal": True,
        "ties": ties,
        "fires_moved": moved,
        "frames": int(len(alone.peaks)),
        "tokens": int(len(alone.token_ids)),
    }


def integrated(peaks: np.ndarray) -> np.ndarray:
    """The cumulative CIF weight S_t that FunASR's peaks encode (frac(S_t), plus 1 where a token fires:
    models/cif.py): continuous in the alphas, where the peaks jump by 1 at a frame whose S_t crosses a whole
    number."""
    fired = np.floor(peaks.astype(np.float64))
    return np.cumsum(fired) + peaks - fired


def fires_moved(alone: np.ndarray, padded: np.ndarray) -> int | None:
    """How many tokens fire at another frame in the container than alone (their cumulative weight met the
    whole number within rounding of a frame's edge: a near-tie of the CIF, as `near_ties` is of the
    decoder); None when the fire counts differ. verify bounds how far the cumulative weight drifted."""
    fired_alone, fired_padded = np.floor(alone) >= 1, np.floor(padded) >= 1
    if fired_alone.sum() != fired_padded.sum():
        return None
    return int((fired_alone & ~fired_padded).sum())


def near_ties(alone, padded, bound: float) -> int | None:
    """How many tokens the two runs pick otherwise, when every one is a near-tie: both picks' log-probs
    within `bound` (scaled as verify's errors; fp16: verify.py's docstring). None: the counts differ, or a
    token is picked otherwise beyond the bound (any, where the bound is 0)."""
    if len(alone.token_ids) != len(padded.token_ids):
        return None
    flipped = alone.token_ids != padded.token_ids
    a, b = alone.token_logprobs[flipped], padded.token_logprobs[flipped]
    if flipped.any() and (bound == 0 or np.any(np.abs(a - b) > bound * np.maximum(1.0, np.abs(a)))):
        return None
    return int(flipped.sum())
