"""`python -m bench load`: N concurrent real-time streams against a server; latency and capacity.

Each client streams its own "meeting" at real-time pace: the committed espeak utterances
(tests/fixtures/three_utterances.wav, cut where its JSON sidecar says speech is) in a seeded order with
seeded pauses, a staggered start and a quiet tail, as s16le chunks of --chunk seconds, each sent when a
live microphone would have it (at the end of the chunk). Partials on. Per step of N streams:
  * latency     from the wall time the end of an utterance's speech was sent to its final's arrival
                (p50/p95/p99). The segmenter must wait --end-silence seconds of silence before it can end
                a segment; `beyond_silence` = latency - end_silence is what the server adds (chunking,
                VAD frames, queueing, inference, the socket).
  * partials    received per second of speech, the interval between partials of one segment, and the
                server's count of dropped (coalesced) partials from /metrics.
  * lost        utterances with no final (must be 0); error messages; refused or broken connections.
  * server      CPU (% of one core) and resident memory of the server process (psutil on its pid).
N steps up through --streams; the step passes when p95 beyond_silence < --target and nothing is lost.
Stepping stops at the first failing step (unless --keep-going) or after --max-time. Loopback only.
Without --url the command starts `python -m server` on 127.0.0.1 itself and stops it at the end; with
--servers N it starts N of them on the same model and device and deals the streams out in turn (what
deploy/haproxy.cfg's balancing does on one box), and the server figures are their sums.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from pipeline.audio import SAMPLE_RATE, load_audio
from pipeline.errors import UnipadError
from pipeline.modeldir import read_model_directory
from pipeline.segmenter import SegmenterOptions
from server.protocol import STREAM_PATH

from .common import FIXTURES, command_line, emit, machine, percentiles, say
from .serverproc import ServerProcess, http_get, listening_pid, metric, sample_process, summed

DEFAULT_STREAMS = "1,2,4,8,12,16,20,24,32"
MAX_STREAMS = 512  # a GPU with batching aims at 400 (issue 13); steps such as 64,128,256,384,512
LOOPBACK = ("127.0.0.1", "localhost", "::1")
READY_TIMEOUT = 600.0  # a full-size model loads and warms several sessions
PAUSE_RANGE = (0.8, 2.5)  # seconds between utterances: longer than the end silence, so none merge
TAIL_SILENCE = 1.5  # after the last utterance, so its final comes from the VAD, not from `stop`
NOISE_LEVEL = 3e-4  # a quiet room rather than digital zeros


# ---- the audio -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Meeting:
    """One client's stream: float32 [n] at SAMPLE_RATE and its utterances' (start, end) in seconds."""

    audio: np.ndarray
    utterances: tuple[tuple[float, float], ...]


def load_utterances() -> list[np.ndarray]:
    audio = load_audio(FIXTURES / "three_utterances.wav")
    spans = json.loads((FIXTURES / "three_utterances.json").read_text(encoding="utf-8"))["speech"]
    return [audio[int(u["start"] * SAMPLE_RATE):int(u["end"] * SAMPLE_RATE)] for u in spans]


def meeting(seed: int, seconds: float, utterances: list[np.ndarray]) -> Meeting:
    """Utterances in a seeded order with seeded pauses until about `seconds`, then a quiet tail."""
    rng = np.random.default_rng(seed)
    pieces, spans = [], []
    t = rng.uniform(0.2, 2.0)  # staggered start: clients do not speak in lockstep
    pieces.append(np.zeros(int(t * SAMPLE_RATE), np.float32))
    while True:
        clip = utterances[int(rng.integers(len(utterances)))]
        spans.append((t, t + len(clip) / SAMPLE_RATE))
        pause = rng.uniform(*PAUSE_RANGE)
        pieces += [clip, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
        t += len(clip) / SAMPLE_RATE + int(pause * SAMPLE_RATE) / SAMPLE_RATE
        if t >= seconds - TAIL_SILENCE:
            break
    pieces.append(np.zeros(int(TAIL_SILENCE * SAMPLE_RATE), np.float32))
    audio = np.concatenate(pieces)
    audio = audio + rng.normal(0, NOISE_LEVEL, len(audio)).astype(np.float32)
    return Meeting(np.clip(audio, -1, 1).astype(np.float32), tuple(spans))


# ---- one client ------------------------------------------------------------------------------------

@dataclass
class ClientResult:
    utterances: tuple[tuple[float, float], ...]
    t0: float = 0.0  # monotonic time of stream second 0
    messages: list[tuple[float, dict]] = field(default_factory=list)  # (monotonic arrival, message)
    close_code: int | None = None
    error: str | None = None
    max_send_lag: float = 0.0  # how far behind its schedule the client ever sent (its own slowness)


async def stream_client(url: str, m: Meeting, chunk: float, timeout: float) -> ClientResult:
    import websockets

    result = ClientResult(m.utterances)
    pcm = np.clip(np.round(m.audio * 32767), -32768, 32767).astype("<i2").tobytes()
    step = int(chunk * SAMPLE_RATE)
    try:
        async with websockets.connect(url, open_timeout=30, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE, "format": "s16le",
                                      "partials": True}))
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if first.get("type") != "ready":
                result.error = f"no ready: {first}"
                result.messages.append((time.monotonic(), first))
                await ws.close()
                return result
            reader = asyncio.ensure_future(_collect(ws, result))
            loop = asyncio.get_running_loop()
            result.t0 = loop.time() + 0.05
            for k, i in enumerate(range(0, len(m.audio), step)):
                due = result.t0 + min(i + step, len(m.audio)) / SAMPLE_RATE
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    result.max_send_lag = max(result.max_send_lag, -delay)
                if reader.done():
                    break
                await ws.send(pcm[2 * i:2 * (i + step)])
            if not reader.done():
                await ws.send(json.dumps({"type": "stop"}))
            await asyncio.wait_for(reader, timeout)
            result.close_code = ws.close_code
    except asyncio.TimeoutError:
        result.error = "timed out waiting for the server to finish the stream"
    except Exception as exc:  # noqa: BLE001 - refused, reset, handshake failures: recorded, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _collect(ws: Any, result: ClientResult) -> None:
    import websockets

    try:
        async for message in ws:
            # loop.time() is time.monotonic() on the default event loop
            result.messages.append((asyncio.get_running_loop().time(), json.loads(message)))
    except websockets.ConnectionClosed:
        pass
    result.close_code = ws.close_code


# ---- scoring ---------------------------------------------------------------------------------------

def score(results: list[ClientResult], end_silence: float, partial_interval: float) -> dict[str, Any]:
    """Latency, partial cadence and losses over all clients of one step."""
    latencies, after_vad, intervals = [], [], []
    lost = utterances = partials = errors = finals_total = 0
    speech_seconds = 0.0
    problems: list[str] = []
    for r in results:
        utterances += len(r.utterances)
        speech_seconds += sum(e - s for s, e in r.utterances)
        if r.error:
            problems.append(r.error)
        finals = [(t, m) for t, m in r.messages if m.get("type") == "final"]
        finals_total += len(finals)
        errors += sum(1 for _, m in r.messages if m.get("type") == "error")
        problems += [f"{m.get('code')}: {m.get('message')}" for _, m in r.messages if m.get("type") == "error"]
        if r.close_code not in (None, 1000) and not r.error:
            problems.append(f"closed with {r.close_code}")
        used: set[int] = set()
        for start, end in r.utterances:
            match = [(t, m) for t, m in finals if m["start"] < end and m["end"] > start and id(m) not in used]
            if not match:
                lost += 1
                continue
            t, m = match[0]
            used.add(id(m))
            latencies.append(t - (r.t0 + end))
            after_vad.append(t - (r.t0 + m["end"] + end_silence))
        per_segment: dict[int, list[float]] = {}
        for t, m in r.messages:
            if m.get("type") == "partial":
                partials += 1
                per_segment.setdefault(m["segment"], []).append(t)
        for times in per_segment.values():
            intervals += list(np.diff(times))
    beyond = [x - end_silence for x in latencies]
    return {
        "utterances": utterances, "finals": finals_total, "lost": lost, "errors": errors,
        "problems": sorted(set(problems))[:10], "clients_failed": sum(1 for r in results if r.error),
        "latency": percentiles(latencies), "beyond_silence": percentiles(beyond),
        "after_vad": percentiles(after_vad), "latency_max": round(max(latencies), 4) if latencies else None,
        "partials": partials,
        "partials_per_speech_second": round(partials / speech_seconds, 3) if speech_seconds else None,
        "partial_interval": percentiles(intervals, (50, 95)),
        "expected_partial_interval": partial_interval,
        "client_max_send_lag": round(max((r.max_send_lag for r in results), default=0.0), 4),
    }


# ---- the run ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One server the streams go to: its stream URL, its HTTP address and the pid to watch."""

    url: str
    host: str
    port: int
    pid: int | None


async def run_step(targets: list[Target], n: int, args) -> dict[str, Any]:
    utterances = load_utterances()
    meetings = [meeting(args.seed + i, args.seconds, utterances) for i in range(n)]
    before = [await scrape(t.host, t.port) for t in targets]
    watched: list[dict[str, Any]] = [{} for _ in targets]
    stop = asyncio.Event()
    samplers = [asyncio.ensure_future(sample_process(t.pid, stop, out)) for t, out in zip(targets, watched)]
    began = time.monotonic()
    wait = args.seconds + args.final_timeout
    results = await asyncio.gather(*(stream_client(targets[i % len(targets)].url, m, args.chunk, wait)
                                     for i, m in enumerate(meetings)))
    stop.set()
    await asyncio.gather(*samplers)
    after = [await scrape(t.host, t.port) for t in targets]
    server = watched[0] if len(targets) == 1 else summed(watched)
    step = {"streams": n, "wall_seconds": round(time.monotonic() - began, 1),
            **score(list(results), args.end_silence, args.partial_interval), "server": server}
    if None not in before and None not in after:
        def grown(name: str) -> int:
            return int(sum(metric(a, name) - metric(b, name) for a, b in zip(after, before)))
        step["server"]["partials_dropped"] = grown("unipad_partials_dropped_total")
        step["server"]["partials_sent"] = grown("unipad_partials_total")
        step["server"]["unwarmed_shape_calls"] = int(sum(metric(a, "unipad_unwarmed_shape_calls") for a in after))
    p95 = step["beyond_silence"]["p95"]
    step["passed"] = (step["lost"] == 0 and step["errors"] == 0 and step["clients_failed"] == 0
                      and p95 is not None and p95 < args.target)
    return step


async def scrape(host: str, port: int) -> str | None:
    try:
        status, body = await http_get(host, port, "/metrics")
        return body if status == 200 else None
    except (OSError, asyncio.TimeoutError, IndexError, ValueError):
        return None


async def run_async(args: argparse.Namespace, result: dict[str, Any]) -> None:
    streams = parse_streams(args.streams)
    servers: list[ServerProcess] = []
    if args.url:
        parts = urlsplit(args.url)
        if parts.scheme != "ws" or parts.hostname not in LOOPBACK or not parts.port:
            raise ValueError(f"--url must be ws://127.0.0.1:PORT{STREAM_PATH} (loopback only), got {args.url!r}")
        host, port, url = parts.hostname, parts.port, args.url
        try:
            status, body = await http_get(host, port, "/readyz")
        except (OSError, asyncio.TimeoutError) as exc:
            raise UnipadError(f"server unreachable at {host}:{port}: {exc}") from None
        if status != 200:
            raise UnipadError(f"server at {host}:{port} is not ready ({status}): {body.strip()[:200]}")
        targets = [Target(url, host, port, args.server_pid or listening_pid(port))]
    else:
        directory = read_model_directory(args.model)
        result["model"] = directory.manifest.name
        share = -(-max(streams) // args.servers)  # each server's sessions: its turn of the largest step
        servers = [ServerProcess(server_args(args, k), share) for k in range(args.servers)]
        say(f"starting {len(servers)} server(s) on 127.0.0.1:{','.join(str(s.port) for s in servers)} "
            f"with {args.model} ...")
        try:
            ready = await asyncio.gather(*(s.wait_ready(READY_TIMEOUT) for s in servers))
        except BaseException:
            for s in servers:
                s.stop()
            raise
        result["server_ready_seconds"] = round(max(ready), 1)
        targets = [Target(f"ws://127.0.0.1:{s.port}{STREAM_PATH}", "127.0.0.1", s.port, s.pid) for s in servers]
    try:
        status, body = await http_get(targets[0].host, targets[0].port, "/readyz")
        result["server_info"] = json.loads(body) if status == 200 else None
    except (OSError, ValueError, asyncio.TimeoutError):
        pass
    result["server_pid_watched"] = all(t.pid is not None for t in targets)
    began = time.monotonic()
    try:
        for n in streams:
            if time.monotonic() - began + args.seconds > args.max_time:
                result["stopped"] = f"--max-time {args.max_time:g} s reached"
                break
            say(f"{n} stream(s) x {args.seconds:g} s ...")
            step = await run_step(targets, n, args)
            result["steps"].append(step)
            if args.save is not None:  # each step as it ends: a run cut short (a lease's time limit) keeps them
                args.save.parent.mkdir(parents=True, exist_ok=True)
                args.save.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
            say(f"  p95 beyond silence {step['beyond_silence']['p95']} s, lost {step['lost']}, "
                f"partials {step['partials_per_speech_second']}/speech-s, "
                f"errors {step['errors']}, server CPU {step['server'].get('cpu_mean')} %"
                + (f", problems: {step['problems'][:2]}" if step["problems"] else ""))
            if step["clients_failed"] == n or any(s.process.poll() is not None for s in servers):
                raise UnipadError(f"the server stopped answering at {n} streams: "
                                  f"{step['problems'][0] if step['problems'] else 'no connection'}")
            if step["problems"] and any("1013" in p or "overloaded" in p for p in step["problems"]):
                raise UnipadError(f"the server refused streams at {n} (overloaded; raise its --max-sessions)")
            if not step["passed"] and not args.keep_going:
                result["stopped"] = f"target missed at {n} streams"
                break
    finally:
        for s in servers:
            s.stop()


def server_args(args: argparse.Namespace, k: int) -> argparse.Namespace:
    """Server k's options: the first writes its log and measured costs where asked, the others beside them."""
    if k == 0:
        return args
    def beside(path: Path | None) -> Path | None:
        return None if path is None else path.with_name(f"{path.stem}-{k}{path.suffix}")
    return argparse.Namespace(**{**vars(args), "server_log": beside(args.server_log),
                                 "cost_table": beside(args.cost_table) if args.measure_costs else args.cost_table})


def parse_streams(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--streams must be comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1 or values[-1] > MAX_STREAMS:
        raise ValueError(f"--streams must be between 1 and {MAX_STREAMS}, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    o = SegmenterOptions()
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", type=Path, help="start `python -m server` with this model directory")
    target.add_argument("--url", help=f"a running server, ws://127.0.0.1:PORT{STREAM_PATH} (loopback only)")
    parser.add_argument("--streams", default=DEFAULT_STREAMS, help="concurrent stream counts to step through")
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per stream per step")
    parser.add_argument("--chunk", type=float, default=0.1, help="seconds of audio per message")
    parser.add_argument("--target", type=float, default=1.0, help="p95 latency beyond the end silence to pass")
    parser.add_argument("--max-time", type=float, default=900.0, help="stop stepping after this many seconds")
    parser.add_argument("--keep-going", action="store_true",
                        help="step through every count even past a missed target (a GPU lease's whole ladder)")
    parser.add_argument("--final-timeout", type=float, default=120.0,
                        help="seconds a stream waits for its last results once its audio is sent; later, its finals "
                             "count as lost (a short one keeps a slow step's figures inside a time limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--end-silence", type=float, default=o.end_silence, help="the server's --end-silence")
    parser.add_argument("--partial-interval", type=float, default=o.partial_interval,
                        help="the server's --partial-interval")
    parser.add_argument("--partial-window", type=float, default=o.partial_window,
                        help="the server's --partial-window (seconds a partial decodes at most)")
    parser.add_argument("--device", default=None, help="for the server we start (default: its own choice)")
    parser.add_argument("--batch-sizes", default=None, help="for the server we start, e.g. 1,4,16")
    parser.add_argument("--precision", default="auto", help="for the server we start")
    parser.add_argument("--containers", default=None, help="for the server we start, e.g. 4,8,15,30")
    parser.add_argument("--cost-table", type=Path, default=None,
                        help="for the server we start: `bench model --save` output it plans batches from (with "
                             "--measure-costs: where it writes the table it measured)")
    parser.add_argument("--measure-costs", action="store_true",
                        help="for the server we start: time its grid after the warm-up and plan from that")
    parser.add_argument("--server-log-level", default="warning", help="for the server we start (info: each "
                        "session's creation and warm-up, the costs it plans from)")
    parser.add_argument("--threads", type=int, default=0, help="for the server we start")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="for the server we start: CUDA graphs replayed, or not (default: the server's choice)")
    parser.add_argument("--servers", type=int, default=1, help="start this many servers on the same model and "
                        "device and deal the streams out among them (one box behind a load balancer)")
    parser.add_argument("--server-pid", type=int, default=None, help="with --url: the pid to watch (default: "
                        "the process listening on the port)")
    parser.add_argument("--server-log", type=Path, default=None, help="write the started server's log here")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    if args.seconds < 5 or args.chunk <= 0 or args.chunk > 1:
        raise ValueError("--seconds must be >= 5 and --chunk in (0, 1]")
    if args.servers < 1 or (args.servers > 1 and args.url):
        raise ValueError("--servers must be >= 1, and is for servers this command starts (--model), not --url")
    result: dict[str, Any] = {
        "command": "load", "argv": command_line(), "model_dir": None if args.url else str(args.model),
        "url": args.url,
        "seconds_per_stream": args.seconds, "chunk": args.chunk, "end_silence": args.end_silence,
        "partial_interval": args.partial_interval, "partial_window": args.partial_window,
        "device": args.device, "batch_sizes": args.batch_sizes, "target_p95_beyond_silence": args.target,
        "precision": args.precision, "containers": args.containers, "threads": args.threads,
        "cuda_graph": args.cuda_graph, "servers": args.servers,
        "cost_table": None if args.cost_table is None else str(args.cost_table),
        "measure_costs": args.measure_costs, "final_timeout": args.final_timeout, "machine": machine(),
        "steps": [],
    }
    code = 0
    try:
        asyncio.run(run_async(args, result))
    except KeyboardInterrupt:
        result["error"] = "interrupted"
    except (UnipadError, OSError) as exc:
        result["error"] = str(exc)
    passing = [s["streams"] for s in result["steps"] if s["passed"]]
    result["capacity"] = max(passing) if passing else 0
    result["complete"] = "error" not in result
    if "error" in result:
        say(f"error: {result['error']}")
        code = 1
    emit(result, args.save)
    return code
