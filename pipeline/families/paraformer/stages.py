"""A Paraformer on fixed shapes in two stages, so that the decoder's cost follows the tokens, not the frames.

    stage one   encoder + CIF (the manifest's `files`): the session grid (pipeline/grid.py), one shape per audio container
    stage two   the decoder (`decoder_files`): one shape per (audio container, token container), created
                and warmed with stage one. Stage one's CIF count picks the smallest token container K that
                holds it (pipeline/shapes.py: GPUs 16, 32, 64, 128, 256; the CPU 8 ... 448 in steps of at
                most 1.25x; and always the container's frames + 1, which holds any count); the decoder
                runs on the first K rows of the token embeddings (rows past the count are zero) against
                that container's encoder output.
    sessions    on GPUs a session per shape; on the CPU one session per graph serves every shape, each
                shape warmed through its own runner (pipeline/sessions.py runner_on)
    open        on the CPU by default (pipeline/shapes.py): stage one at the clip's length, the decoder on
                its count rounded up to 4 rows; only the largest container's frames + 1 rows are warmed,
                other shapes get a runner on first use (sessions.open_runner, counted as cold)

Every decoder row depends only on its own embedding, the encoder output and the FSMN window over the
masked rows, so K changes no valid row: fp32 within float rounding of the old single graph, int8
bit-identical between token containers (`python -m export verify` checks every one it serves). A short
clip in a 30 s container used to run the decoder on 501 rows; now on the next rung above its count.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...audio import encoder_frames, samples_to_seconds
from ...modeldir import PARAFORMER_DECODER_INPUT_NAMES, PARAFORMER_DECODER_OUTPUT_NAMES
from .decoding import ParaformerOutput
from ...providers import ProviderConfig, SessionRunner
from ...sessions import create_session, open_runner, runner_on
from ...shapes import open_token_container, token_containers

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (audio container in samples, token container in rows)
RunSession = Callable[[SessionRunner, dict, tuple], list]  # Engine.infer_session (counts, faults, recovery)


def decoder_feed(first: dict[str, np.ndarray], row: int, tokens: int) -> dict[str, np.ndarray]:
    """Stage two's feed for row `row` of stage one's outputs, on `tokens` token rows (>= its count)."""
    memory, lengths, embeddings, counts = PARAFORMER_DECODER_INPUT_NAMES
    return {memory: first[memory][row:row + 1], lengths: first[lengths][row:row + 1],
            embeddings: first[embeddings][row:row + 1, :tokens], counts: first[counts][row:row + 1]}


def container_for(count: int, containers: tuple[int, ...]) -> int:
    """The smallest token container that holds `count` tokens (the last one holds any)."""
    return next((k for k in containers if count <= k), containers[-1])


@dataclass
class DecoderGrid:
    """Stage two's runners."""

    sessions: dict[Key, SessionRunner]
    stats: object = None  # open shapes: the engine's EngineStats, which counts their first runs

    @classmethod
    def build(cls, path: Path, sizes: tuple[int, ...], ladder: tuple[int, ...], config: ProviderConfig,
              threads: int, one_session: bool, device_id: int, family: Any, stats: object = None) -> DecoderGrid:
        """A runner for every (container, token container) pair of `family`'s decoder graph: on one session
        (the CPU, see sessions.runner_on) or one session each; ModelLoadError/ProviderError."""
        keys = [(size, k) for size in sizes for k in token_containers(encoder_frames(size), ladder)]
        if one_session:
            base = create_session(path, 1, 0, config, threads, {}, device_id, family, tokens=1)
            sessions = {(size, k): runner_on(base, 1, size) for size, k in keys}
        else:
            sessions = {(size, k): create_session(path, 1, size, config, threads, {}, device_id, family, tokens=k)
                        for size, k in keys}
        log.info("paraformer decoder: %d shapes (token containers %s)", len(sessions),
                 "; ".join(f"{samples_to_seconds(size):g} s: {','.join(str(k) for s, k in sessions if s == size)}"
                           for size in sizes))
        return cls(sessions, stats)

    @property
    def warmed(self) -> bool:
        return all(s.warmed for s in self.sessions.values())

    def session_for(self, size: int, count: int) -> tuple[Key, SessionRunner | None]:
        """The session for `count` tokens of a clip in the `size` container (None when there is none); with
        open shapes one made on first use."""
        if self.stats is not None:
            key = (size, open_token_container(count, encoder_frames(size)))
            return key, self.sessions.get(key) or open_runner(self.sessions, key, 1, size, self.stats)
        containers = tuple(k for s, k in self.sessions if s == size)
        key = (size, container_for(count, containers) if containers else count)
        return key, self.sessions.get(key)

    def key_of(self, runner: SessionRunner) -> Key | None:
        return next((key for key, s in self.sessions.items() if s is runner), None)

    def warm_up(self, run: RunSession, fill: float) -> None:
        """Run each session once with exactly its shape: `fill` of the container's frames valid, every
        token row counted."""
        memory, lengths, embeddings, counts = PARAFORMER_DECODER_INPUT_NAMES
        for (size, tokens), runner in self.sessions.items():
            frames = encoder_frames(size)
            width = next(i.shape[-1] for i in runner.session.get_inputs() if i.name == memory)  # the model width
            feed = {memory: np.zeros((1, frames, width), runner.dtypes[memory]),
                    lengths: np.array([max(1, int(frames * fill))], np.int32),
                    embeddings: np.zeros((1, tokens, width), runner.dtypes[embeddings]),
                    counts: np.array([tokens], np.int32)}
            run(runner, feed, PARAFORMER_DECODER_OUTPUT_NAMES, warming=True)
            runner.warmed = True

    @staticmethod
    def output(first: dict[str, np.ndarray], row: int, second: list[np.ndarray]) -> ParaformerOutput:
        """One clip's ParaformerOutput from stage one's outputs (row `row`) and stage two's."""
        token_ids, token_logprobs = second
        count, frames = int(first["token_counts"][row]), int(first["peak_lengths"][row])
        return ParaformerOutput(token_ids[0, :count], token_logprobs[0, :count], first["cif_alphas"][row, :frames],
                                first["cif_peaks"][row, :frames])
