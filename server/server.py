"""`Server(config)`: startup, serving, graceful shutdown. WebSocket and HTTP share one port.

    startup    listen at once (so /healthz answers; the doors with a port of their own on theirs, when
               configured: server/doors.py), load and warm the engine on the worker thread
    serve      until SIGINT/SIGTERM (or `request_shutdown()`)
    shutdown   stop accepting; every open stream stops reading, gets the finals of the audio it already
               sent, `done`, and a 1001 close; after drain_timeout the rest are closed.
               A second signal skips the waiting.
Signal handlers only set flags and events; everything else happens in `serve()`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from pipeline.engine import Engine, EngineOptions
from pipeline.errors import OverloadError, ProtocolError
from pipeline.families import family_of, read_model_hotwords
from pipeline.hotwords import Hotword, merge_hotwords
from pipeline.modeldir import ModelManifest, read_model_directory
from pipeline.segmenter import SegmenterOptions
from pipeline.segmenter_options import fit_to_container
from pipeline.providers import resolve_device
from pipeline.punctuation import Punctuator, load_punctuator
from pipeline.vad import silero_session

from .access import AuthFailures, install_redaction, proxy_networks
from .config import ServerConfig, cost_tables, segmenter_options, tls_context
from .costs import device_memory_used
from .doors import DOORS, load, stream_door
from .http import listening_urls, process_request
from .logs import quiet_requests
from .metrics import Metrics
from .model_info import notice_line
from .punctuation_model import punctuation_precision, read_punctuation_model
from .receiver import SHUTDOWN, Receiver
from .streaming import MAX_FINALS_IN_FLIGHT, StreamConnection
from .upload_sequence import UploadSequences
from .worker import Worker

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_LOAD_FAILED = 1
KEEPALIVE_INTERVAL = 20.0  # seconds between server pings; a peer that misses one for as long is dropped


def listener_options(config: ServerConfig) -> dict[str, Any]:
    """websockets.serve() settings shared by the stream port and the FunASR port."""
    return dict(
        max_size=config.max_message_bytes,
        # No permessage-deflate: PCM audio barely compresses, and each connection's zlib state would outlive
        # it until Python's cyclic garbage collector frees the closed connection (docs/reliability.md, soak).
        compression=None,
        origins=[*config.allowed_origins, None] if config.allowed_origins else None,
        ping_interval=KEEPALIVE_INTERVAL,
        ping_timeout=KEEPALIVE_INTERVAL,
        # Debug logs show ?token= handshakes; websockets' per-request INFO lines are DEBUG here (server/logs.py).
        logger=quiet_requests(install_redaction(logging.getLogger("websockets.server"))),
    )


def stream_port_options(app: Server) -> dict[str, Any]:
    """The stream port also takes POSTs (server/http_body.py, which applies the opening-handshake timeout
    itself) and answers each door's subprotocol (server/doors.py)."""
    from .http import handle_body_request, select_subprotocol
    from .http_body import connection_class

    return dict(create_connection=connection_class(functools.partial(handle_body_request, app)), open_timeout=None,
                select_subprotocol=select_subprotocol)


def engine_options(config: ServerConfig) -> EngineOptions:
    return EngineOptions(device=resolve_device(config.device), precision=config.precision,
                         containers=config.containers, threads=config.threads, batch_sizes=config.batch_sizes,
                         cuda_graph=config.cuda_graph, allow_tf32=config.allow_tf32,
                         share_weights=config.share_weights, cpu_spin_us=config.cpu_spin_us)


def fit_segments(options: SegmenterOptions, manifest: ModelManifest) -> SegmenterOptions:
    """Segments cut to the export's container where the family's export fixes its largest (fit_to_container)."""
    if not family_of(manifest).export_container:
        return options
    return fit_to_container(options, manifest.container_seconds, cut=True)


class Server:
    """One listening port (plus the port of each door that has one, when configured), one engine, one worker
    thread."""

    def __init__(self, config: ServerConfig, engine: Any = None) -> None:
        """`engine`: an already built (not yet loaded) engine; default: Engine(config.model, ...)."""
        self.config = config
        self.metrics = Metrics()
        self.auth_failures = AuthFailures(config.auth_max_failures, config.auth_cooldown)
        self.trusted_proxies = proxy_networks(config.forwarded_allow_ips)  # --forwarded-allow-ips
        self.uploads = UploadSequences()  # uploads a later one from the same client may continue (--join-uploads)
        self.engine = engine
        self.model = read_model_directory(config.model)  # what /v1/model and the startup log describe
        self.segmenter_options = fit_segments(segmenter_options(config), self.model.manifest)
        if config.vad == "silero":  # its model is loaded (and its sha256 checked) now, not by the first stream
            silero_session()
        self.model_name = self.model.manifest.name
        # The server-wide hotwords (--hotwords FILE), added to every stream's own; ValueError when bad.
        self.hotwords = read_model_hotwords(config.hotwords, self.model) if config.hotwords else ()
        # The punctuation model (--punc), checked against the speech model; None: finals are not punctuated
        self.punctuation = read_punctuation_model(config.punc, self.model) if config.punc is not None else None
        self.worker: Worker | None = None
        self.connections: set[StreamConnection] = set()  # admitted streams of both endpoints
        self.port: int | None = None  # the bound port, once listening (config.port may be 0)
        self.funasr_port: int | None = None  # the FunASR adapter's bound port, once listening (server/funasr.py)
        self.wyoming_port: int | None = None  # the Wyoming adapter's bound port, once listening (server/wyoming.py)
        self.listening = asyncio.Event()  # set once the port is bound
        self.stopped = asyncio.Event()  # set once shutdown has finished
        self.shutting_down: asyncio.Future[None]  # done when shutdown begins
        self.receiving: set[Receiver] = set()  # streams waiting for a message now: shutdown wakes them
        self.exit_code = EXIT_OK
        self._should_exit = asyncio.Event()
        self._force_exit = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._listeners: list[Any] = []

    # ---- state the HTTP endpoints and connections read -----------------------------------------------

    @property
    def ready(self) -> bool:
        w = self.worker
        return w is not None and w.ready.done() and w.ready.exception() is None

    @property
    def provider(self) -> str:
        return self.engine.provider if self.ready else "loading"

    @property
    def punctuation_name(self) -> str | None:
        """The punctuation model's name (/readyz, /v1/model), or None when finals are not punctuated."""
        return self.punctuation.manifest.name if self.punctuation is not None else None

    def hotword_graph(self, words: tuple[Hotword, ...], prompt: str = "") -> Any:
        """A stream's ContextGraph (a Qwen3-ASR's Qwen3Context): the server's hotwords and its own, and an
        OpenAI request's `prompt` for a model that takes one (None: none, greedy decoding as trained)."""
        merged = merge_hotwords(self.hotwords, words)
        return self.engine.hotword_graph(merged, prompt) if merged or prompt else None

    @functools.cached_property
    def server_hotword_graph(self) -> Any:
        """The server's hotwords alone, built once: for the OpenAI endpoints, whose requests bring none."""
        return self.hotword_graph(())

    def lenient_hotword_graph(self, words: tuple[Hotword, ...], who: str, log: logging.Logger) -> Any:
        """hotword_graph() of the words the model can spell: the others are skipped and logged on `log` (`who`:
        how the line names the stream or request), not refused, so one client configuration serves every
        model (FunASR's and Deepgram's doors, whose clients send one list to any model, as FunASR does)."""
        spelled = []
        for word in words:
            try:
                self.engine.hotword_graph((word,))
                spelled.append(word)
            except ProtocolError as exc:
                log.info("%s: hotword skipped: %s", who, exc)
        return self.hotword_graph(tuple(spelled)) if spelled else self.server_hotword_graph

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """/readyz: 503 while warming up, shutting down or full; else 200. Always JSON."""
        body: dict[str, Any] = {"sessions": len(self.connections), "max_sessions": self.config.max_sessions}
        if not self.ready:
            return 503, {"status": "warming_up", **body}
        body |= {"provider": self.engine.provider, "cuda_graph": getattr(self.engine, "cuda_graph", False),
                 "punctuation": self.punctuation_name,
                 "containers": list(self.engine.containers),
                 "batch_sizes": list(getattr(self.engine, "batch_sizes", ())),
                 "costs": self.worker.table.source if self.worker.table is not None else None,
                 "queue": self.worker.depth}
        if self._should_exit.is_set():
            return 503, {"status": "shutting_down", **body}
        if len(self.connections) >= self.config.max_sessions:
            return 503, {"status": "saturated", **body}
        return 200, {"status": "ready", **body}

    def admit(self, connection: StreamConnection) -> None:
        """Count a new stream in, or raise OverloadError (warming up or full): the client may retry."""
        if not self.ready:
            self.metrics.sessions_refused.labels("warming_up").inc()
            raise OverloadError("the server is still loading its model; retry in a few seconds")
        if len(self.connections) >= self.config.max_sessions:
            self.metrics.sessions_refused.labels("full").inc()
            raise OverloadError(f"server full ({self.config.max_sessions} streams); retry later")
        self.connections.add(connection)
        self.metrics.sessions_total.inc()
        self.metrics.sessions_active.set(len(self.connections))

    def release(self, connection: StreamConnection) -> None:
        self.connections.discard(connection)
        self.metrics.sessions_active.set(len(self.connections))

    # ---- run -----------------------------------------------------------------------------------------

    async def serve(self, install_signal_handlers: bool = True) -> int:
        """Run until shutdown; returns the process exit code."""
        if install_signal_handlers:
            self._install_signal_handlers()
        await self.startup()
        try:
            await self._main_loop()
        finally:
            await self.shutdown()
        return self.exit_code

    async def startup(self) -> None:
        loop = asyncio.get_running_loop()
        self.shutting_down = loop.create_future()
        if self.engine is None:
            self.engine = Engine(self.config.model, engine_options(self.config))
        if self.config.measure_costs:  # the measured table keeps each session's GPU memory beside its time
            self.engine.memory_probe = functools.partial(device_memory_used, self.engine.options.device_id or 0)
        self.worker = Worker(self.engine, loop, self.metrics,
                             max_finals=self.config.max_sessions * MAX_FINALS_IN_FLIGHT,
                             cost_tables=cost_tables(self.config), measure_costs=self.config.measure_costs,
                             save_costs=self.config.cost_table if self.config.measure_costs else None,
                             punctuator=self._punctuator())
        self.worker.ready.add_done_callback(self._on_ready)
        server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=functools.partial(process_request, self),
            ssl=tls_context(self.config),
            **listener_options(self.config),
            **stream_port_options(self),
        )
        self._listeners.append(server)
        self.port = server.sockets[0].getsockname()[1]
        stream_url, page_url = listening_urls(self.config.host, self.port, tls=self.config.certfile is not None)
        log.info("listening on %s (model %s, loading); browser page: %s", stream_url, self.model_name, page_url)
        log.info("%s", notice_line(self.model))
        for door in DOORS:  # the doors with a port of their own, each module imported only when asked for
            if door.port is not None and getattr(self.config, door.port) is not None:
                self._listeners.append(await load(door.start)(self))
        # Only once the ports are bound: a taken port then ends the process with no thread inside ONNX Runtime
        # (exiting while one loads a model aborts the process: "terminate called without an active exception").
        self.worker.start()  # loads and warms up on the worker thread while we already answer /healthz
        self.listening.set()

    def _punctuator(self) -> Punctuator | None:
        """The punctuation model on the CPU, whatever the speech model's device (a 10 s final's punctuation is 8-50
        ms on two cores: docs/benchmarks.md, "Punctuation"; its graph on a GPU is untried): the device's memory and
        recovery stay the speech model's. Its sessions are made and warmed on the worker thread, after the
        engine's."""
        if self.punctuation is None:
            return None
        precision = punctuation_precision(self.punctuation)
        log.info("punctuation: %s (%s, %s, cpu): finals are punctuated", self.punctuation.manifest.name,
                 self.punctuation.path, precision)
        return load_punctuator(self.punctuation, precision, "cpu", threads=self.config.threads)

    def _on_ready(self, future: asyncio.Future[None]) -> None:
        if future.cancelled() or self.stopped.is_set():  # a load that ended after shutdown: nothing to say
            return
        if future.exception() is not None:
            log.error("could not load the model: %s", future.exception())
            self.exit_code = EXIT_LOAD_FAILED
            self._should_exit.set()
            return
        self.metrics.ready.set(1)
        log.info("ready: provider %s, containers %s s", self.engine.provider,
                 ", ".join(f"{c:g}" for c in self.engine.containers))

    async def _main_loop(self) -> None:
        await self._should_exit.wait()

    async def _handle(self, ws: ServerConnection) -> None:
        """A WebSocket the handshake accepted: the StreamConnection of the door at its path."""
        path = ws.request.path.split("?", 1)[0] if ws.request is not None else ""
        await self.serve_stream(load(stream_door(path).stream)(self, ws))

    async def serve_stream(self, connection: StreamConnection) -> None:
        """Run one stream (of either endpoint) to its end; a graceful shutdown waits for it to drain."""
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await connection.run()
        finally:
            self._handlers.discard(task)

    # ---- shutdown ------------------------------------------------------------------------------------

    @property
    def shutdown_requested(self) -> bool:
        return self._should_exit.is_set()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown; called a second time, skip the waiting (what signals do)."""
        if self._should_exit.is_set():
            self._force_exit.set()
        self._should_exit.set()

    async def shutdown(self) -> None:
        self._should_exit.set()
        for listener in self._listeners:
            listener.server.close()  # stop accepting; handshakes still in progress get HTTP 503
        if self._handlers:
            log.info("shutting down: finishing %d stream(s)", len(self._handlers))
        if not self.shutting_down.done():
            self.shutting_down.set_result(None)
        for receiver in list(self.receiving):
            receiver.wake(SHUTDOWN)
        await self._wait(set(self._handlers), self.config.drain_timeout)
        for listener in self._listeners:
            listener.close()  # 1001 for whatever is still open
        await self._wait({asyncio.ensure_future(listener.wait_closed()) for listener in self._listeners}, 5.0)
        if self.worker is not None:
            self.worker.stop(timeout=0 if self._force_exit.is_set() else 5.0)
        self.metrics.ready.set(0)
        self.stopped.set()
        log.info("stopped")

    async def _wait(self, tasks: set[asyncio.Future[Any]], timeout: float) -> None:
        """Wait for all `tasks` up to `timeout` seconds, or until a forced exit."""
        if not tasks or self._force_exit.is_set():
            return
        force = asyncio.ensure_future(self._force_exit.wait())
        every = asyncio.ensure_future(asyncio.wait(tasks))
        await asyncio.wait({force, every}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        force.cancel()
        every.cancel()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled on the main thread (e.g. a server run from a test thread)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_shutdown)
            except NotImplementedError:  # Windows: no loop signal handlers
                signal.signal(sig, lambda *_: loop.call_soon_threadsafe(self.request_shutdown))

