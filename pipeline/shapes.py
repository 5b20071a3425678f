"""Container shapes: the fixed input lengths the engine pads every clip to. Container sizes live here once.

A container is a length in seconds; the engine builds and warms one ONNX Runtime session per container,
with every input dimension fixed (batch 1, `samples` = the container). A clip is zero-padded into the
smallest container that holds it and the model is told the true length, so the padding never shows in
the output (see docs and tests/pipeline/test_engine.py); the choice of containers only changes speed.

- GPUs (DirectML, CUDA): one 30 s container. DirectML builds its kernels for the first shape it sees and
  recompiles on every other shape, so a single static shape is the design card; CUDA graphs need it too.
- CPU: a ladder. The CPU provider pays nothing for a new shape, and a short clip in a short container is
  simply less arithmetic, so partial results of a few seconds stay cheap.
"""
from __future__ import annotations

from dataclasses import dataclass

from .audio import SAMPLE_RATE, samples_to_seconds

DEFAULT_GPU_CONTAINERS: tuple[float, ...] = (30.0,)
# Measured (docs/benchmarks.md): a 1.5-2 s utterance or partial costs half in a 2 s container what it
# costs in a 4 s one, and the finer ladder doubled the streams one CPU carries.
DEFAULT_CPU_CONTAINERS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
# A Paraformer on the CPU runs one session per graph for all its shapes (pipeline/sessions.py runner_on),
# so a rung costs only its warm-up: a rung every second keeps the padding under 1 s (a 29 s clip in a 30 s
# container was 3-4 % slower than FunASR's export at its exact length; docs/benchmarks.md, issue 26). The
# price is load time: 33 s instead of 13 s for the full-size int8 model.
DEFAULT_PARAFORMER_CPU_CONTAINERS: tuple[float, ...] = tuple(float(s) for s in range(1, 31))
# Token containers of a Paraformer's decoder (pipeline/paraformer_stages.py): the CIF count picks the
# smallest that holds it; each audio container adds its own frames + 1, which holds any count. GPUs hold
# a session (and its weights) per token container, so their ladder is coarse; the CPU's rungs cost only
# their warm-up, so it steps by at most 1.25x (the decoder is about a fifth of a clip's time).
DEFAULT_TOKEN_CONTAINERS: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_CPU_TOKEN_CONTAINERS: tuple[int, ...] = (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                                                 160, 192, 224, 256, 320, 384, 448)
MAX_CONTAINER_SECONDS = 60.0  # a sanity bound for CLI input; the segmenter caps segments at 30 s


@dataclass(frozen=True)
class ShapePolicy:
    """A validated ladder of containers, in seconds, strictly increasing.

    Each container must be a whole number of samples at SAMPLE_RATE (so that seconds and samples convert
    both ways without rounding). Whole output frames are not required: the padded tail is masked by the
    true length, so where a container ends relative to the frame grid does not change any valid frame.
    """

    containers: tuple[float, ...]

    def __post_init__(self) -> None:
        containers = tuple(float(c) for c in self.containers)
        object.__setattr__(self, "containers", containers)
        if not containers:
            raise ValueError("at least one container is needed")
        for c in containers:
            if not 0 < c <= MAX_CONTAINER_SECONDS:
                raise ValueError(f"container {c:g} s is outside (0, {MAX_CONTAINER_SECONDS:g}] s")
            samples = c * SAMPLE_RATE
            if abs(samples - round(samples)) > 1e-6:
                raise ValueError(f"container {c:g} s is not a whole number of samples at {SAMPLE_RATE} Hz")
        if any(b <= a for a, b in zip(containers, containers[1:])):
            raise ValueError(f"containers must be strictly increasing, got {format_containers(containers)}")

    @property
    def sizes(self) -> tuple[int, ...]:
        """Container lengths in samples, ascending."""
        return tuple(int(round(c * SAMPLE_RATE)) for c in self.containers)

    @property
    def largest(self) -> int:
        """The largest container, in samples: the longest clip the engine accepts."""
        return self.sizes[-1]

    def container_for(self, n_samples: int) -> int:
        """The smallest container (in samples) that holds `n_samples`; ValueError when none does.

        The segmenter never produces a segment longer than the largest container (its cap is 30 s), so
        that error means a caller bypassed it.
        """
        if n_samples < 0:
            raise ValueError(f"negative clip length {n_samples}")
        for size in self.sizes:
            if n_samples <= size:
                return size
        raise ValueError(
            f"a clip of {samples_to_seconds(n_samples):.3f} s is longer than the largest container "
            f"({self.containers[-1]:g} s)"
        )


def parse_containers(text: str) -> tuple[float, ...]:
    """Parse a CLI value such as "4,8,15,30" (seconds) into a validated, sorted tuple; ValueError if bad."""
    try:
        values = tuple(sorted(float(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise ValueError(f"containers must be comma-separated seconds such as 4,8,15,30, got {text!r}") from None
    return ShapePolicy(values).containers


def format_containers(containers: tuple[float, ...]) -> str:
    return ",".join(f"{c:g}" for c in containers)


def token_containers(frames: int, ladder: tuple[int, ...] = DEFAULT_TOKEN_CONTAINERS) -> tuple[int, ...]:
    """The token containers of an audio container of `frames` encoder frames: the ladder's rungs below
    frames + 1, then frames + 1 (CIF fires at most once per frame, plus the tail frame)."""
    top = frames + 1
    return tuple(k for k in sorted(ladder) if k < top) + (top,)

