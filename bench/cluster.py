"""Several `python -m server` processes behind HAProxy on 127.0.0.1, with deploy/haproxy.cfg as shipped
(its addresses set through the environment): what `python -m bench failover` and the failover
test run. HAProxy's stats CSV tells which servers it considers up.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from pipeline.errors import UnipadError
from server.protocol import STREAM_PATH

from .serverproc import ServerProcess, free_port, http_get, stop_process

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"
SERVERS = 3  # deploy/haproxy.cfg names three servers


def haproxy_binary() -> str | None:
    """HAProxy on PATH or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def server_args(model: Path, threads: int, server_log: Path | None = None,
                options: tuple[str, ...] = ()) -> argparse.Namespace:
    """What ServerProcess needs: the demo settings, finals only (no partial decoding to share the CPU with);
    `options`: more server flags."""
    return argparse.Namespace(model=model, end_silence=0.5, partial_interval=0.0, precision="auto",
                              threads=threads, containers=None, server_log=server_log, options=options)


class Balancer:
    """HAProxy with deploy/haproxy.cfg in front of `ports` on 127.0.0.1."""

    def __init__(self, ports: list[int], settings: dict[str, str] | None = None) -> None:
        """settings: more of haproxy.cfg's variables (UNIPAD_LB_AUTH_FAILURES, ...)."""
        binary = haproxy_binary()
        if binary is None:
            raise UnipadError("haproxy is not installed (Debian: apt-get install haproxy)")
        if len(ports) != SERVERS:
            raise ValueError(f"deploy/haproxy.cfg balances {SERVERS} servers, got {len(ports)}")
        self.port, self.stats_port = free_port(), free_port()
        env = {**os.environ, "UNIPAD_LB_BIND": f"127.0.0.1:{self.port}",
               "UNIPAD_LB_STATS": f"127.0.0.1:{self.stats_port}"}
        env |= {f"UNIPAD_SERVER_{i + 1}": f"127.0.0.1:{port}" for i, port in enumerate(ports)} | (settings or {})
        self.log = tempfile.TemporaryFile()
        # -db: stay in the foreground, so SIGTERM to this pid stops it.
        self.process = subprocess.Popen([binary, "-db", "-f", str(HAPROXY_CONFIG)], env=env, cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{STREAM_PATH}"

    def log_tail(self, size: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-size:].strip()

    async def servers(self) -> dict[str, dict[str, str]]:
        """HAProxy's view of each server: status (UP, DOWN...), scur (open sessions), stot (total)."""
        url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())  # chunked
        rows = csv.DictReader(io.StringIO(body.lstrip("# ")))
        return {row["svname"]: row for row in rows if row["pxname"] == "unipad" and row["svname"].startswith("asr")}

    async def wait_status(self, name: str, wanted: str, timeout: float = 30.0) -> None:
        """Until HAProxy reports server `name` (asr1, asr2, asr3) as `wanted` (UP or DOWN...)."""
        began = time.monotonic()
        status = "?"
        while time.monotonic() - began < timeout:
            if self.process.poll() is not None:
                raise UnipadError(f"haproxy exited with {self.process.returncode}: {self.log_tail()}")
            try:
                status = (await self.servers())[name]["status"]
                if status.startswith(wanted):
                    return
            except (OSError, asyncio.TimeoutError, KeyError, ValueError, IndexError):
                pass
            await asyncio.sleep(0.2)
        raise UnipadError(f"HAProxy still reports {name} as {status} after {timeout:.0f} s, not {wanted}")

    def stop(self) -> None:
        stop_process(self.process, 10)


class Cluster:
    """Three servers and HAProxy; `async with Cluster(...) as cluster:` starts them and waits until every
    server is ready and up in HAProxy; leaving stops whatever is still running."""

    def __init__(self, model: Path, max_sessions: int, threads: int = 1, ready_timeout: float = 120.0,
                 server_options: tuple[str, ...] = (), balancer_settings: dict[str, str] | None = None) -> None:
        self.args = server_args(model, threads, options=server_options)
        self.balancer_settings = balancer_settings
        self.max_sessions = max_sessions
        self.ready_timeout = ready_timeout
        self.servers: list[ServerProcess] = []
        self.balancer: Balancer | None = None

    @staticmethod
    def name(index: int) -> str:
        return f"asr{index + 1}"  # its name in deploy/haproxy.cfg

    async def __aenter__(self) -> Cluster:
        try:
            self.servers = [ServerProcess(self.args, self.max_sessions) for _ in range(SERVERS)]
            await asyncio.gather(*(s.wait_ready(self.ready_timeout) for s in self.servers))
            self.balancer = Balancer([s.port for s in self.servers], self.balancer_settings)
            for i in range(SERVERS):
                await self.balancer.wait_status(self.name(i), "UP")
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def server_metric(self, index: int, path: str = "/metrics") -> str:
        _, body = await http_get("127.0.0.1", self.servers[index].port, path)
        return body

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        for server in self.servers:
            server.stop()
