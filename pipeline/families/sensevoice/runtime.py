"""SenseVoice served: its one CTC graph on the session grid (pipeline/grid.py), decoded greedily, or by a beam
search over the graph's top-k biased to a stream's hotwords (beam_search.py, hotwords.py).

Graphs with in-graph decoding (pipeline/modeldir.py DECODING_OUTPUT_NAMES) return per-frame best ids and
top-k; the host then receives the full [frames, vocab] log-probs only when a caller asks (`full=True`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...batching import Clip, ClipOutput, output_names, unpack
from ...engine_options import one_session_per_graph, shape_plan
from ...grid import SessionGrid, grid_batch_sizes, grid_line
from ...hotwords import Hotword, read_hotwords_file
from ...modeldir import DECODING_OUTPUT_NAMES, ModelDirectory
from ...transcript import Transcript
from .beam_search import beam_search
from .decoding import decode_ids
from .hotwords import ContextGraph, Speller


class Runtime:
    """A SenseVoice model's sessions and decoding (the pipeline/families Runtime contract)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.policy = None
        self.batch_sizes: tuple[int, ...] = ()
        self.in_graph_decoding = False  # the graph outputs best ids and top-k (DECODING_OUTPUT_NAMES)
        self.sessions: SessionGrid | None = None
        self._speller: Speller | None = None  # hotword spelling, made on first use

    def build(self, device: str, precision: str, config: Any) -> str:
        engine = self.engine
        self.policy, _ = shape_plan(engine.options, device, engine.family)
        self.batch_sizes = grid_batch_sizes(engine, device, precision)
        path = engine.model.onnx_path(precision)
        self.sessions = SessionGrid(engine, path, self.batch_sizes, config,
                                    one_session_per_graph(engine.options, device, engine.family))
        self.in_graph_decoding = all(name in self.sessions.output_names for name in DECODING_OUTPUT_NAMES)
        return grid_line(precision, path, self.policy, self.batch_sizes,
                         "decoding in the graph" if self.in_graph_decoding else "decoding on the host",
                         self.sessions.describe())

    def warm_up(self) -> None:
        self.sessions.warm_up((self.engine.language_id("auto"), self.engine.textnorm_id(False)), self.engine.warmup_fill)

    @property
    def ready(self) -> bool:
        return self.sessions is not None and self.sessions.ready

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        return self.sessions.grid if self.sessions is not None else ()

    def session_for(self, size: int, batch: int = 1):
        return self.sessions.sessions[(batch, size)].session

    def infer(self, clips: Sequence[Clip], topk: bool, full: bool, batch: int | None) -> list[ClipOutput]:
        blank = self.engine.model.manifest.blank_id
        return self.sessions.infer(clips, batch, lambda _: output_names(self.in_graph_decoding, topk, full),
                                   lambda outputs, row, _: unpack(outputs, row, topk, full, blank))

    def transcribe_many(self, clips: Sequence[Clip], offsets: Sequence[float], batch: int | None) -> list[Transcript]:
        """Greedy CTC, or for a clip with hotwords a prefix beam search over its top-k biased towards them."""
        model = self.engine.model
        m = model.manifest
        outputs = self.infer(clips, topk=any(c.hotwords is not None for c in clips), full=False, batch=batch)
        frames = dict(blank_id=m.blank_id, prompt_frames=m.prompt_frames, frame_seconds=m.output_frame_seconds)
        return [decode_ids(out.best_ids, out.length, model.tokens, offset=offset, **frames)
                if clip.hotwords is None else
                beam_search(out.topk_ids, out.topk_logprobs, out.length, model.tokens, clip.hotwords, clip.beam,
                            offset=offset, **frames)
                for clip, out, offset in zip(clips, outputs, offsets)]

    def hotword_graph(self, hotwords: tuple[Hotword, ...], prompt: str) -> ContextGraph | None:
        """`hotwords` spelled with the model's tokens (ProtocolError bad_start if one cannot be); `prompt` unused."""
        self._speller = self._speller or Speller(self.engine.model.tokens)
        return ContextGraph(hotwords, self._speller) if hotwords else None

    def key_of(self, runner: Any) -> Any:
        return self.sessions.key_of(runner)

    def runner_at(self, key: Any) -> Any:
        return self.sessions.runner_at(key)


def read_hotwords(path: str | Path, directory: ModelDirectory) -> tuple[Hotword, ...]:
    """The server-wide hotwords file, each phrase spelled with the model's tokens (ValueError naming the line)."""
    return read_hotwords_file(path, Speller(directory.tokens).spellings)
