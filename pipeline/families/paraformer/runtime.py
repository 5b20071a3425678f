"""A Paraformer served in two stages (stages.py): encoder + CIF on the session grid (pipeline/grid.py, one clip
per call), then the decoder on the token container that holds the clip's CIF count; FunASR's text and times
from both (decoding.py). It takes no hotwords: no CTC output to search, no prompt."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...batching import Clip
from ...engine_options import one_session_per_graph, shape_plan
from ...errors import ProtocolError
from .. import takes_no_hotwords
from ...grid import SessionGrid, grid_batch_sizes, grid_line
from ...modeldir import PARAFORMER_DECODER_OUTPUT_NAMES
from ...sessions import open_runner
from ...transcript import Transcript
from .decoding import ParaformerOutput, decode_paraformer
from .stages import DecoderGrid, decoder_feed

class Runtime:
    """A Paraformer's sessions of both stages and its decoding (the pipeline/families Runtime contract)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.policy = None
        self.batch_sizes: tuple[int, ...] = ()
        self.in_graph_decoding = False
        self.sessions: SessionGrid | None = None  # stage one
        self.decoder: DecoderGrid | None = None  # stage two

    def build(self, device: str, precision: str, config: Any) -> str:
        engine = self.engine
        self.policy, ladder = shape_plan(engine.options, device, engine.family)
        self.batch_sizes = grid_batch_sizes(engine, device, precision)  # 1 (Family.max_batch)
        one_session = one_session_per_graph(engine.options, device, engine.family)
        path = engine.model.onnx_path(precision)
        self.sessions = SessionGrid(engine, path, self.batch_sizes, config, one_session)
        self.decoder = DecoderGrid.build(engine.model.onnx_path(precision, decoder=True), self.policy.sizes, ladder,
                                         config, engine.options.threads, one_session, engine.options.device_id or 0,
                                         engine.family, engine.stats if self.policy.step else None)
        return grid_line(precision, path, self.policy, self.batch_sizes, "decoding on the host",
                         self.sessions.describe())

    def warm_up(self) -> None:
        engine = self.engine
        self.sessions.warm_up((engine.language_id("auto"), engine.textnorm_id(False)), engine.warmup_fill)
        self.decoder.warm_up(engine.infer_session, engine.warmup_fill)

    @property
    def ready(self) -> bool:
        return self.sessions is not None and self.sessions.ready and self.decoder.warmed

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        return self.sessions.grid if self.sessions is not None else ()

    def session_for(self, size: int, batch: int = 1):
        return self.sessions.sessions[(batch, size)].session

    def infer(self, clips: Sequence[Clip], topk: bool, full: bool, batch: int | None) -> list[ParaformerOutput]:
        return self.sessions.infer(clips, batch, lambda session: session.output_names,
                                   lambda outputs, row, run: self._second_stage(outputs, row, run.size))

    def transcribe_many(self, clips: Sequence[Clip], offsets: Sequence[float], batch: int | None) -> list[Transcript]:
        outputs = self.infer(clips, topk=False, full=False, batch=batch)
        return [decode_paraformer(out, self.engine.model.tokens, offset=offset) for out, offset in zip(outputs, offsets)]

    def _second_stage(self, first: dict[str, np.ndarray], row: int, size: int) -> ParaformerOutput:
        """Stage two for one clip of a stage-one run: the decoder on the token container that holds its count."""
        (_, tokens), session = self.decoder.session_for(size, int(first["token_counts"][row]))
        if session is None or not session.warmed:
            self.engine.refuse_unwarmed(f"the decoder on {tokens} tokens of {size} samples",
                                        ",".join(f"{s}/{k}" for s, k in self.decoder.sessions), samples=size,
                                        tokens=tokens)
        second = self.engine.infer_session(session, decoder_feed(first, row, tokens), PARAFORMER_DECODER_OUTPUT_NAMES)
        return DecoderGrid.output(first, row, second)

    def hotword_graph(self, hotwords: tuple[Any, ...], prompt: str) -> None:
        if hotwords:
            raise ProtocolError(takes_no_hotwords(self.engine.family), code="bad_start")
        return None

    def key_of(self, runner: Any) -> Any:
        key = self.decoder.key_of(runner)
        return ("decoder", key) if key is not None else ("encoder", self.sessions.key_of(runner))

    def runner_at(self, key: Any) -> Any:
        stage, inner = key
        if inner is None:
            return None
        if stage == "encoder":
            return self.sessions.runner_at(inner)
        runner = self.decoder.sessions.get(inner)
        if runner is None and self.policy.step:  # an open shape (CPU) gets its runner again
            runner = open_runner(self.decoder.sessions, inner, 1, inner[0], self.engine.stats)
        return runner
