"""Property-based: random message sequences against one running server. Whatever a client sends, the
server answers what the protocol says (an oracle below predicts the first error), closes cleanly with
the right code, never with 1011, and a healthy session streaming all along gets every final."""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.protocol import CLOSE_INVALID_PAYLOAD, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_UNSUPPORTED
from server_testkit import pcm16, send_and_collect

STOP = json.dumps({"type": "stop"})
CLOSES = {"invalid_json": CLOSE_INVALID_PAYLOAD, "invalid_audio": CLOSE_INVALID_PAYLOAD, "bad_order": CLOSE_POLICY,
          "unknown_type": CLOSE_POLICY, "bad_start": CLOSE_POLICY, "unsupported_audio": CLOSE_UNSUPPORTED}


# ---- frames and the oracle -----------------------------------------------------------------------------
# A frame is (kind, payload, bytes per sample frame for a start); kinds: start, stop, audio, json_other, bad_json.

starts = st.builds(lambda rate, channels: ("start", json.dumps({"type": "start", "sample_rate": rate,
                                                                 "channels": channels}), 2 * channels),
                   st.sampled_from([8000, 16000, 22050, 44100, 48000]), st.sampled_from([1, 2]))
bad_starts = st.sampled_from([
    ("start_bad", json.dumps({"type": "start", "sample_rate": 7999}), "unsupported_audio"),
    ("start_bad", json.dumps({"type": "start", "format": "mp3"}), "unsupported_audio"),
    ("start_bad", json.dumps({"type": "start", "colour": "red"}), "bad_start"),
    ("start_bad", json.dumps({"type": "start", "partials": 1}), "bad_start"),
])
audio = st.binary(min_size=0, max_size=3000).map(lambda b: ("audio", b, None))
others = st.one_of(
    st.text(max_size=12).filter(lambda t: t not in ("start", "stop")).map(lambda t: json.dumps({"type": t})),
    st.lists(st.integers(), max_size=3).map(json.dumps),
    st.sampled_from(["1", "null", '"start"', "true"]),
).map(lambda t: ("json_other", t, None))
bad_json = st.text(max_size=30).filter(lambda t: not _parses(t)).map(lambda t: ("bad_json", t, None))
frames_strategy = st.lists(st.one_of(starts, bad_starts, audio, others, bad_json,
                                     st.just(("stop", STOP, None))), min_size=1, max_size=12)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def oracle(frames: list[tuple[str, Any, Any]]) -> tuple[str | None, bool]:
    """(error code the server must send, or None for `done`; whether `ready` comes first)."""
    width = None  # bytes per sample frame once started
    for kind, payload, extra in frames:
        if kind == "bad_json":
            return "invalid_json", width is not None
        if kind == "json_other":
            data = json.loads(payload)
            code = "unknown_type" if isinstance(data, dict) else "invalid_json"
            return code, width is not None
        if kind == "start_bad":
            return extra, width is not None  # parsed before the order is checked
        if kind == "start":
            if width is not None:
                return "bad_order", True
            width = extra
        elif kind == "stop":
            return ("bad_order", False) if width is None else (None, True)
        elif kind == "audio":
            if width is None:
                return "bad_order", False
            if len(payload) % width:
                return "invalid_audio", True
    raise AssertionError("every sequence ends with stop")


# ---- one server for the whole module, on its own thread and loop (hypothesis tests are synchronous) ----

class BackgroundServer:
    def __init__(self, model_dir, speech) -> None:
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.stop_healthy = threading.Event()
        self.url: Any = None
        self.healthy: Any = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._model, self._speech = model_dir, speech
        self._main = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        assert self.started.wait(120)

    async def _serve(self) -> Any:
        from serving import serve_test_server

        self._done = asyncio.Event()
        async with serve_test_server(self._model, partial_interval=0.3) as url:
            self.url = url
            self.healthy = asyncio.ensure_future(self._healthy_stream(url))
            self.started.set()
            await self._done.wait()
            return await self.healthy

    async def _healthy_stream(self, url) -> tuple[list[dict], int, int]:
        """Plays the three-utterance recording again and again (paced a little) until asked to stop."""
        import websockets

        messages, plays = [], 0
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            reader = asyncio.ensure_future(_collect(ws, messages))
            data = pcm16(self._speech.audio)
            while not self.stop_healthy.is_set() or plays == 0:
                for i in range(0, len(data), 3200):
                    await ws.send(data[i:i + 3200])
                    await asyncio.sleep(0.005)
                plays += 1
            await ws.send(STOP)
            await reader
            return messages, plays, ws.close_code

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def finish(self) -> Any:
        self.stop_healthy.set()
        self.loop.call_soon_threadsafe(self._done.set)
        result = self._main.result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        return result


async def _collect(ws, messages: list) -> None:
    import websockets

    try:
        async for message in ws:
            messages.append(json.loads(message))
    except websockets.ConnectionClosed:
        pass


@pytest.fixture(scope="module")
def background(test_model_dir, speech):
    server = BackgroundServer(test_model_dir, speech)
    yield server
    if not server.stop_healthy.is_set():
        server.finish()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(frames=frames_strategy)
def test_any_message_sequence_is_answered_and_closed_cleanly(background, frames):
    frames = [*frames, ("stop", STOP, None)]
    result = background.run(send_and_collect(background.url, [f[1] for f in frames]))
    expected, started = oracle(frames)
    kinds = [m["type"] for m in result.messages]
    assert (kinds[:1] == ["ready"]) == started, kinds
    assert not [m for m in result.messages if m["type"] == "error" and "segment" not in m][:-1]  # only the last
    if expected is None:
        assert kinds[-1] == "done" and result.close_code == CLOSE_NORMAL, result.messages
        segments = [m["segment"] for m in result.messages if m["type"] == "final" or "segment" in m and m["type"] == "error"]
        assert segments == list(range(len(segments)))  # one final (or segment error) per segment, in order
        assert result.messages[-1]["segments"] == len(segments)
    else:
        assert kinds[-1] == "error" and result.messages[-1]["code"] == expected, (expected, result.messages)
        assert result.close_code == CLOSES[expected]


def test_zz_healthy_session_got_every_final(background, speech):
    """Runs after the property test (module order): the healthy stream saw no error and all its finals."""
    messages, plays, close = background.finish()
    finals = [m for m in messages if m["type"] == "final"]
    assert close == CLOSE_NORMAL
    assert not [m for m in messages if m["type"] == "error"]
    assert [f["segment"] for f in finals] == list(range(plays * len(speech.utterances)))
    assert messages[-1] == {"type": "done", "segments": plays * len(speech.utterances)}


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab'),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3),
                           max_leaves=40)


@given(JSON_VALUES)
def test_client_json_parses_as_json_loads_does(value):
    """Brackets inside strings are not nesting: whatever json.loads reads within the depth, so does ours."""
    from pipeline.json_text import MAX_JSON_DEPTH, loads_shallow

    def depth(v: Any) -> int:
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)

    text = json.dumps(value)
    if depth(value) <= MAX_JSON_DEPTH:
        assert loads_shallow(text) == json.loads(text)
    else:
        with pytest.raises(ValueError):
            loads_shallow(text)


def test_client_json_nested_past_the_limit_is_refused_unparsed():
    from pipeline.json_text import MAX_JSON_DEPTH, loads_shallow

    assert loads_shallow("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    for text in ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), '{"a":' * 40_000):
        with pytest.raises(ValueError, match=f"deeper than {MAX_JSON_DEPTH}"):
            loads_shallow(text)
