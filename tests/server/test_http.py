"""Plain HTTP on the stream port: /healthz, /readyz, /metrics and the browser page."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import numpy as np
import pytest
import websockets
from websockets.frames import Frame, Opcode

from pipeline.audio import SAMPLE_RATE
from pipeline.engine import Engine, EngineOptions
from server.http import STATIC_DIR
from server.protocol import CLOSE_TRY_AGAIN
from openai_testkit import raw_exchange
from server_testkit import http_get, run_stream, send_and_collect


class GatedEngine(Engine):
    """The real engine, whose load() waits for the test to open the gate (to watch the warm-up phase)."""

    gate = threading.Event()

    def load(self, warm_up: bool = True) -> Engine:
        assert self.gate.wait(60)
        return super().load(warm_up)


def metric(text: str, name: str) -> float:
    """The value of one unlabelled sample in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def test_readyz_is_503_until_warmed_up_while_healthz_answers(serve_test_server, test_model_dir):
    engine = GatedEngine(test_model_dir, EngineOptions(device="cpu"))
    engine.gate = threading.Event()
    async with serve_test_server(engine=engine, wait_ready=False) as url:
        status, _, body = await http_get(url.http, "/healthz")
        assert status == 200
        status, headers, body = await http_get(url.http, "/readyz")
        assert status == 503
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["status"] == "warming_up"
        early = await send_and_collect(url, ['{"type": "start"}'])
        assert [m["code"] for m in early.messages] == ["overloaded"]
        assert early.close_code == CLOSE_TRY_AGAIN

        engine.gate.set()
        await url.server.worker.ready
        status, _, body = await http_get(url.http, "/readyz")
        ready = json.loads(body)
    assert status == 200
    assert ready["status"] == "ready"
    assert ready["provider"] == "CPUExecutionProvider" and ready["cuda_graph"] is False
    assert ready["containers"] == list(engine.containers)
    assert ready["sessions"] == 0


async def test_readyz_is_503_when_saturated(serve_test_server):
    import websockets

    async with serve_test_server(max_sessions=1) as url:
        async with websockets.connect(url) as ws:
            await ws.send('{"type": "start"}')
            await ws.recv()
            status, _, body = await http_get(url.http, "/readyz")
            assert status == 503
            assert json.loads(body)["status"] == "saturated"
            await ws.send('{"type": "stop"}')
            await ws.recv()


async def test_metrics_and_no_unwarmed_shapes_across_segment_lengths(serve_test_server, speech):
    """Segments from 1 s to 12 s (every CPU container) and their partials all run on warmed shapes."""
    u = speech.utterances
    word = speech.audio[int(u[1]["start"] * SAMPLE_RATE):int(u[1]["end"] * SAMPLE_RATE)]  # ~1.7 s of speech
    gap = np.zeros(SAMPLE_RATE, np.float32)
    pieces = [gap]
    for repeats in (1, 2, 4, 7):
        pieces += [np.tile(word, repeats), gap]
    async with serve_test_server(partial_interval=0.5) as url:
        result = await run_stream(url, np.concatenate(pieces))
        status, headers, body = await http_get(url.http, "/metrics")
        engine_calls = url.server.engine.stats.calls
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert len(result.of("final")) == 4
    assert [f["end"] - f["start"] > 1.0 * n for f, n in zip(result.of("final"), (1, 2, 4, 7))] == [True] * 4
    assert metric(text, "unipad_unwarmed_shape_calls") == 0
    assert metric(text, "unipad_segments_total") == 4
    assert metric(text, "unipad_final_latency_seconds_count") == 4
    assert metric(text, "unipad_sessions_total") == 1
    assert metric(text, "unipad_sessions_active") == 0
    assert metric(text, "unipad_ready") == 1
    runs = sum(float(line.split()[1]) for line in text.splitlines()
               if line.startswith("unipad_inference_seconds_count"))
    assert runs == engine_calls >= 4
    for name in ("unipad_partials_dropped_total", "unipad_partials_total", 'unipad_worker_queue_depth{kind="final"}'):
        assert name in text


async def test_static_page_and_unknown_paths(serve_test_server):
    async with serve_test_server() as url:
        missing = await http_get(url.http, "/static/nothing.js")
        traversal = await http_get(url.http, "/static/../server/config.py")
        other = await http_get(url.http, "/v2/whatever")
        page = await http_get(url.http, "/") if (STATIC_DIR / "index.html").is_file() else None
    for status, _, _ in (missing, traversal, other):
        assert status == 404
    if page is not None:
        assert page[0] == 200 and page[1]["content-type"].startswith("text/html")


async def test_probes_answer_head_as_get(serve_test_server):
    """`curl -I` and monitors that check with HEAD: the GET's status and headers, no body (they were 404s)."""
    async with serve_test_server() as url:
        for path in ("/healthz", "/readyz", "/metrics"):
            got = await http_get(url.http, path)
            head_status, head = await raw_exchange(url.port, f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert got[0] == head_status == 200 and head == b"", (path, head_status, head)


async def test_a_request_head_must_arrive_whole_in_time(serve_test_server, monkeypatch):
    """One deadline for a POST's head, as websockets' handshake has for a GET's: trickled a byte at a time
    (each well within the timeout between packets) it is refused once the deadline passes; it was kept
    open as long as bytes came (16 KiB of head: 45 hours at one byte every 10 s)."""
    import server.http_body

    monkeypatch.setattr(server.http_body, "OPEN_TIMEOUT", 1.0)
    async with serve_test_server() as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", url.port)
        started = asyncio.get_running_loop().time()
        writer.write(b"POST /v1/audio/transcriptions HTTP/1.1\r\n")
        answer = b""
        for _ in range(20):  # 4 s of "X-Slow: ..." at one byte per 0.2 s
            writer.write(b"X")
            await asyncio.sleep(0.2)
            with contextlib.suppress(asyncio.TimeoutError):
                answer += await asyncio.wait_for(reader.read(1024), 0.01)
            if answer or reader.at_eof():
                break
        elapsed = asyncio.get_running_loop().time() - started
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400") and elapsed < 2.5, (answer[:80], elapsed)


async def test_pipelined_requests_get_the_first_answered(serve_test_server, speech):
    """HTTP/1.1 lets a client send its next request before the answer: the first is answered (the server
    closes after each answer, and the client sends the rest again), where websockets read the second as
    WebSocket frames and the first got nothing. A WebSocket client that sends frames right behind its
    handshake keeps them."""
    async with serve_test_server() as url:
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n\r\n".encode()
        for piece in (len(request) * 2, len(request) - 2):  # both in one packet; the first head's end split
            reader, writer = await asyncio.open_connection("127.0.0.1", url.port)
            writer.write((request * 2)[:piece])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write((request * 2)[piece:])
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1, answer[:200]

        reader, writer = await asyncio.open_connection("127.0.0.1", url.port)
        writer.write(f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n".encode()
                     + Frame(Opcode.TEXT, json.dumps({"type": "start"}).encode()).serialize(mask=True))
        assert b" 101 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        frame = await asyncio.wait_for(reader.readuntil(b'"ready"'), 10)  # the server's answer to "start"
        writer.close()
        assert frame[0] == 0x81, frame  # a text frame, the session's first


async def test_stream_path_with_a_trailing_slash(serve_test_server, speech):
    """`/v1/stream/` is the stream (it went to the OpenAI routes under /v1/ and got their JSON 404); a
    browser's plain GET of it gets the WebSocket hint, like `/v1/stream`'s."""
    async with serve_test_server() as url:
        streamed = await run_stream(url + "/", speech.audio)
        status, headers, body = await http_get(url.http, "/v1/stream/")
    assert streamed.messages[-1] == {"type": "done", "segments": len(speech.utterances)}
    assert status == 426 and headers["upgrade"] == "websocket" and b"WebSocket" in body


async def test_a_mistyped_path_under_v1_gets_the_same_hint_as_elsewhere(serve_test_server):
    """`/v1/streamx` got OpenAI's bare JSON 404 while `/foo` said where the stream is: both say it now, a
    WebSocket handshake in text as at `/foo`, plain HTTP in OpenAI's error shape."""
    async with serve_test_server() as url:
        base = url.rsplit("/v1/", 1)[0]
        refused = {}
        for path in ("/v1/streamx", "/foo"):
            with pytest.raises(websockets.InvalidStatus) as caught:
                async with websockets.connect(base + path):
                    pass
            refused[path] = caught.value.response
        status, _, body = await http_get(url.http, "/v1/streamx")
    for path, answer in refused.items():
        assert answer.status_code == 404
        assert answer.body.decode() == f"no WebSocket endpoint at {path}; use /v1/stream" + (
            " (or /v1/realtime for OpenAI Realtime)\n" if path.startswith("/v1/") else "\n")
    error = json.loads(body)["error"]
    assert status == 404 and error["message"].startswith("Invalid URL (GET /v1/streamx); use /v1/stream")


async def test_static_content_types(serve_test_server, tmp_path, monkeypatch):
    """index.html, .js and .css are served with their types; anything else in the folder is not."""
    import server.http

    for name, body in (("index.html", "<html></html>"), ("app.js", "let a;"), ("app.css", "p {}"), ("x.py", "")):
        (tmp_path / name).write_text(body)
    monkeypatch.setattr(server.http, "STATIC_DIR", tmp_path)
    async with serve_test_server() as url:
        got = {path: await http_get(url.http, path) for path in ("/", "/static/app.js", "/static/app.css",
                                                                 "/static/x.py", "/static/index.html")}
    assert got["/"][1]["content-type"] == "text/html; charset=utf-8" and got["/"][2] == b"<html></html>"
    assert got["/static/app.js"][1]["content-type"] == "text/javascript; charset=utf-8"
    assert got["/static/app.css"][1]["content-type"] == "text/css; charset=utf-8"
    assert got["/static/index.html"][0] == 200
    assert got["/static/x.py"][0] == 404


@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "--port"),
    (["--vad-aggressiveness", "7"], "--vad-aggressiveness"),
    (["--vad", "silero", "--vad-threshold", "0"], "--vad-threshold"),
    (["--end-silence", "0.01"], "--end-silence"),
    (["--device", "tpu"], "--device"),
    (["--certfile", "/nonexistent.pem", "--keyfile", "/nonexistent.key"], "--certfile"),
    (["--containers", "1,2"], "--containers: the largest must hold a whole segment (30 s of audio)"),
    (["--certfile", __file__, "--keyfile", __file__], "cannot load them as a PEM certificate"),  # was "[SSL] PEM lib"
    (["--cost-table", "/nonexistent.json"], "--cost-table /nonexistent.json: No such file"),
    (["--cost-table", __file__], "--cost-table"),  # not JSON
    (["--measure-costs", "--cost-table", "/nonexistent/costs.json"], "its folder does not exist"),
])
def test_cli_bad_flags_exit_2_in_one_line(argv, message, test_model_dir, capsys):
    from server.cli import main

    assert main(["--model", str(test_model_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unipad: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, flag", [(["--containers", "4,x"], "--containers"), (["--vad", "rnnoise"], "--vad")])
def test_cli_unparsable_flag_is_an_argparse_error(argv, flag, capsys):
    from server.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_cli_missing_model_dir(tmp_path, capsys):
    from server.cli import main

    assert main(["--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unipad: error: model directory") and err.count("\n") == 1


def test_cli_model_path_with_tilde_or_a_file(test_model_dir, tmp_path, monkeypatch, capsys):
    from server.cli import build_parser, config_from_args, main

    # "~" reaches the program unexpanded from cmd, Windows PowerShell or a quoted argument.
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "asr").symlink_to(test_model_dir, target_is_directory=True)
    assert config_from_args(build_parser().parse_args(["--model", "~/asr"])).model == tmp_path / "asr"
    # a file given for the directory was reported as "does not exist"
    assert main(["--model", str(test_model_dir / "manifest.json")]) == 2
    assert "is a file, not a model directory" in capsys.readouterr().err


@pytest.mark.parametrize("flags, shared", [([], True), (["--no-share-weights"], False), (["--share-weights"], True)])
def test_cli_share_weights_reaches_the_engine(flags, shared, test_model_dir):
    from server.cli import build_parser, config_from_args
    from server.server import engine_options

    args = build_parser().parse_args(["--model", str(test_model_dir), *flags])
    assert engine_options(config_from_args(args)).share_weights is shared


@pytest.mark.parametrize("flags, graphs", [([], None), (["--cuda-graph"], True), (["--no-cuda-graph"], False)])
def test_cli_cuda_graph_reaches_the_engine(flags, graphs, test_model_dir):
    """Unsaid, the engine decides (engine_options.replays_cuda_graphs: SenseVoice on CUDA replays)."""
    from server.cli import build_parser, config_from_args
    from server.server import engine_options

    args = build_parser().parse_args(["--model", str(test_model_dir), *flags])
    assert engine_options(config_from_args(args)).cuda_graph is graphs


def test_cli_cpu_spin_reaches_the_engine(test_model_dir, capsys):
    from server.cli import build_parser, config_from_args, main
    from server.server import engine_options

    for flags, spin in (([], 0), (["--cpu-spin-us", "150"], 150)):
        args = build_parser().parse_args(["--model", str(test_model_dir), *flags])
        assert engine_options(config_from_args(args)).cpu_spin_us == spin
    assert main(["--model", str(test_model_dir), "--cpu-spin-us", "-1"]) == 2
    assert "--cpu-spin-us must be >= 0" in capsys.readouterr().err


async def test_python_dash_m_server_help():
    proc = await asyncio.create_subprocess_exec("python", "-m", "server", "--help", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and b"--partial-window" in out
