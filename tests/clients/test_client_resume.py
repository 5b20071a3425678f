"""Resumable streams in the client library: the backlog (sans-I/O) and `connect(resume=True)` against a
real server whose connections are cut (a TCP abort, as when a server dies) or refused (a full server)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients.client import ConnectError, connect
from clients.resume import Backlog, ResumeOptions

RATE = 48000
FRAME = 2  # s16le mono


def chunk(seconds: float) -> bytes:
    return bytes(int(seconds * RATE) * FRAME)


def test_backlog_keeps_what_no_final_covers_and_resumes_on_the_frame_grid():
    backlog = Backlog(RATE, FRAME, keep_seconds=60)
    for _ in range(30):
        backlog.add(chunk(0.1))  # 3 s sent
    assert backlog.resume("s1").time == 0.0 and sum(map(len, backlog.pending())) == len(chunk(3.0))
    backlog.cover(0, 1.65)  # a final ending at 1.65 s
    resume = backlog.resume("s1")
    assert (resume.session, resume.segment, resume.time) == ("s1", 1, 1.65)
    assert sum(map(len, backlog.pending())) == len(chunk(3.0 - 1.65))  # cut inside a chunk, at 1.65 s
    backlog.cover(0, 1.2)  # an older time never moves the resume point back
    backlog.cover(1, None)  # a segment's error: numbering goes on, the time does not
    assert (backlog.resume("s1").segment, backlog.resume("s1").time) == (2, 1.65)
    backlog.cover(2, 2.999)  # off the grid by the wire's rounding: snapped to 3.0
    assert backlog.resume("s1").time == pytest.approx(3.0) and backlog.pending() == []


def test_backlog_is_bounded():
    backlog = Backlog(RATE, FRAME, keep_seconds=5)
    for _ in range(100):
        backlog.add(chunk(0.1))  # 10 s, no final
    kept = sum(map(len, backlog.pending())) / FRAME / RATE
    assert 4.9 <= kept <= 5.0
    assert backlog.resume("s").time == pytest.approx(10.0 - kept, abs=1e-6)
    assert round(backlog.resume("s").time / 0.03, 6).is_integer()  # still on the VAD frame grid


async def stream(url, audio, cut_after=None, **options):
    """Stream int16 `audio` in 100 ms chunks; abort the TCP connection after chunk `cut_after`."""
    async with connect(url, partials=False, resume=ResumeOptions(backoff=0.05), **options) as s:
        for k, i in enumerate(range(0, len(audio), 1600)):
            await s.send(audio[i:i + 1600])
            if k == cut_after:
                s._ws.transport.abort()  # the server vanishes without a close frame
            await asyncio.sleep(0.005)
        await s.stop()
    return [(f.segment, f.text) for f in s.finals], [(f.start, f.end) for f in s.finals], s


async def test_a_cut_connection_resumes_with_every_final_once(serve_test_server, speech):
    audio = np.round(np.concatenate([speech.audio, speech.audio]) * 32767).astype(np.int16)
    async with serve_test_server(partial_interval=0.0) as url:
        reference, ref_times, _ = await stream(url, audio)
        assert len(reference) == 2 * len(speech.utterances)
        last = (len(audio) - 1) // 1600  # cut with the last chunk: `stop` goes out while the stream resumes
        for cut in (15, 40, 75, last):  # before the first final, inside an utterance, in a pause, at the end
            finals, times, s = await stream(url, audio, cut_after=cut)
            assert finals == reference, cut
            assert np.allclose(times, ref_times, atol=0.3), (cut, times, ref_times)
            assert len(s.resumptions) == 1 and s.resumptions[0].reason == "closed 1006"
            assert s.done is not None and s.done.segments == len(reference)


async def test_a_full_server_is_retried_until_a_stream_ends(serve_test_server, speech):
    """1013 `overloaded` is not the end of a resumable stream: it waits with backoff and gets in."""
    audio = np.round(speech.audio * 32767).astype(np.int16)
    async with serve_test_server(partial_interval=0.0, max_sessions=1) as url:
        blocker = await connect(url, partials=False)
        asyncio.get_running_loop().call_later(0.5, lambda: asyncio.ensure_future(blocker.stop()))
        finals, _, _ = await stream(url, audio)
        assert len(finals) == len(speech.utterances)


async def test_a_stream_waits_out_a_long_outage_while_its_audio_is_kept(serve_test_server, speech):
    """The only server drains (its streams resume) and is gone for 13 s, longer than 8 attempts of backoff
    last; it comes back on the same port and the stream goes on: every final once, the failed attempts
    counted in the resumption."""
    audio = np.round(np.concatenate([speech.audio, speech.audio]) * 32767).astype(np.int16)
    options = ResumeOptions(backoff=0.1, max_backoff=1.0)  # 8 attempts would be over in about 4 s
    half = len(audio) // 2 // 1600 * 1600
    async with serve_test_server(partial_interval=0.0) as url:
        reference, _, _ = await stream(url, audio)
        s = await connect(url, partials=False, resume=options)
        for i in range(0, half, 1600):
            await s.send(audio[i:i + 1600])
            await asyncio.sleep(0.005)
    try:  # the server drained (the stream was told to resume elsewhere) and exited
        await asyncio.sleep(13.0)
        async with serve_test_server(partial_interval=0.0, port=url.port):
            for i in range(half, len(audio), 1600):
                await s.send(audio[i:i + 1600])  # waits for the resume, then goes to the new server
            await s.stop()
    finally:
        await s.close()
    assert [(f.segment, f.text) for f in s.finals] == reference
    resumed = s.resumptions[-1]
    assert resumed.attempts == len(resumed.failures) + 1 > 8
    # while it was gone nothing listened; once back, it may say it is still loading its model (code overloaded)
    assert all("cannot connect" in failure or failure == "overloaded" for failure in resumed.failures)
    assert sum("cannot connect" in failure for failure in resumed.failures) >= 8


async def test_a_refused_token_is_not_retried(serve_test_server):
    async with serve_test_server(token="sesame") as url:
        with pytest.raises(ConnectError) as raised:
            await asyncio.wait_for(connect(url, token="wrong", resume=ResumeOptions(backoff=1.0)), 0.9)
    assert raised.value.status == 401  # at once: no backoff, the next attempt would be refused too
