"""Prometheus metrics of one server, in their own registry (several servers may share a process in tests)."""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds; finer at the bottom where partial and short-final inference lives.
_INFERENCE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
# End of speech to final sent: includes the end-of-speech silence the segmenter waits for.
_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.ready = Gauge("unipad_ready", "1 once the model is loaded and warmed up", registry=r)
        self.sessions_active = Gauge("unipad_sessions_active", "Open streams", registry=r)
        self.sessions_total = Counter("unipad_sessions", "Streams accepted", registry=r)
        self.sessions_resumed = Counter("unipad_sessions_resumed", "Streams that resumed another one", registry=r)
        self.sessions_refused = Counter("unipad_sessions_refused", "Streams refused", ["reason"], registry=r)
        self.segments = Counter("unipad_segments", "Segments finalised (final messages sent)", registry=r)
        self.partials = Counter("unipad_partials", "Partial messages sent", registry=r)
        self.partials_dropped = Counter(
            "unipad_partials_dropped", "Partials replaced by a newer one or made stale by a final", registry=r
        )
        self.queue_depth = Gauge("unipad_worker_queue_depth", "Jobs waiting for the worker", ["kind"], registry=r)
        self.inference_seconds = Histogram(
            "unipad_inference_seconds", "Model run time per job", ["kind"], buckets=_INFERENCE_BUCKETS, registry=r
        )
        self.audio_seconds = Counter("unipad_audio_seconds", "Seconds of audio transcribed", ["kind"], registry=r)
        self.final_latency = Histogram(
            "unipad_final_latency_seconds",
            "From the arrival of a segment's end-of-speech audio to its final being sent",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.unwarmed_shape_calls = Gauge(
            "unipad_unwarmed_shape_calls", "Model runs refused: a shape no session was warmed with (should stay 0)",
            registry=r,
        )
        self.cold_shape_calls = Gauge(
            "unipad_cold_shape_calls", "CPU runs at a shape met for the first time (run, not refused: the CPU "
            "compiles nothing per shape; a Paraformer runs each clip at its own length)", registry=r,
        )
        self.errors = Counter("unipad_errors", "Error messages sent to clients", ["code"], registry=r)
        self.sessions_dropped = Counter(
            "unipad_sessions_dropped", "Streams cut off without a close handshake (client not reading)",
            ["reason"], registry=r,
        )
        self.engine_rebuilds = Counter(
            "unipad_engine_rebuilds", "Times the engine rebuilt its sessions after a device failure", registry=r
        )

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
