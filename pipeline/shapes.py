"""Container shapes: the fixed input lengths the engine pads every clip to. Container sizes live here once.

A container is a length in seconds; the engine builds and warms one ONNX Runtime session per container,
with every input dimension fixed (batch 1, `samples` = the container). A clip is zero-padded into the
smallest container that holds it and the model is told the true length, so the padding never shows in
the output (see docs and tests/pipeline/test_engine.py); the choice of containers only changes speed.

- GPUs (DirectML, CUDA): one 30 s container. DirectML builds its kernels for the first shape it sees and
  recompiles on every other shape, so a single static shape is the design card; CUDA graphs need it too.
- CPU: a ladder. The CPU provider pays nothing for a new shape, and a short clip in a short container is
  simply less arithmetic, so partial results of a few seconds stay cheap.
- CPU, Paraformer: open shapes (ShapePolicy.step). A clip runs at its own length rounded up to a whole
  encoder frame (960 samples), the decoder at its token count rounded up to 4 rows; only the largest
  container is warmed (it sizes the memory arena). ONNX Runtime's CPU provider compiles nothing per shape
  (measured, docs/benchmarks.md: a shape's first run costs what its second does, within noise), and the
  padding never shows, so an unwarmed CPU shape gives the output of the warmed container that holds it
  (tests/pipeline/test_paraformer_stages.py). Such runs are counted as cold_shape_calls, never refused;
  accelerators keep their few warmed shapes and refuse every other (unwarmed_calls).
"""
from __future__ import annotations

from dataclasses import dataclass

from .audio import OUTPUT_FRAME_SHIFT, SAMPLE_RATE, samples_to_seconds

DEFAULT_GPU_CONTAINERS: tuple[float, ...] = (30.0,)
# Measured (docs/benchmarks.md): a 1.5-2 s utterance or partial costs half in a 2 s container what it
# costs in a 4 s one, and the finer ladder doubled the streams one CPU carries.
DEFAULT_CPU_CONTAINERS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
# A Paraformer on the CPU runs one session per graph for all its shapes (pipeline/sessions.py runner_on) and
# every clip at its own length (OPEN_STEP): the one warmed container is the largest, which sizes the arena.
# (It warmed a container every second, 598 decoder shapes: 31-34 s to be ready, issue 37.)
DEFAULT_PARAFORMER_CPU_CONTAINERS: tuple[float, ...] = (30.0,)
OPEN_STEP = OUTPUT_FRAME_SHIFT  # samples: one encoder frame, so a clip's padding is under 60 ms
OPEN_TOKEN_STEP = 4  # decoder rows: a step keeps the shapes few (ONNX Runtime plans memory per shape)
# Token containers of a Paraformer's decoder (pipeline/families/paraformer/stages.py): the CIF count picks the
# smallest that holds it; each audio container adds its own frames + 1, which holds any count. GPUs hold
# a session (and its weights) per token container, so their ladder is coarse; the CPU's rungs cost only
# their warm-up, so it steps by at most 1.25x (the decoder is about a fifth of a clip's time).
DEFAULT_TOKEN_CONTAINERS: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_CPU_TOKEN_CONTAINERS: tuple[int, ...] = (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                                                 160, 192, 224, 256, 320, 384, 448)
# Word containers of a punctuation model (pipeline/punctuation.py): FunASR runs 20 words at a time plus the words
# carried from the call before (those after its last sentence end), so most calls hold 20-40 words; a text with
# no sentence end grows its call by 20 words each time (to 200, or to the whole text without a comma either), so
# the ladder doubles, and a call past its largest rung takes the next multiple of it (punctuation_container).
DEFAULT_PUNCTUATION_CONTAINERS: tuple[int, ...] = (32, 64, 128, 256, 512)
MAX_CONTAINER_SECONDS = 60.0  # a sanity bound for CLI input; the segmenter caps segments at 30 s


@dataclass(frozen=True)
class ShapePolicy:
    """A validated ladder of containers, in seconds, strictly increasing.

    Each container must be a whole number of samples at SAMPLE_RATE (so that seconds and samples convert
    both ways without rounding). Whole output frames are not required: the padded tail is masked by the
    true length, so where a container ends relative to the frame grid does not change any valid frame.
    """

    containers: tuple[float, ...]
    # Open shapes (CPU only, see the module doc): > 0 runs a clip at its length rounded up to a multiple of
    # `step` samples, up to the largest container; 0 runs it in the smallest container that holds it.
    step: int = 0

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
        if self.step < 0 or (self.step and self.sizes[-1] % self.step):
            raise ValueError(f"open shapes: the largest container must be a whole number of {self.step}-sample steps")

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
        if self.step and n_samples <= self.largest:
            return max(1, -(-n_samples // self.step)) * self.step
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


def open_token_container(count: int, frames: int) -> int:
    """An open shape's token rows (ShapePolicy.step): `count` rounded up to OPEN_TOKEN_STEP, at most frames + 1."""
    return min(max(1, -(-count // OPEN_TOKEN_STEP)) * OPEN_TOKEN_STEP, frames + 1)


def token_containers(frames: int, ladder: tuple[int, ...] = DEFAULT_TOKEN_CONTAINERS) -> tuple[int, ...]:
    """The token containers of an audio container of `frames` encoder frames: the ladder's rungs below
    frames + 1, then frames + 1 (CIF fires at most once per frame, plus the tail frame)."""
    top = frames + 1
    return tuple(k for k in sorted(ladder) if k < top) + (top,)



def punctuation_container(words: int, ladder: tuple[int, ...] = DEFAULT_PUNCTUATION_CONTAINERS) -> int:
    """The word rows a punctuation model runs `words` words in: the smallest rung of `ladder` that holds them,
    past the largest the next multiple of it (a text with neither sentence end nor comma is one call)."""
    if words < 1:
        raise ValueError(f"a punctuation call holds at least one word, not {words}")
    top = max(ladder)
    return next((k for k in sorted(ladder) if words <= k), -(-words // top) * top)
