"""The Paraformer side of `python -m export verify`: run a padded and an unpadded clip and compare.

What must not depend on the padding: the token count and ids (exactly), and the valid values of the
token log-probs, CIF weights and CIF peaks (within verify's tolerances). `compare` reports them in the
shape verify.py's SenseVoice comparison uses, so the summary, thresholds and exit status are shared.
"""
from __future__ import annotations

import numpy as np

from pipeline.paraformer_decoding import ParaformerOutput

from .verify import errors


def run_session(session, audio: np.ndarray, valid: int) -> ParaformerOutput:
    feeds = {"audio": audio[None, :].astype(np.float32), "audio_lengths": np.array([valid], dtype=np.int32)}
    return ParaformerOutput.from_graph(session.run(None, feeds))


def compare(alone: ParaformerOutput, padded: ParaformerOutput) -> dict:
    tokens_equal = np.array_equal(alone.token_ids, padded.token_ids)
    if not tokens_equal or len(alone.peaks) != len(padded.peaks):
        return {"max_abs_err": float("inf"), "max_scaled_err": float("inf"), "cosine": 0.0, "tokens_equal": False,
                "frames": [len(alone.peaks), len(padded.peaks)], "tokens": [len(alone.token_ids), len(padded.token_ids)]}
    a = np.concatenate([alone.token_logprobs, alone.alphas, alone.peaks]).astype(np.float64)
    b = np.concatenate([padded.token_logprobs, padded.alphas, padded.peaks]).astype(np.float64)
    return {
        **errors(a, b),
        "tokens_equal": True,
        "frames": int(len(alone.peaks)),
        "tokens": int(len(alone.token_ids)),
    }
