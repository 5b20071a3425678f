"""CTC prefix beam search with hotword biasing (pipeline/hotwords.py), over each frame's top-k tokens.

    top_k(logprobs [T, V], length, k)            -> (ids int32 [T, k], logprobs float32 [T, k]), on the host
    beam_search(ids, logprobs, length, tokens, graph, beam, ...)   -> pipeline.transcript.Transcript

Each hypothesis is a prefix (the tokens emitted so far) with the log-probability of all its alignments that
end in a blank (pb) and in its last token (pnb), plus its hotword state; it ranks by logaddexp(pb, pnb)
plus the context bonus the graph gave its prefix. Alongside the sums each prefix keeps its best single
alignment (Viterbi: vb, vnb), whose frames give the token times, exactly as greedy decoding gives them.

A token that completes a hotword earns its boost on every frame its run holds, not once (the graph's
run_bonus, folded into the run's alignments). Once only, a word the model spreads over two frames, each
leaning another way ("send" then "save" for a blend of the two), came out as both: the hotword took one
frame and its competitor kept the other, since taking both frames earned no more. Per frame, the hotword
replaces the competitor instead of joining it, whose frames then decide.

Speed (pure Python on the worker thread): frames where the blank's probability is at least BLANK_SKIP
are not searched; all hypotheses just take the blank there, a run of such frames in one step (sherpa-onnx
skips blank frames the same way); a CTC model's frames are mostly such. Elsewhere only tokens within
MARGIN of the frame's best are tried, and at most `beam` prefixes within MARGIN of the best survive a frame.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...audio import OUTPUT_FRAME_SECONDS, PROMPT_FRAMES
from .decoding import transcript_from_runs
from ...transcript import Transcript
from .hotwords import ContextGraph, ContextState

DEFAULT_BEAM = 4
TOP_K = 8  # tokens per frame (the graph's topk outputs have as many)
BLANK_SKIP = math.log(0.999)  # a frame whose blank log-prob is above this is taken as blank by every prefix
# Pruning, in log-probability: a token this far below its frame's best is not tried, and a prefix this far
# behind the best is dropped, each plus the most bonus any hotword keeps (which could make up the gap).
MARGIN = 4.0
TOP_K_WINDOW = 12.0  # host top-k keeps only tokens this close to their frame's best (a cheap compare, no sort)
_NEG = -math.inf


def top_k(logprobs: np.ndarray, length: int, k: int = TOP_K, blank_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The k best tokens of each of the first `length` frames of logprobs float [T, V], best first:
    (ids int32 [length, k], logprobs float32 [length, k]).

    Frames the search skips (blank above BLANK_SKIP) get the blank alone (-inf for the rest), which gives
    the search the same result for far less sorting; elsewhere tokens more than TOP_K_WINDOW below the
    frame's best are left out too (-inf), so a peaky frame costs a comparison instead of a partition.
    """
    length = max(0, min(int(length), logprobs.shape[0]))
    k = min(k, logprobs.shape[1])
    rows = np.asarray(logprobs[:length], dtype=np.float32)
    ids = np.full((length, k), blank_id, np.int32)
    values = np.full((length, k), _NEG, np.float32)
    values[:, 0] = rows[:, blank_id]
    busy = np.flatnonzero(rows[:, blank_id] <= BLANK_SKIP)
    if not len(busy):
        return ids, values
    sub = rows[busy]
    near = sub >= sub.max(axis=1, keepdims=True) - TOP_K_WINDOW
    crowded = np.count_nonzero(near, axis=1) > k
    few = np.flatnonzero(~crowded)
    if len(few):  # at most k candidates: sort the (row, token) pairs by row, then by log-prob
        row, token = np.divmod(np.flatnonzero(near[few]), sub.shape[1])  # (np.nonzero is 20x slower in 2-D)
        logprob = sub[few[row], token]
        order = np.lexsort((-logprob, row))
        row, token, logprob = row[order], token[order], logprob[order]
        column = np.arange(len(row)) - np.searchsorted(row, row)  # rank within the row
        ids[busy[few[row]], column] = token
        values[busy[few[row]], column] = logprob
    many = np.flatnonzero(crowded)
    if len(many):  # a flat frame: partition
        part = sub[many]
        best = np.argpartition(-part, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(part, best, axis=1), axis=1, kind="stable")
        best = np.take_along_axis(best, order, axis=1)
        ids[busy[many]] = best
        values[busy[many]] = np.take_along_axis(part, best, axis=1)
    return ids, values


class _Hyp:
    """One prefix (`prefix` numbers it, `last` is its last token). `tb` and `tnb` are the emitted tokens of
    its best alignment ending in a blank and in `last`, as linked lists of (previous, token, start frame,
    end frame) cells, so extending a prefix or a token's run costs one tuple."""

    __slots__ = ("prefix", "last", "pb", "pnb", "vb", "vnb", "tb", "tnb", "state", "bonus", "run")

    def __init__(self, prefix: int, last: int, state: ContextState | None, bonus: float, run: float = 0.0) -> None:
        self.prefix, self.last, self.state, self.bonus = prefix, last, state, bonus
        self.run = run  # the bonus each further frame of `last`'s run earns (ContextGraph.run_bonus)
        self.pb = self.pnb = self.vb = self.vnb = _NEG
        self.tb: tuple | None = None
        self.tnb: tuple | None = None

    def score(self) -> float:
        return _logaddexp(self.pb, self.pnb) + self.bonus


def _logaddexp(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    if b == _NEG:
        return a
    return a + math.log1p(math.exp(b - a))


def beam_search(
    ids: np.ndarray,
    logprobs: np.ndarray,
    length: int,
    tokens: Sequence[str],
    graph: ContextGraph | None = None,
    beam: int = DEFAULT_BEAM,
    blank_id: int = 0,
    prompt_frames: int = PROMPT_FRAMES,
    frame_seconds: float = OUTPUT_FRAME_SECONDS,
    offset: float = 0.0,
) -> Transcript:
    """Prefix beam search over ids int [T, k] and logprobs float [T, k] (each frame's candidates, any
    order; -inf pads), `length` valid frames, biased by `graph` (None: no hotwords). Times as in decode_ctc."""
    if ids.shape != logprobs.shape or ids.ndim != 2:
        raise ValueError(f"ids {ids.shape} and logprobs {logprobs.shape} must both be [frames, k]")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    length = max(0, min(int(length), ids.shape[0]))
    id_rows, lp_rows = ids[:length].tolist(), logprobs[:length].astype(np.float64)
    best_lp = lp_rows.max(axis=1) if length else np.zeros(0)
    blank_lp = np.where(ids[:length] == blank_id, lp_rows, _NEG).max(axis=1) if length else np.zeros(0)
    skip = blank_lp > BLANK_SKIP
    lp_list = lp_rows.tolist()

    root = graph.root if graph is not None else None
    margin = MARGIN + (graph.max_bonus if graph is not None else 0.0)
    links: dict[tuple[int, int], int] = {}  # (prefix, token) -> prefix number
    start = _Hyp(0, -1, root, 0.0)
    start.pb = start.vb = 0.0
    hyps = [start]
    t = 0
    while t < length:
        if skip[t]:  # a run of blank frames: every prefix takes the blank through all of it
            end = t
            while end < length and skip[end]:
                end += 1
            total = float(blank_lp[t:end].sum())
            for h in hyps:
                if h.vnb > h.vb:
                    h.vb, h.tb = h.vnb, h.tnb
                h.pb, h.pnb = _logaddexp(h.pb, h.pnb) + total, _NEG
                h.vb, h.vnb, h.tnb = h.vb + total, _NEG, None
            t = end
            continue
        floor = best_lp[t] - margin
        candidates = sorted(((lp, c) for c, lp in zip(id_rows[t], lp_list[t]) if lp >= floor), reverse=True)
        # A prefix whose score after this frame cannot come within `margin` of the best's is not extended.
        threshold = max(h.score() for h in hyps) + best_lp[t] - margin
        following: dict[int, _Hyp] = {}
        for h in hyps:
            p_any = _logaddexp(h.pb, h.pnb)
            v_any, t_any = (h.vb, h.tb) if h.vb >= h.vnb else (h.vnb, h.tnb)
            reach = threshold - p_any - h.bonus
            same = None
            for lp, c in candidates:
                if lp < reach:
                    if lp + h.run < reach:
                        break
                    if c != h.last:  # only the run's own frames earn more than their log-prob
                        continue
                if c == blank_id or c == h.last:
                    if same is None:
                        same = following.get(h.prefix)
                        if same is None:
                            same = following[h.prefix] = _Hyp(h.prefix, h.last, h.state, h.bonus, h.run)
                    if c == blank_id:
                        same.pb = _logaddexp(same.pb, p_any + lp)
                        if v_any + lp > same.vb:
                            same.vb, same.tb = v_any + lp, t_any
                        continue
                    # the token's run goes on (same prefix) ...
                    same.pnb = _logaddexp(same.pnb, h.pnb + lp + h.run)
                    if h.vnb + lp + h.run > same.vnb:
                        cell = h.tnb
                        same.vnb, same.tnb = h.vnb + lp + h.run, (cell[0], c, cell[2], t + 1)
                    if h.pb == _NEG:
                        continue
                    p_from, v_from, t_from = h.pb, h.vb, h.tb  # ... or, after a blank, it is emitted again
                else:
                    p_from, v_from, t_from = p_any, v_any, t_any
                key = (h.prefix, c)
                prefix = links.get(key)
                if prefix is None:
                    prefix = links[key] = len(links) + 1
                n = following.get(prefix)
                if n is None:
                    if graph is None:
                        n = following[prefix] = _Hyp(prefix, c, None, 0.0)
                    else:
                        gain, state = graph.step(h.state, c)
                        n = following[prefix] = _Hyp(prefix, c, state, h.bonus + gain, graph.run_bonus(state))
                n.pnb = _logaddexp(n.pnb, p_from + lp)
                if v_from + lp > n.vnb:
                    n.vnb, n.tnb = v_from + lp, (t_from, c, t, t + 1)
        ranked = sorted(((h.score(), h) for h in following.values()), key=_first, reverse=True)[:beam]
        hyps = [h for s, h in ranked if s >= ranked[0][0] - margin]
        t += 1

    if graph is not None:
        best = max(hyps, key=lambda h: h.score() + graph.finish(h.state))
    else:
        best = max(hyps, key=_Hyp.score)
    cell = best.tb if best.vb >= best.vnb else best.tnb
    runs = []
    while cell is not None:
        runs.append(cell[1:])
        cell = cell[0]
    runs.reverse()
    run_ids, starts, ends = (np.array(column, np.int64) for column in zip(*runs)) if runs else (np.zeros(0, np.int64),) * 3
    return transcript_from_runs(run_ids, starts, ends, tokens, prompt_frames, frame_seconds, offset)


def _first(pair: tuple[float, _Hyp]) -> float:
    return pair[0]
