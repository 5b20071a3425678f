"""Batches at fixed shapes: which clips share a run, how they are packed, and what each clip gets back.

    plan_batches   clips grouped by container (the smallest that holds each), each group split into
                   batch sizes of the grid at the least estimated cost (CALL_OVERHEAD_ROWS); every
                   (batch, container) pair is a warmed session
    pack           the feed of one run: clip i in row i, zero-padded to the container, with its true
                   length; spare rows are silence of the full container length (an ordinary input, so
                   no row is ever empty: every row is computed independently, so they change no other row)
    ClipOutput     what one clip gets back: valid frames, greedy ids and log-probs per frame, optionally
                   the top-k ids and log-probs (for beam search and hotwords) and the full log-probs

Models exported with in-graph decoding (pipeline/modeldir.py DECODING_OUTPUT_NAMES) hand back only what a
call asks for; older ones hand back the full log-probs and `host_decoding` derives the same arrays.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .families.sensevoice.beam_search import DEFAULT_BEAM, TOP_K, top_k
from .modeldir import DECODING_OUTPUT_NAMES, OUTPUT_NAMES

log = logging.getLogger(__name__)

DEFAULT_GPU_BATCH_SIZES: tuple[int, ...] = (1, 4, 16)
# int8 dynamic quantisation takes each activation's range over the whole batch tensor, so one clip's
# rows would change another's scale: int8 (the CPU precision) runs one clip per call.
DEFAULT_CPU_BATCH_SIZES: tuple[int, ...] = (1,)
MAX_BATCH_SIZE = 64  # the exporter's bound on the batch dimension
HOST_TOP_K = TOP_K  # k of the host's top-k for models without in-graph decoding
# The fixed cost of one run, in rows, for plan_batches. GPU: the issue-13 H100 figures (a 30 s fp16
# segment 25.6 ms alone, 7.3 ms per segment in a batch of 16) fit about 18 ms + 6.2 ms per row, i.e. 3
# rows. CPU: arithmetic dominates; half a row stands for the call and thread start-up.
CALL_OVERHEAD_ROWS = {"cpu": 0.5, "gpu": 3.0}


@dataclass(frozen=True)
class Clip:
    """One clip to run: float32 mono audio at SAMPLE_RATE, its prompt, and how to decode it."""

    audio: np.ndarray
    language: str = "auto"
    itn: bool = False
    # Engine.hotword_graph's: None, greedy; a CTC model's ContextGraph, a beam search over the top-k biased to
    # them; a Qwen3-ASR's Qwen3Context, its prompt's context
    hotwords: Any = None
    beam: int = DEFAULT_BEAM


@dataclass(frozen=True)
class ClipOutput:
    """One clip's share of a run; frame arrays are cut to the `length` valid frames (prompt frames first)."""

    length: int
    best_ids: np.ndarray  # int [length]
    best_logprobs: np.ndarray  # float32 [length]
    topk_ids: np.ndarray | None = None  # int [length, k], best first (when asked; from an older graph, the
    #                                     host's families/sensevoice/beam_search.top_k, whose pruned entries are -inf)
    topk_logprobs: np.ndarray | None = None  # float32 [length, k]
    logprobs: np.ndarray | None = None  # float32 [frames, vocab], all frames (when asked)


@dataclass(frozen=True)
class Run:
    """One session call: `rows` clip indices (into the caller's list) in a batch of `batch` at `size`."""

    batch: int
    size: int  # container, samples
    rows: tuple[int, ...]


def validate_batch_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if not sizes or sizes[0] != 1:
        raise ValueError(f"batch sizes must include 1 (a lone clip), got {list(sizes)}")
    if sizes[-1] > MAX_BATCH_SIZE:
        raise ValueError(f"batch sizes must be at most {MAX_BATCH_SIZE}, got {sizes[-1]}")
    return sizes


def choose_batch_sizes(requested: tuple[int, ...] | None, device: str, precision: str) -> tuple[int, ...]:
    """The grid's batch sizes: the device default unless given; int8 always runs one clip per call."""
    sizes = requested or (DEFAULT_CPU_BATCH_SIZES if device == "cpu" else DEFAULT_GPU_BATCH_SIZES)
    if precision == "int8" and sizes != (1,):
        log.warning("int8 runs one clip per call (its dynamic quantisation ranges span the whole batch, so "
                    "batch-mates would change each other's output); ignoring batch sizes %s", sizes)
        return (1,)
    return sizes


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """A CLI value such as "1,4,16"; ValueError when bad."""
    try:
        return validate_batch_sizes([int(part) for part in text.split(",") if part.strip()])
    except ValueError as exc:
        raise ValueError(f"batch sizes must be comma-separated integers including 1, such as 1,4,16 ({exc})") from None


def planned_run(containers: Sequence[int], batch: int) -> Run:
    """The one run a caller planned (pipeline/planner.py): every clip in one container, at most `batch` of them."""
    if len(set(containers)) != 1 or len(containers) > batch:
        raise ValueError(f"a planned run holds at most {batch} clips of one container, got {len(containers)} "
                         f"in containers {sorted(set(containers))}")
    return Run(batch, containers[0], tuple(range(len(containers))))


def plan_batches(containers: Sequence[int], batch_sizes: Sequence[int], call_overhead: float = 0.0) -> list[Run]:
    """Runs for clips whose containers (samples) are `containers`, in the order of their first clip.

    Each container's clips are split into batches of the grid at the least estimated cost, a run of b
    rows costing `call_overhead + b` (in rows; ties go to fewer runs): with a large overhead, 3 clips
    share a batch of 4, while 5 clips run as 4 + 1 rather than in a batch of 16 with 11 spare rows.
    """
    groups: dict[int, list[int]] = {}
    for i, size in enumerate(containers):
        groups.setdefault(size, []).append(i)
    runs = []
    for size, rows in groups.items():
        start = 0
        for batch in _split(len(rows), tuple(batch_sizes), call_overhead):
            chunk = tuple(rows[start:start + batch])
            start += len(chunk)
            runs.append(Run(batch, size, chunk))
    return runs


def _split(n: int, sizes: tuple[int, ...], overhead: float) -> list[int]:
    """Batch sizes (largest first) covering n rows at the least cost (dynamic programming over n)."""
    best: list[tuple[float, int, list[int]]] = [(0.0, 0, [])]  # per row count: (cost, runs, batches)
    for m in range(1, n + 1):
        best.append(min((best[max(0, m - b)][0] + overhead + b, best[max(0, m - b)][1] + 1,
                         sorted(best[max(0, m - b)][2] + [b], reverse=True)) for b in sizes))
    return best[n][2]


def pack(clips: Sequence[np.ndarray], prompts: Sequence[tuple[int, int]], batch: int, size: int) -> dict[str, np.ndarray]:
    """The feed of one run; `prompts` are (language id, textnorm id) per clip. Spare rows repeat the
    first clip's prompt over full-length silence."""
    audio = np.zeros((batch, size), np.float32)
    lengths = np.full(batch, size, np.int32)
    language = np.full(batch, prompts[0][0], np.int32)
    textnorm = np.full(batch, prompts[0][1], np.int32)
    for row, (clip, (lang, norm)) in enumerate(zip(clips, prompts)):
        audio[row, : len(clip)] = clip
        lengths[row], language[row], textnorm[row] = len(clip), lang, norm
    return {"audio": audio, "audio_lengths": lengths, "language": language, "textnorm": textnorm}


def output_names(in_graph: bool, topk: bool, full: bool) -> tuple[str, ...]:
    """The outputs one run fetches: with in-graph decoding only the asked ones, else the full log-probs."""
    logprobs, lengths = OUTPUT_NAMES
    if not in_graph:
        return (logprobs, lengths)
    best_ids, best_logprobs, topk_ids, topk_logprobs = DECODING_OUTPUT_NAMES
    return ((lengths, best_ids, best_logprobs) + ((topk_ids, topk_logprobs) if topk else ())
            + ((logprobs,) if full else ()))


def host_decoding(logprobs: np.ndarray, k: int = HOST_TOP_K) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the graph's decoding outputs hold, computed from log-probs [frames, vocab]: best ids and
    log-probs [frames], top-k ids and log-probs [frames, k] best first (ties: the lower id first)."""
    k = min(k, logprobs.shape[-1])
    order = np.argsort(-logprobs, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logprobs, order, axis=-1)
    return order[:, 0].astype(np.int32), top[:, 0].copy(), order.astype(np.int32), top


def unpack(outputs: dict[str, np.ndarray], row: int, topk: bool, full: bool, blank_id: int = 0) -> ClipOutput:
    """Row `row` of one run's fetched outputs as a ClipOutput."""
    logprobs_name, lengths_name = OUTPUT_NAMES
    best_ids, best_logprobs, topk_ids, topk_logprobs = DECODING_OUTPUT_NAMES
    length = int(outputs[lengths_name][row])
    logprobs = outputs[logprobs_name][row] if logprobs_name in outputs else None
    if best_ids in outputs:
        ids, lps = outputs[best_ids][row, :length], outputs[best_logprobs][row, :length]
        tids = outputs[topk_ids][row, :length] if topk else None
        tlps = outputs[topk_logprobs][row, :length] if topk else None
    else:  # an older graph: decode its full log-probs on the host
        ids = np.argmax(logprobs[:length], axis=-1).astype(np.int32)
        lps = np.take_along_axis(logprobs[:length], ids[:, None], axis=-1)[:, 0]
        # the beam search's own host top-k: pruned entries are -inf, which gives the search the same result
        tids, tlps = top_k(logprobs, length, HOST_TOP_K, blank_id) if topk else (None, None)
    return ClipOutput(length, ids, lps, tids, tlps, logprobs if full else None)
