"""`ServerConfig`: every server setting, one field per CLI flag, validated in one function.

Cheap to build (no model or socket is touched); `Server(config)` does the expensive work in `serve()`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from pipeline.batching import validate_batch_sizes
from pipeline.engine import PRECISION_CHOICES
from pipeline.planner import MeasuredCosts, read_cost_tables
from pipeline.providers import resolve_device
from pipeline.shapes import ShapePolicy, format_containers
from pipeline.segmenter_options import SegmenterOptions, fit_to_container, validate_options

from .access import FORWARDED_ALLOW_IPS_ENV, proxy_networks
from .doors import DOORS
from .protocol import DEFAULT_PORT

# The demo model that ships with the repository (models/demo next to this package).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "demo"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")  # json: one object per line, for log collectors (server/logs.py)
TOKEN_ENV = "UNIPAD_TOKEN"
_SEGMENTER = SegmenterOptions()  # the segmentation defaults live in pipeline/segmenter_options.py


@dataclass(frozen=True)
class ServerConfig:
    """Server settings; times are seconds, sizes bytes. Override with `dataclasses.replace`."""

    model: Path = DEFAULT_MODEL_DIR
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: any free port (tests)
    device: str | None = None  # auto, cpu, cuda, directml; None: $INFERENCE_DEVICE, else auto (pipeline/providers.py)
    precision: str = "auto"  # auto (int8 on CPU, fp16 on GPUs, when exported), fp32, int8, fp16
    containers: tuple[float, ...] | None = None  # container lengths in seconds; None: the engine's default
    threads: int = 0  # ONNX Runtime intra-op threads; 0: one per physical core
    cpu_spin_us: int = 0  # CPU: intra-op threads spin up to this long between operators; 0: never (shared cores)
    batch_sizes: tuple[int, ...] | None = None  # rows per model run; None: the engine's default (1,4,16 GPU; 1 CPU)
    cost_table: Path | None = None  # `bench model --save` output: seconds per (batch, container); None: modelled
    measure_costs: bool = False  # time the warmed grid at startup and plan from that (written to cost_table if set)
    cuda_graph: bool | None = None  # CUDA: capture and replay each session's graph; None: SenseVoice's only
    allow_tf32: bool = False  # CUDA: TF32 matmuls for fp32 (faster, no longer exact)
    share_weights: bool = True  # CPU: one copy of the weights for all sessions (EngineOptions.share_weights)
    vad: str = _SEGMENTER.vad  # the frame VAD: webrtc or silero (pipeline/vad.py)
    vad_aggressiveness: int = _SEGMENTER.vad_aggressiveness  # webrtcvad mode, 0 (least) to 3 (most aggressive)
    vad_threshold: float = _SEGMENTER.vad_threshold  # Silero's speech probability for a voiced frame
    end_silence: float = _SEGMENTER.end_silence  # trailing silence that ends a segment
    pre_roll: float = _SEGMENTER.pre_roll  # audio kept before the first voiced frame
    partial_interval: float = _SEGMENTER.partial_interval  # seconds of new audio between partials; 0: none
    partial_window: float = _SEGMENTER.partial_window  # partials decode at most this much of the segment's tail
    max_sessions: int = 16  # concurrent streams; more are refused with close 1013
    max_message_bytes: int = 1 << 20  # largest WebSocket message; larger closes with 1009
    idle_timeout: float = 60.0  # a stream that sends nothing this long is closed
    send_timeout: float = 30.0  # a client that takes longer to accept one message is cut off (not reading)
    drain_timeout: float = 30.0  # on shutdown, how long open streams get to receive their finals
    token: str | None = None  # shared secret; None: no authentication (env UNIPAD_TOKEN)
    auth_max_failures: int = 5  # wrong or missing tokens from one address within auth_cooldown ...
    auth_cooldown: float = 60.0  # ... refuse that address (HTTP 429) for this many seconds
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to connect; empty: any
    # Proxies (addresses or networks) whose X-Forwarded-For names the client (server/access.py); empty:
    # the TCP peer is the client (env UNIPAD_FORWARDED_ALLOW_IPS)
    forwarded_allow_ips: tuple[str, ...] = ()
    certfile: Path | None = None  # TLS certificate (PEM); with keyfile, serves wss:// and https://
    keyfile: Path | None = None
    funasr_port: int | None = None  # also serve the FunASR runtime protocol on this port (server/funasr.py)
    wyoming_port: int | None = None  # also serve Home Assistant's Wyoming protocol on this port (server/wyoming.py)
    wyoming_host: str = "127.0.0.1"  # Wyoming has no authentication: loopback unless told otherwise (docs/wyoming.md)
    # POST /v1/listen may fetch the audio a JSON body's "url" names (Deepgram's); off: the server makes no
    # requests to addresses clients name (server/deepgram_http.py)
    fetch_urls: bool = False
    # An upload that arrives from the same client as long after its previous one as its own sound lasts (a
    # live client's VAD cut both from one stream) is heard after the end of that one (server/upload_sequence.py)
    join_uploads: bool = True
    hotwords: Path | None = None  # server-wide hotwords, one a line (pipeline/hotwords.py read_hotwords_file)
    # The punctuation model's directory (--punc, or the default: server/punctuation_model.py); None: none
    punc: Path | None = None
    log_level: str = "info"
    log_format: str = "text"  # text, or json lines


def config_from_env(config: ServerConfig) -> ServerConfig:
    """Fill settings that may come from the environment (the token, the trusted proxies) when no flag set them."""
    if config.token is None and os.environ.get(TOKEN_ENV):
        config = dataclasses.replace(config, token=os.environ[TOKEN_ENV])
    if not config.forwarded_allow_ips and os.environ.get(FORWARDED_ALLOW_IPS_ENV):
        config = dataclasses.replace(config, forwarded_allow_ips=split_list(os.environ[FORWARDED_ALLOW_IPS_ENV]))
    return config


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated flag's values, blanks dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def segmenter_options(config: ServerConfig) -> SegmenterOptions:
    """The per-stream segmentation settings; post-roll is capped by the end silence it lies in."""
    return dataclasses.replace(
        _SEGMENTER,
        vad=config.vad,
        vad_aggressiveness=config.vad_aggressiveness,
        vad_threshold=config.vad_threshold,
        end_silence=config.end_silence,
        post_roll=min(_SEGMENTER.post_roll, config.end_silence),
        pre_roll=config.pre_roll,
        partial_interval=config.partial_interval,
        partial_window=config.partial_window,
    )


def validate_config(config: ServerConfig) -> ServerConfig:
    """Check every field; raise ValueError with a one-line message naming the flag. Returns the config."""

    def check(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    check(0 <= config.port <= 65535, f"--port must be 0-65535, got {config.port}")
    for field in (door.port for door in DOORS if door.port is not None):  # --funasr-port, --wyoming-port
        port = getattr(config, field)
        check(port is None or 0 <= port <= 65535, f"--{field.replace('_', '-')} must be 0-65535, got {port}")
    resolve_device(config.device)  # ValueError naming --device or INFERENCE_DEVICE
    check(config.precision in PRECISION_CHOICES,
          f"--precision must be one of {', '.join(PRECISION_CHOICES)}, got {config.precision!r}")
    if config.containers is not None:
        try:
            ShapePolicy(config.containers)
        except ValueError as exc:
            raise ValueError(f"--containers: {exc}") from None
        try:
            fit_to_container(_SEGMENTER, max(config.containers))
        except ValueError as exc:
            raise ValueError(f"--containers: {exc} ({format_containers(config.containers)})") from None
    check(config.threads >= 0, f"--threads must be >= 0, got {config.threads}")
    check(config.cpu_spin_us >= 0, f"--cpu-spin-us must be >= 0, got {config.cpu_spin_us}")
    if config.batch_sizes is not None:
        try:
            validate_batch_sizes(config.batch_sizes)
        except ValueError as exc:
            raise ValueError(f"--batch-sizes: {exc}") from None
    try:
        validate_options(segmenter_options(config))
    except ValueError as exc:  # name the flag, not the dataclass field
        name = str(exc).split(" ", 1)[0]
        raise ValueError(f"--{name.replace('_', '-')}: {exc}") from None
    check(config.max_sessions >= 1, f"--max-sessions must be >= 1, got {config.max_sessions}")
    check(config.max_message_bytes >= 4096, f"--max-message-bytes must be >= 4096, got {config.max_message_bytes}")
    check(config.idle_timeout > 0, f"--idle-timeout must be > 0 s, got {config.idle_timeout}")
    check(config.send_timeout > 0, f"--send-timeout must be > 0 s, got {config.send_timeout}")
    check(config.auth_max_failures >= 1, f"--auth-max-failures must be >= 1, got {config.auth_max_failures}")
    check(config.auth_cooldown > 0, f"--auth-cooldown must be > 0 s, got {config.auth_cooldown}")
    check(config.drain_timeout >= 0, f"--drain-timeout must be >= 0 s, got {config.drain_timeout}")
    check(config.token is None or len(config.token) > 0, "--token must not be empty")
    proxy_networks(config.forwarded_allow_ips)  # ValueError naming --forwarded-allow-ips
    check((config.certfile is None) == (config.keyfile is None), "--certfile and --keyfile go together")
    for name in ("certfile", "keyfile"):
        path = getattr(config, name)
        check(path is None or Path(path).is_file(), f"--{name} {path} does not exist")
    cost_tables(config)  # an unreadable table: one line now, not after the model has loaded
    tls_context(config)  # a file that is not PEM, or a key of another certificate: one line now, not at bind
    check(config.log_level in LOG_LEVELS, f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    check(config.log_format in LOG_FORMATS, f"--log-format must be one of {', '.join(LOG_FORMATS)}")
    return config


def tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The server side of TLS from --certfile/--keyfile (None without them); ValueError naming both files."""
    if config.certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.certfile, config.keyfile)
    except ssl.SSLError as exc:  # OpenSSL's words alone ("[SSL] PEM lib") name neither file nor cause
        raise ValueError(f"--certfile {config.certfile} / --keyfile {config.keyfile}: cannot load them as a PEM "
                         f"certificate and its private key ({exc})") from None
    return context


def cost_tables(config: ServerConfig) -> dict[str, MeasuredCosts]:
    """The measured cost tables of --cost-table by precision ({} without it, or when the server measures its
    own and writes them there); ValueError naming the flag."""
    if config.cost_table is None:
        return {}
    if config.measure_costs:
        if not Path(config.cost_table).parent.is_dir():
            raise ValueError(f"--cost-table {config.cost_table}: its folder does not exist (with --measure-costs "
                             f"the measured table is written there)")
        return {}
    try:
        return read_cost_tables(json.loads(Path(config.cost_table).read_text(encoding="utf-8")))
    except OSError as exc:
        raise ValueError(f"--cost-table {config.cost_table}: {exc.strerror or exc}") from None
    except ValueError as exc:  # json.JSONDecodeError is one
        raise ValueError(f"--cost-table {config.cost_table}: {exc}") from None
