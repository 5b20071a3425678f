"""The server side of the load benchmark: start `python -m server`, probe it, watch its CPU and memory."""
from __future__ import annotations

import argparse
import asyncio
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from pipeline.errors import UnipadError

from .common import mib


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def http_get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (all label sets) in exposition text; 0 when absent."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


class ServerProcess:
    """`python -m server` on 127.0.0.1 at a free port, started and stopped by the benchmark."""

    def __init__(self, args: argparse.Namespace, max_sessions: int) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "server", "--model", str(args.model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--max-sessions", str(max_sessions),
                   "--log-level", getattr(args, "server_log_level", "warning"),
                   "--end-silence", str(args.end_silence), "--partial-interval", str(args.partial_interval),
                   "--precision", args.precision, "--threads", str(args.threads)]
        if args.containers:
            command += ["--containers", args.containers]
        for flag in ("device", "batch_sizes", "partial_window", "cost_table"):  # absent or None: the server's default
            if getattr(args, flag, None) is not None:
                command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        if getattr(args, "measure_costs", False):
            command.append("--measure-costs")
        if getattr(args, "cuda_graph", None) is not None:  # either way when asked; else the server's default
            command.append("--cuda-graph" if args.cuda_graph else "--no-cuda-graph")
        command += getattr(args, "options", ())
        # A file, never a pipe: a pipe nobody reads would block a server that logs a lot under load.
        self.log = open(args.server_log, "w+b") if args.server_log else tempfile.TemporaryFile()
        root = Path(__file__).resolve().parents[1]
        self.process = subprocess.Popen(command, cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid

    def log_tail(self, size: int = 2000) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-size:].strip()

    async def wait_ready(self, timeout: float) -> float:
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if self.process.poll() is not None:
                raise UnipadError(f"the server exited with {self.process.returncode} while starting: {self.log_tail()}")
            try:
                status, _ = await http_get("127.0.0.1", self.port, "/readyz")
                if status == 200:
                    return time.monotonic() - began
            except (OSError, asyncio.TimeoutError, IndexError, ValueError):
                pass
            await asyncio.sleep(0.2)
        raise UnipadError(f"the server was not ready after {timeout:.0f} s")

    def stop(self) -> None:
        stop_process(self.process, 30)


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (the graceful drain), then SIGKILL if it is still running after `timeout` seconds.
    SIGCONT too: a stopped process (the hung-server fault) acts on SIGTERM only once it runs again."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def listening_pid(port: int) -> int | None:
    """The pid of the local process listening on `port` (to watch a server we did not start)."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        pass
    return None


async def sample_process(pid: int | None, stop: asyncio.Event, out: dict[str, Any]) -> None:
    """CPU percent (of one core) and RSS of `pid` every 0.5 s until `stop`."""
    if pid is None:
        return
    try:
        process = psutil.Process(pid)
        process.cpu_percent(None)
        cpu, rss = [], []
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            cpu.append(process.cpu_percent(None))
            rss.append(process.memory_info().rss)
    except psutil.Error:
        return
    out.update(cpu_mean=round(float(np.mean(cpu)), 1) if cpu else None,
               cpu_max=round(float(np.max(cpu)), 1) if cpu else None, rss_peak_mib=mib(max(rss)) if rss else None)


def summed(watched: list[dict[str, Any]]) -> dict[str, Any]:
    """Several servers' CPU and memory as one box's: the sums (peaks summed: an upper bound), and each."""
    total: dict[str, Any] = {}
    for key in ("cpu_mean", "cpu_max", "rss_peak_mib"):
        values = [w.get(key) for w in watched]
        total[key] = None if None in values else round(sum(values), 1)
    return {**total, "per_server": watched}
