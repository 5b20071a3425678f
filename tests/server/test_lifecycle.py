"""The server as a process: signals, graceful and forced shutdown, TLS, allowed origins."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import websockets

from pipeline.audio import seconds_to_samples
from pipeline.engine import Engine, EngineOptions
from server.config import ServerConfig
from server.protocol import CLOSE_GOING_AWAY, STREAM_PATH
from server.server import Server
from server_testkit import http_get, pcm16, run_stream

ROOT = Path(__file__).resolve().parents[2]


async def read_log_until(stream: asyncio.StreamReader, pattern: str) -> re.Match:
    while line := await asyncio.wait_for(stream.readline(), 60):
        if match := re.search(pattern, line.decode()):
            return match
    raise AssertionError(f"server exited before logging {pattern!r}")


async def test_sigterm_finishes_open_segments_then_exits_0(test_model_dir, speech):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--model", str(test_model_dir), "--port", "0", "--partial-interval", "0",
        cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )
    try:
        port = int((await read_log_until(proc.stderr, r"listening on ws://127\.0\.0\.1:(\d+)")).group(1))
        await read_log_until(proc.stderr, r"ready: provider \w+")
        second = speech.utterances[1]
        async with websockets.connect(f"ws://127.0.0.1:{port}{STREAM_PATH}") as ws:
            await ws.send(json.dumps({"type": "start"}))
            await ws.recv()  # ready
            await ws.send(pcm16(speech.audio[: seconds_to_samples((second["start"] + second["end"]) / 2)]))
            assert json.loads(await ws.recv())["segment"] == 0
            proc.send_signal(signal.SIGTERM)
            messages = [json.loads(m) async for m in ws]
            assert ws.close_code == CLOSE_GOING_AWAY
        assert [(m["type"], m.get("segment")) for m in messages] == [("final", 1), ("done", None)]
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="Linux's open-files limit")
async def test_a_low_open_files_limit_is_raised_to_the_hard_one(test_model_dir):
    """Started with the 256 open files a soft limit may give it, the server takes the hard limit: 300 idle
    sockets (a client's, or an attacker's) then leave it answering. With 256 it stopped accepting (EMFILE)
    until they timed out."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit here is {hard}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--model", str(test_model_dir), "--port", "0", cwd=ROOT,
        stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    idle = []
    try:
        raised = await read_log_until(proc.stderr, r"open files: limit raised from 256 to (\d+)")
        port = int((await read_log_until(proc.stderr, r"listening on ws://127\.0\.0\.1:(\d+)")).group(1))
        await read_log_until(proc.stderr, r"ready: provider \w+")
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert re.search(rf"Max open files\s+{raised.group(1)}\s", limits) and int(raised.group(1)) >= 1024
        for _ in range(300):
            idle.append((await asyncio.open_connection("127.0.0.1", port))[1])
        status, _, _ = await asyncio.wait_for(http_get(f"http://127.0.0.1:{port}", "/readyz"), 10)
        assert status == 200
    finally:
        for writer in idle:
            writer.close()
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_taken_port_is_one_error_line_and_exit_1(test_model_dir, log_format):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run([sys.executable, "-m", "server", "--model", str(test_model_dir), "--log-format",
                               log_format, "--port", str(taken.getsockname()[1])],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    line = json.loads(done.stderr)["message"] if log_format == "json" else done.stderr  # json: was plain text
    assert line.startswith("unipad: error: ") and "address already in use" in line


class LoadRecordingEngine(Engine):
    def load(self, warm_up: bool = True) -> Engine:
        self.load_began.set()
        return super().load(warm_up)


async def test_taken_port_fails_before_the_model_starts_loading(test_model_dir):
    # Exiting while ONNX Runtime loads on the worker thread aborted the process (exit 134, "terminate called
    # without an active exception"), so the port is bound before the worker starts.
    engine = LoadRecordingEngine(test_model_dir, EngineOptions(device="cpu"))
    engine.load_began = threading.Event()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = dataclasses.replace(ServerConfig(), model=test_model_dir, port=taken.getsockname()[1])
        with pytest.raises(OSError):
            await Server(config, engine=engine).serve(install_signal_handlers=False)
    await asyncio.sleep(0.5)  # time enough for a started worker thread to reach load()
    assert not engine.load_began.is_set()


async def test_ctrl_c_during_a_long_warm_up_exits_cleanly(test_model_dir):
    # Shutdown waits 5 s for the worker; a load still running after that used to abort the process at exit
    # (exit 134, "terminate called without an active exception"). 31 long containers warm for longer than 5 s.
    ladder = ",".join(str(seconds) for seconds in range(30, 61))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--model", str(test_model_dir), "--port", "0", "--threads", "1",
        "--containers", ladder, cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await read_log_until(proc.stderr, r"warmed batch")
        proc.send_signal(signal.SIGINT)
        rest = (await asyncio.wait_for(proc.stderr.read(), 60)).decode()
        assert await proc.wait() == 0, rest
        assert "terminate called" not in rest and "ready:" not in rest
        assert rest.rstrip().endswith("stopped")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_second_shutdown_request_skips_the_drain(serve_test_server, speech):
    running, release = threading.Event(), threading.Event()

    def stuck_model(call: int) -> None:
        running.set()
        release.wait(60)

    try:
        async with serve_test_server(partial_interval=0, drain_timeout=120) as url:
            url.server.engine.fault_hook = stuck_model
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps({"type": "start"}))
                await ws.recv()
                await ws.send(pcm16(speech.audio[: seconds_to_samples(speech.utterances[0]["end"] + 1)]))
                assert await asyncio.to_thread(running.wait, 30)
                url.server.request_shutdown()  # graceful: would wait for the stuck final ...
                await asyncio.sleep(0.1)
                assert not url.server.stopped.is_set()
                url.server.request_shutdown()  # ... the second request (signal) does not
                await asyncio.wait_for(url.server.stopped.wait(), 30)
                await asyncio.wait_for(ws.wait_closed(), 30)
                assert ws.close_code == CLOSE_GOING_AWAY
    finally:
        release.set()


async def test_tls(serve_test_server, speech, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    client = ssl.create_default_context(cafile=str(cert))
    async with serve_test_server(certfile=cert, keyfile=key) as url:
        result = await run_stream(url.replace("ws://", "wss://"), speech.audio, ssl=client)
    assert len(result.of("final")) == len(speech.utterances)


async def test_allowed_origins(serve_test_server):
    async with serve_test_server(allowed_origins=("https://app.example",)) as url:
        async with websockets.connect(url, origin="https://app.example") as ws:  # allowed
            await ws.send('{"type": "start"}')
            assert json.loads(await ws.recv())["type"] == "ready"
        async with websockets.connect(url) as ws:  # no Origin: not a browser, allowed
            await ws.send('{"type": "start"}')
            assert json.loads(await ws.recv())["type"] == "ready"
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(url, origin="https://evil.example"):
                pass
        status, _, _ = await http_get(url.http, "/healthz")  # HTTP paths are not origin-checked
    assert refused.value.response.status_code == 403
    assert status == 200
