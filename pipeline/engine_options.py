"""The engine's options, its counters, and the defaults that depend on the device (pipeline/engine.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .batching import validate_batch_sizes
from .families import SENSEVOICE, Family
from .modeldir import INT8_WEIGHT_BITS, ModelManifest
from .providers import DEVICES, int8_kernels_saturate
from .shapes import DEFAULT_CPU_TOKEN_CONTAINERS, DEFAULT_GPU_CONTAINERS, DEFAULT_TOKEN_CONTAINERS, OPEN_STEP, ShapePolicy

PRECISION_CHOICES = ("auto", "fp32", "int8", "fp16")


@dataclass(frozen=True)
class EngineOptions:
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "directml"; see providers.resolve_device for the CLI/env
    precision: str = "auto"  # "auto" | "fp32" | "int8" | "fp16"
    containers: tuple[float, ...] | None = None  # seconds; None: the provider's default (pipeline/shapes.py)
    batch_sizes: tuple[int, ...] | None = None  # rows per run; None: the device's default (pipeline/batching.py)
    threads: int = 0  # intra_op_num_threads; 0: ONNX Runtime's default (one per physical core)
    device_id: int | None = None  # GPU / DirectML adapter index; None: CUDA 0, DirectML by preference
    cuda_graph: bool | None = None  # CUDA only: capture each session's graph once and replay it (IO binding);
                                    # None: as replays_cuda_graphs decides
    allow_tf32: bool = False  # CUDA only: TF32 matmuls (faster, but fp32 is then no longer exact)
    dml_performance_preference: str = "high_performance"
    # One copy of the weights for all CPU sessions (a Paraformer: one prepacked session per graph; without,
    # a session per shape, each with its weights: hundreds with a Paraformer's default CPU ladders)
    share_weights: bool = True
    # A Paraformer decoder's token containers; None: the device's default (pipeline/shapes.py)
    token_containers: tuple[int, ...] | None = None
    cpu_spin_us: int = 0  # CPU: intra-op threads spin up to this long before sleeping; 0: never (providers.py)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.precision not in PRECISION_CHOICES:
            raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {self.precision!r}")
        if self.containers is not None:
            ShapePolicy(self.containers)  # raises ValueError when invalid
        if self.batch_sizes is not None:
            object.__setattr__(self, "batch_sizes", validate_batch_sizes(self.batch_sizes))
        if self.threads < 0 or self.cpu_spin_us < 0:
            raise ValueError(f"threads and cpu_spin_us must be >= 0, got {self.threads} and {self.cpu_spin_us}")
        if self.token_containers is not None and (not self.token_containers or min(self.token_containers) < 1):
            raise ValueError(f"token containers must be positive row counts, got {self.token_containers}")


@dataclass
class EngineStats:
    """Counters of one engine (mutated only by its thread; read anywhere for metrics)."""

    calls: int = 0  # session runs that were attempted (one per batch)
    failures: int = 0  # runs that raised InferenceError (the unwarmed ones included)
    unwarmed_calls: int = 0  # runs refused: a shape no session was warmed with (accelerators; 0 in service)
    # runs at a shape met for the first time in service (CPU open shapes, pipeline/shapes.py): run, not refused
    cold_shape_calls: int = 0
    rebuilds: int = 0
    rows: int = 0  # clips run
    spare_rows: int = 0  # padding rows of partly filled batches
    inference_seconds: float = 0.0  # total wall time inside ONNX Runtime
    last_inference_seconds: float = 0.0
    last_container: int = 0  # samples
    last_batch: int = 0
    load_seconds: float = 0.0
    rss_before_load: int | None = None  # bytes, process resident set size
    rss_after_load: int | None = None
    shared_weight_bytes: int = 0  # weights held once for all sessions (0: each session has its own)
    session_rss: dict[str, int] = field(default_factory=dict)  # "4x30s" -> host RSS grown by its creation + warm-up
    session_device: dict[str, int] = field(default_factory=dict)  # "4x30s" -> device bytes (Engine.memory_probe)
    session_seconds: dict[str, float] = field(default_factory=dict)  # "4x30s" -> its creation + warm-up time

    def note_session(self, batch: int, seconds: float, before: tuple, after: tuple) -> None:
        """Add what grew from `before` to `after` (pipeline/sessions.py footprint: time, resident bytes, device
        bytes) to the figures of the session of `batch` x `seconds` (0: the one for all shapes); its creation
        and its warm-up each add theirs."""
        key = session_key(batch, seconds)
        for table, was, now in zip((self.session_seconds, self.session_rss, self.session_device), before, after):
            if was is not None and now is not None:
                table[key] = table.get(key, 0) + now - was


def session_key(batch: int, seconds: float) -> str:
    """How EngineStats names the session of `batch` x `seconds` ("4x30s"; 0 s: the one for all shapes)."""
    return f"{batch}x{seconds:g}s" if seconds else "all shapes"


INT8_DRIFT_WARNING = (
    "%s: its int8 graph has 8-bit weights, which this CPU's int8 kernels saturate (x86 without VNNI), so its "
    "answers drift from fp32's here; serving %s. Export it again (`python -m export pull NAME --force`, or the "
    "export command that made it) for 7-bit weights, which every CPU computes exactly")


def int8_drifts(manifest: ModelManifest, device: str) -> bool:
    """The model's int8 graph has 8-bit weights and this CPU's int8 kernels saturate them
    (modeldir.INT8_WEIGHT_BITS)."""
    return (device == "cpu" and "int8" in manifest.files and manifest.int8_weight_bits > INT8_WEIGHT_BITS
            and int8_kernels_saturate())


def choose_precision(requested: str, device: str, available: dict, int8_drifting: bool = False) -> str:
    """auto: int8 on CPU (an int8 graph is a CPU optimisation) unless its answers drift there (`int8_drifts`),
    fp16 on GPUs, else fp32."""
    if requested != "auto":
        return requested
    preferred = "fp16" if device != "cpu" else "fp32" if int8_drifting else "int8"
    return preferred if preferred in available else "fp32"


def default_containers(device: str, family: Family = SENSEVOICE) -> tuple[float, ...]:
    return family.cpu_containers if device == "cpu" else DEFAULT_GPU_CONTAINERS


def default_token_containers(device: str) -> tuple[int, ...]:
    return DEFAULT_CPU_TOKEN_CONTAINERS if device == "cpu" else DEFAULT_TOKEN_CONTAINERS


def replays_cuda_graphs(options: EngineOptions, device: str, family: Family) -> bool:
    """Whether the sessions capture and replay CUDA graphs: as asked, else as the family says (Family.cuda_graphs:
    SenseVoice, measured; the others have never been replayed on a GPU, so they run plain unless asked)."""
    if options.cuda_graph is not None:
        return options.cuda_graph and device == "cuda"
    return device == "cuda" and family.cuda_graphs


def one_session_per_graph(options: EngineOptions, device: str, family: Family) -> bool:
    """Whether one prepacked session per graph serves every shape (a Paraformer on the CPU, sessions.runner_on)."""
    return family.one_session_on_cpu and options.share_weights and device == "cpu"


def shape_plan(options: EngineOptions, device: str, family: Family) -> tuple[ShapePolicy, tuple[int, ...]]:
    """The shapes the engine warms on `device` (pure, so tests check a device's plan without the device): the
    audio containers, open or not (pipeline/shapes.py; only where one session serves every shape, unless
    containers or token containers are given), and a Paraformer decoder's token ladder (() when open: each
    warmed container's frames + 1 only)."""
    opened = one_session_per_graph(options, device, family) and options.containers is None and not options.token_containers
    policy = ShapePolicy(options.containers or default_containers(device, family), OPEN_STEP if opened else 0)
    return policy, () if opened else options.token_containers or default_token_containers(device)
