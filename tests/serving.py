"""A real Unipad server for end-to-end tests: `serve_test_server` (tests use the fixture of the same
name in conftest.py, which supplies the suite's model; code outside fixtures imports this module)."""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, AsyncIterator


class TestServerURL(str):
    """The stream URL of a running test server (a str), plus `.http`, `.port` and `.server`."""

    __test__ = False  # not a test class, whatever pytest thinks of its name
    http: str
    port: int
    server: Any


@contextlib.asynccontextmanager
async def serve_test_server(model: Path, engine: Any = None, wait_ready: bool = True,
                            **overrides: Any) -> AsyncIterator[TestServerURL]:
    """Run a real Server on 127.0.0.1 at a free port in this event loop; yield its URL; shut it down.

    `overrides` are ServerConfig fields (`port`: a fixed one, as for a server that comes back). `engine`: a built, unloaded engine to use instead of the default
    one (e.g. one whose load() waits, to watch /readyz before warm-up). With `wait_ready`, the model is
    loaded and warmed before the block runs. On exit the server drains gracefully, as on SIGTERM.
    """
    import asyncio

    from server.config import ServerConfig, validate_config
    from server.protocol import STREAM_PATH
    from server.server import Server

    config = validate_config(dataclasses.replace(ServerConfig(), model=Path(model), **{"port": 0, **overrides}))
    server = Server(config, engine=engine)
    task = asyncio.ensure_future(server.serve(install_signal_handlers=False))
    listening = asyncio.ensure_future(server.listening.wait())
    await asyncio.wait({task, listening}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():  # failed before binding the port
        listening.cancel()
        task.result()
    if wait_ready:
        await asyncio.wait({task, server.worker.ready}, return_when=asyncio.FIRST_COMPLETED)
        server.worker.ready.result()  # raise the load error, if any
    url = TestServerURL(f"ws://127.0.0.1:{server.port}{STREAM_PATH}")
    url.http, url.port, url.server = f"http://127.0.0.1:{server.port}", server.port, server
    try:
        yield url
    finally:
        if not server.shutdown_requested:  # a test may have begun the shutdown itself
            server.request_shutdown()
        await task
