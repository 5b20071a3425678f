"""`python -m bench failover`: resumable streams through HAProxy while servers fail.

Three servers behind HAProxy (deploy/haproxy.cfg, bench/cluster.py), demo model, 127.0.0.1:
  1. saturation  one server is filled to --max-sessions by idle streams sent to it directly; once
                 HAProxy marks it down (its /readyz is 503), the reference run goes through the balancer:
                 every stream at full speed, no faults. The full server must receive none of them.
  2. faults      the same streams at real-time pace with `resume` on, started over the first second and
                 spread by `balance leastconn`; at --term-at one server gets SIGTERM (drain) and at
                 --kill-at another SIGKILL. Every stream must end with the reference's finals: the same
                 segment numbers and texts, each exactly once (times may move by a few 30 ms VAD frames:
                 webrtcvad adapts to the audio it has heard, and a resumed stream's VAD starts afresh).
  3. hang        a fresh cluster, the same paced streams; at --stop-at one server gets SIGSTOP (a hung
                 process, a stalled machine): its TCP connections stay open and it answers nothing. HAProxy
                 marks it DOWN when its health checks time out and cuts its streams (on-marked-down
                 shutdown-sessions), so they resume elsewhere. The same check of the finals.
Figures: streams, faults, finals expected / received / lost / duplicated, resumptions, the time from a
lost connection to `ready` on the next one, and the latency of resumed utterances (those whose end of speech
was sent before the connection was lost) against the others: from the wall time the end of speech was first
sent to the final's arrival. For the hang: the streams on the hung server, the seconds from SIGSTOP until
HAProxy marks it DOWN, the sessions it still holds then, and each moved stream's stall (SIGSTOP to `ready`).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clients.client import connect
from clients.resume import ResumeOptions
from pipeline.audio import SAMPLE_RATE, load_audio
from server.config import DEFAULT_MODEL_DIR

from .cluster import Cluster
from .common import FIXTURES, command_line, emit, machine, percentiles, say
from .serverproc import metric

CHUNK = 0.1  # seconds of audio per message, as a microphone client sends
STAGGER = 1.0  # streams start over this many seconds
TIME_TOLERANCE = 0.3  # seconds a resumed stream's segment times may differ from the reference's
RESUME = ResumeOptions(attempts=10, backoff=0.2, max_backoff=2.0)


def stream_audio(index: int) -> np.ndarray:
    """Stream `index`: the demo recording and one single utterance, with pauses; int16, 10-11 s."""
    demo = FIXTURES / "demo"
    singles = sorted(demo.glob("single_*.wav"))
    pause = lambda seconds: np.zeros(int(seconds * SAMPLE_RATE), np.float32)  # noqa: E731
    parts = [pause(0.3), load_audio(demo / "multi.wav"), pause(0.7), load_audio(singles[index % len(singles)]),
             pause(1.0)]
    if index % 2:  # half the streams say the single utterance first: faults land in other places
        parts[1], parts[3] = parts[3], parts[1]
    return np.round(np.concatenate(parts) * 32767).astype(np.int16)


@dataclass
class StreamRun:
    """What one client saw: finals as (segment, start, end, text), arrival times, resumptions."""

    finals: list[tuple[int, float, float, str]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each final
    sent: list[float] = field(default_factory=list)  # time.monotonic() each chunk was first sent
    resumptions: list[Any] = field(default_factory=list)
    error: str | None = None


async def run_stream(url: str, audio: np.ndarray, paced: bool, delay: float) -> StreamRun:
    run = StreamRun()
    chunk = int(CHUNK * SAMPLE_RATE)

    def on_final(final: Any) -> None:
        run.finals.append((final.segment, final.start, final.end, final.text))
        run.arrivals.append(time.monotonic())

    await asyncio.sleep(delay)
    try:
        async with connect(url, partials=False, on_final=on_final, resume=RESUME) as stream:
            began = time.monotonic()
            for k, i in enumerate(range(0, len(audio), chunk)):
                if paced:  # sent when a microphone would have it: at the end of the chunk
                    await asyncio.sleep(max(0.0, began + (k + 1) * CHUNK - time.monotonic()))
                run.sent.append(time.monotonic())
                await stream.send(audio[i:i + chunk])
            await stream.stop(timeout=120)
            run.resumptions = list(stream.resumptions)
    except Exception as exc:  # noqa: BLE001 - reported as a lost stream, with its reason
        run.error = f"{type(exc).__name__}: {exc}"
    return run


async def run_streams(url: str, count: int, paced: bool) -> list[StreamRun]:
    return await asyncio.gather(*(run_stream(url, stream_audio(i), paced, STAGGER * i / count)
                                  for i in range(count)))


async def saturate(url: str, count: int) -> list[Any]:
    """`count` idle streams straight to one server: it is full until they close."""
    return [await connect(url, partials=False) for _ in range(count)]


def compare(reference: list[StreamRun], faulted: list[StreamRun]) -> dict[str, Any]:
    """Finals expected (the reference's), received, lost, duplicated, and those that differ."""
    expected = received = lost = duplicated = differing = 0
    problems: list[str] = []
    for i, (ref, got) in enumerate(zip(reference, faulted)):
        want = {seg: (start, end, text) for seg, start, end, text in ref.finals}
        counts = collections.Counter(seg for seg, *_ in got.finals)
        expected += len(want)
        received += len(got.finals)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        lost += sum(1 for seg in want if seg not in counts)
        for seg, start, end, text in got.finals:
            if seg not in want:
                differing += 1
                problems.append(f"stream {i}: segment {seg} is not in the reference ({text!r})")
                continue
            w_start, w_end, w_text = want[seg]
            if text != w_text or abs(start - w_start) > TIME_TOLERANCE or abs(end - w_end) > TIME_TOLERANCE:
                differing += 1
                problems.append(f"stream {i}: segment {seg} {start:.2f}-{end:.2f} {text!r}, "
                                f"reference {w_start:.2f}-{w_end:.2f} {w_text!r}")
        if got.error:
            problems.append(f"stream {i}: {got.error}")
    return {"finals_expected": expected, "finals_received": received, "lost": lost, "duplicated": duplicated,
            "differing": differing, "problems": problems}


def latencies(runs: list[StreamRun]) -> tuple[list[float], list[float]]:
    """Seconds from the end of speech's first sending to its final: (resumed utterances, the others)."""
    chunk = int(CHUNK * SAMPLE_RATE)
    resumed, normal = [], []
    for run in runs:
        for (segment, _, end, _), arrived in zip(run.finals, run.arrivals):
            k = min(len(run.sent) - 1, int(end * SAMPLE_RATE) // chunk)
            sent = run.sent[k]
            lost_at = [r.began for r in run.resumptions if r.resume.segment <= segment and sent <= r.began]
            (resumed if lost_at else normal).append(arrived - sent)
    return resumed, normal


async def failover(model: Path, streams: int, term_at: float, kill_at: float,
                   stop_at: float | None = None) -> dict[str, Any]:
    max_sessions = streams + 2  # one survivor takes every stream
    async with Cluster(model, max_sessions) as cluster:
        assert cluster.balancer is not None
        lb = cluster.balancer
        full = 0  # the saturated server in phase 1
        direct = f"ws://127.0.0.1:{cluster.servers[full].port}/v1/stream"
        idle = await saturate(direct, max_sessions)
        await lb.wait_status(cluster.name(full), "NOLB")  # alive, takes no new streams (deploy/haproxy.cfg)
        before = metric(await cluster.server_metric(full), "unipad_sessions_total")
        say(f"reference: {streams} streams at full speed, {cluster.name(full)} full")
        reference = await run_streams(lb.url, streams, paced=False)
        saturated_got = metric(await cluster.server_metric(full), "unipad_sessions_total") - before
        for stream in idle:
            await stream.close()
        for i in range(len(cluster.servers)):
            await lb.wait_status(cluster.name(i), "UP")

        say(f"faults: {streams} streams at real-time pace; SIGTERM at {term_at:g} s, SIGKILL at {kill_at:g} s")
        began = time.monotonic()
        faulted_task = asyncio.ensure_future(run_streams(lb.url, streams, paced=True))
        await asyncio.sleep(term_at)
        spread = {name: int(row["scur"]) for name, row in (await lb.servers()).items()}
        cluster.servers[1].process.send_signal(signal.SIGTERM)
        await asyncio.sleep(max(0.0, kill_at - (time.monotonic() - began)))
        cluster.servers[0].process.send_signal(signal.SIGKILL)
        faulted = await faulted_task
        wall = time.monotonic() - began
        drained_exit = cluster.servers[1].process.wait(30)

    resumed, normal = latencies(faulted)
    result = {
        "streams": streams, "stream_seconds": round(len(stream_audio(0)) / SAMPLE_RATE, 2),
        "faults": {"sigterm": cluster.name(1), "sigkill": cluster.name(0), "term_at": term_at, "kill_at": kill_at},
        "streams_per_server_at_term": spread, "saturated_server_new_streams": int(saturated_got),
        "reference_errors": [r.error for r in reference if r.error],
        **compare(reference, faulted),
        "resumptions": sum(len(r.resumptions) for r in faulted),
        # from the lost connection to `ready` on the next one (backoff, HAProxy's redispatch, the handshake)
        "reconnect_seconds": percentiles([x.resumed - x.began for r in faulted for x in r.resumptions], (50, 95)),
        "resumed_utterances": len(resumed),
        "latency_resumed": percentiles(resumed, (50, 95)), "latency_other": percentiles(normal, (50, 95)),
        "drained_server_exit": drained_exit, "wall_seconds": round(wall, 1),
    }
    if stop_at is not None:
        result["hang"] = await hang(model, streams, stop_at)
    return result


async def hang(model: Path, streams: int, stop_at: float) -> dict[str, Any]:
    """Phase 3 on a fresh cluster: a reference run at full speed, then the streams at real-time pace while
    one server gets SIGSTOP."""
    async with Cluster(model, streams + 2) as cluster:
        assert cluster.balancer is not None
        lb = cluster.balancer
        hung = 2
        name = cluster.name(hung)
        reference = await run_streams(lb.url, streams, paced=False)
        say(f"hang: {streams} streams at real-time pace; SIGSTOP {name} at {stop_at:g} s")
        faulted_task = asyncio.ensure_future(run_streams(lb.url, streams, paced=True))
        await asyncio.sleep(stop_at)
        on_hung = int((await lb.servers())[name]["scur"])
        cluster.servers[hung].process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        await lb.wait_status(name, "DOWN")
        marked_down = time.monotonic() - stopped
        held_when_down = int((await lb.servers())[name]["scur"])  # 0: shutdown-sessions cut them
        faulted = await faulted_task
    stalls = [x.resumed - stopped for r in faulted for x in r.resumptions if x.began >= stopped]
    return {
        "streams": streams, "hung_server": name, "stop_at": stop_at, "streams_on_hung_server": on_hung,
        "reference_errors": [r.error for r in reference if r.error],
        "marked_down_seconds": round(marked_down, 2), "sessions_held_when_down": held_when_down,
        **compare(reference, faulted),
        "resumptions": sum(len(r.resumptions) for r in faulted), "moved_streams": len(stalls),
        # SIGSTOP to `ready` elsewhere: HAProxy's checks (timeouts), the cut, the client's backoff, the handshake
        "stall_seconds": {**percentiles(stalls, (50, 95)), "max": round(max(stalls), 3) if stalls else None},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model directory for the servers")
    parser.add_argument("--streams", type=int, default=30, help="concurrent streams through the balancer")
    parser.add_argument("--term-at", type=float, default=3.0, help="seconds into the run: SIGTERM one server")
    parser.add_argument("--kill-at", type=float, default=5.0, help="seconds into the run: SIGKILL another")
    parser.add_argument("--stop-at", type=float, default=3.0,
                        help="seconds into a third run on a fresh cluster: SIGSTOP one server (0: skip that run)")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    if args.streams < 1 or not 0 < args.term_at < args.kill_at or args.stop_at < 0:
        raise ValueError("--streams must be >= 1, 0 < --term-at < --kill-at and --stop-at >= 0")
    result = {"command": "failover", "argv": command_line(), "machine": machine(),
              **asyncio.run(failover(args.model, args.streams, args.term_at, args.kill_at, args.stop_at or None))}
    emit(result, args.save)
    runs = [result, result.get("hang", {})]
    ok = not any(run.get(k) for run in runs for k in ("lost", "duplicated", "differing")) and \
        not result["saturated_server_new_streams"]
    return 0 if ok else 1
