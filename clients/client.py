"""An asyncio client for the Unipad stream endpoint, for meeting bots and scripts.

    import asyncio
    from clients.client import connect

    async def main(chunks):                      # chunks: 16 kHz int16 numpy arrays, ~100 ms each
        async with connect("ws://127.0.0.1:8765/v1/stream", sample_rate=16000) as stream:
            for chunk in chunks:
                await stream.send(chunk)
            await stream.stop()                  # waits for the last final and `done`
        for final in stream.finals:
            print(f"{final.start:7.2f} {final.end:7.2f}  {final.text}")

Results are the typed messages of `server/protocol.py`: `Partial` (a replaceable snapshot of the open
segment), `Final` (exactly one per segment, in order) and `Done`. Read them with `async for result in
stream` (iteration ends after `Done`), with callbacks (`on_partial`, `on_final`; plain functions or
coroutine functions), or both. A server `error` message raises `ServerError(code, message)`, an abnormal
close raises `StreamClosedError(code, reason)`, a server that cannot be reached raises `ConnectError`;
all three are `ClientError`s, raised by `connect`, `send`, `stop` and the iteration.

Audio from another thread (a bot's audio callback, a sound card): hand each chunk to the event loop with
`loop.call_soon_threadsafe` and let one task send them in order.

    async def pump(url, start_capture):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        def on_audio(pcm: bytes) -> None:        # called on the capture thread
            loop.call_soon_threadsafe(queue.put_nowait, pcm)
        async with connect(url, sample_rate=48000, on_final=lambda f: print(f.text)) as stream:
            stop_capture = start_capture(on_audio)
            while (pcm := await queue.get()) is not None:   # push None (threadsafe) to end
                await stream.send(pcm)
            stop_capture()
            await stream.stop()
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any, Awaitable, Callable, Sequence, Union
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State

from pipeline.audio import PCM_FORMATS, SAMPLE_RATE
from pipeline.errors import ProtocolError
from pipeline.hotwords import parse_hotwords
from server.protocol import (
    CLOSE_NORMAL,
    DEFAULT_PORT,
    STREAM_PATH,
    Done,
    Error,
    Final,
    Partial,
    Ready,
    Start,
    Stop,
    encode,
    parse_server_message,
)

from .errors import ClientError, ConnectError, ServerError, StreamClosedError

DEFAULT_URL = f"ws://127.0.0.1:{DEFAULT_PORT}{STREAM_PATH}"
STOP_TIMEOUT = 60.0  # seconds to wait for the last final after `stop`: a 30 s segment on a slow CPU
SEND_PIECE = 256 * 1024  # bytes per message: a longer send() (a whole recording) goes as several (server: 1 MiB)
_INT16_SCALE = 32768.0

Result = Union[Partial, Final, Done]
Callback = Callable[[Any], Union[None, Awaitable[None]]]


def stream_url(url: str, token: str | None) -> str:
    """`url` with `?token=` added (the server accepts the token there and in `start`)."""
    if not token:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "token"] + [("token", token)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def stream_endpoint(url: str) -> str:
    """The stream endpoint meant by `url` as people type it: a bare `host:port` (or `host`, on DEFAULT_PORT)
    is ws://, http(s):// becomes ws(s)://, and no path (or `/`) means STREAM_PATH. Any other path is kept,
    so a wrong one still gets the server's 404 naming the right one."""
    bare = "://" not in url
    parts = urlsplit("ws://" + url if bare else url)
    try:
        if bare and parts.port is None:
            parts = parts._replace(netloc=f"{parts.netloc}:{DEFAULT_PORT}")
    except ValueError:  # not a port number: leave it to websockets' InvalidURI (a ConnectError)
        return url
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme.lower(), parts.scheme)
    return urlunsplit(parts._replace(scheme=scheme, path=parts.path if parts.path.strip("/") else STREAM_PATH))


def to_pcm(audio: bytes | bytearray | memoryview | np.ndarray, encoding: str, channels: int = 1) -> bytes:
    """Encode audio for the wire.

    audio: bytes already laid out as `encoding` (passed through), or a numpy array of shape (samples,) or
    (samples, channels): float in [-1, 1] or int16. Returns little-endian s16le or f32le bytes.
    """
    if not isinstance(audio, np.ndarray):
        return bytes(audio)
    if audio.ndim not in (1, 2) or (audio.ndim == 2 and audio.shape[1] != channels) or (audio.ndim == 1 and channels != 1):
        raise ValueError(f"audio of shape {audio.shape} does not match {channels} channel(s)")
    if audio.dtype == np.int16:
        samples = audio if encoding == "s16le" else audio.astype(np.float32) / _INT16_SCALE
    elif np.issubdtype(audio.dtype, np.floating):
        if encoding == "s16le":
            samples = np.clip(np.round(audio * _INT16_SCALE), -_INT16_SCALE, _INT16_SCALE - 1).astype(np.int16)
        else:
            samples = audio.astype(np.float32)
    else:
        raise ValueError(f"audio must be float or int16, got {audio.dtype}")
    dtype = "<i2" if encoding == "s16le" else "<f4"
    return np.ascontiguousarray(samples, dtype=dtype).tobytes()


class Stream:
    """One open stream: `send` audio, read results, `stop`. Made by `connect`; not thread-safe."""

    def __init__(self, ws: ClientConnection, start: Start, ready: Ready,
                 on_partial: Callback | None, on_final: Callback | None) -> None:
        self.ready = ready  # the server's `ready`: session id, model name, provider
        self.start = start
        self.finals: list[Final] = []  # every final so far, in order
        self.done: Done | None = None
        self.errors: list[ServerError] = []  # segment-level errors (the stream went on after them)
        self._ws = ws
        self._on_partial = on_partial
        self._on_final = on_final
        self._results: asyncio.Queue[Result | ClientError] = asyncio.Queue()  # results are small; unbounded
        self._error: ClientError | None = None  # the first fatal error, raised again by send/stop
        self._finished = asyncio.Event()  # `done` received or connection gone
        self._stopped = False
        self._iter_ended = False
        self._reader = asyncio.create_task(self._read(), name="unipad-client-reader")

    @property
    def session(self) -> str:
        return self.ready.session

    def _pcm_to_send(self, audio: bytes | bytearray | memoryview | np.ndarray) -> bytes:
        """The chunk as the stream's PCM; raises the stream's error, or ClientError after stop()."""
        if self._error is not None:
            raise self._error
        if self._stopped:
            raise ClientError("send() after stop()")
        return to_pcm(audio, self.start.format, self.start.channels)

    async def send(self, audio: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Send audio in the format the start message declared (see `to_pcm`); ~100 ms a call is typical."""
        data = self._pcm_to_send(audio)
        try:
            for i in range(0, len(data), SEND_PIECE):
                await self._ws.send(data[i:i + SEND_PIECE])
        except ConnectionClosed:
            await self._finished.wait()  # let the reader record why
            raise self._error or StreamClosedError(None) from None

    async def stop(self, timeout: float = STOP_TIMEOUT) -> Done:
        """Say there is no more audio; wait for the last final and `done`; close. Returns `done`."""
        if not self._stopped and self._error is None and self.done is None:
            self._stopped = True
            try:
                await self._ws.send(encode(Stop()))
            except ConnectionClosed:
                pass  # the reader records why
        try:
            await asyncio.wait_for(self._finished.wait(), timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise ClientError(f"no 'done' from the server within {timeout:g} s of stop") from None
        await self.close()
        if self._error is not None:
            raise self._error
        assert self.done is not None
        return self.done

    async def close(self) -> None:
        """Close the connection now (without waiting for results)."""
        await self._ws.close()
        if not self._reader.done():
            try:
                await asyncio.wait_for(self._reader, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Result:
        """The next Partial, Final or Done; raises the stream's errors; ends after Done or a close."""
        if self._iter_ended:
            raise StopAsyncIteration
        item = await self._results.get()
        if isinstance(item, ClientError):
            raise item
        if item is None:
            self._iter_ended = True
            raise StopAsyncIteration
        self._iter_ended = isinstance(item, Done)
        return item

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close()

    # ---- the reader task --------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            await self._receive()
        finally:
            await self._end()

    async def _receive(self) -> None:
        """Dispatch the current connection's messages until it closes or the stream fails."""
        try:
            async for text in self._ws:
                try:
                    message = parse_server_message(text) if isinstance(text, str) else None
                except ProtocolError as exc:
                    if exc.code == "unknown_type":
                        continue  # a message a newer server added: not for this client
                    message = None
                except (ValueError, TypeError):
                    message = None
                if message is None:
                    self._fail(ClientError(f"bad message from the server: {str(text)[:200]!r}"))
                    break
                try:
                    await self._dispatch(message)
                except Exception as exc:  # the caller's callback failed: end the stream, raise it later
                    error = ClientError(f"a result callback raised {exc!r}")
                    error.__cause__ = exc
                    self._fail(error)
                    break
        except ConnectionClosed:
            pass

    async def _end(self) -> None:
        """The stream is over: record why when it ended without `done`; end the iteration."""
        if self._error is not None and self._ws.state is not State.CLOSED:
            await self._ws.close()
        if self.done is None and self._error is None:
            code, reason = self._ws.close_code, self._ws.close_reason or ""
            if code == CLOSE_NORMAL and not reason:
                reason = "closed before 'done'"
            self._fail(StreamClosedError(code, reason))
        self._results.put_nowait(None)  # type: ignore[arg-type]  # ends the iteration
        self._finished.set()

    async def _dispatch(self, message: Any) -> None:
        if isinstance(message, Error):
            self._fail(ServerError(message.code, message.message, message.segment))
            return
        if isinstance(message, Partial):
            callback = self._on_partial
        elif isinstance(message, Final):
            self.finals.append(message)
            callback = self._on_final
        elif isinstance(message, Done):
            self.done = message
            callback = None
        else:
            return  # a second `ready` or a message type this client does not know: ignore
        self._results.put_nowait(message)
        if callback is not None:
            outcome = callback(message)
            if inspect.isawaitable(outcome):
                await outcome
        if isinstance(message, Done):
            self._finished.set()

    def _fail(self, error: ClientError) -> None:
        # A segment-level error (`segment` set) is reported but not fatal; anything else ends the stream.
        if isinstance(error, ServerError) and error.segment is not None:
            self.errors.append(error)
            self._results.put_nowait(error)
            return
        if self._error is None:
            self._error = error
            self._results.put_nowait(error)


class connect:
    """Open a stream: `async with connect(url, ...) as stream:` or `stream = await connect(url, ...)`.

    url: ws:// or wss:// address of the stream endpoint (default `DEFAULT_URL`); `host:port` or a URL
    without a path means the stream endpoint there (`stream_endpoint`).
    sample_rate, format ('s16le' or 'f32le'), channels: how the audio passed to `send` is laid out;
    the server resamples any rate it accepts to 16 kHz. token: sent as `?token=` and in `start`.
    hotwords: words or phrases to favour, as strings or {"text": ..., "boost": ...} (docs/protocol.md);
    checked here (ProtocolError bad_start), spelled by the server against its model.
    resume: True or a `ResumeOptions` (clients/resume.py): survive a server's drain or failure by
    reconnecting and resuming the stream, re-sending the audio no final covers yet.
    """

    def __init__(self, url: str = DEFAULT_URL, *, token: str | None = None, sample_rate: int = SAMPLE_RATE,
                 format: str = "s16le", channels: int = 1, language: str = "auto", itn: bool = False,
                 partials: bool = True, on_partial: Callback | None = None, on_final: Callback | None = None,
                 open_timeout: float = 10.0, hotwords: Sequence[str | dict[str, Any]] | None = None,
                 resume: Any = None) -> None:
        if format not in PCM_FORMATS:
            raise ValueError(f"format must be one of {', '.join(PCM_FORMATS)}, got {format!r}")
        self.url = stream_endpoint(url)
        self.resume = resume or None  # True or ResumeOptions: clients/resume.py
        self.start = Start(sample_rate=sample_rate, format=format, channels=channels, language=language,
                           itn=itn, partials=partials, token=token or None,
                           hotwords=parse_hotwords(list(hotwords)) or None if hotwords else None,
                           resumable=self.resume is not None)
        self.on_partial, self.on_final = on_partial, on_final
        self.open_timeout = open_timeout
        self._stream: Stream | None = None

    async def _open(self) -> Stream:
        if self.resume is not None:
            from .resume import open_resumable
            return await open_resumable(self)
        ws, ready = await self._handshake(self.start)
        return Stream(ws, self.start, ready, self.on_partial, self.on_final)

    async def _handshake(self, start: Start) -> tuple[ClientConnection, Ready]:
        """Connect, send `start`, wait for `ready`."""
        url = stream_url(self.url, self.start.token)
        proxy = None if urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1") else True  # never proxy the loopback
        try:
            ws = await websockets.connect(url, open_timeout=self.open_timeout, proxy=proxy, compression=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = exc.response.body.decode("utf-8", "replace").strip()[:200] if exc.response.body else ""
            raise ConnectError(f"{self.url} refused the connection: HTTP {status}" + (f" {body}" if body else ""),
                               status) from None
        except InvalidURI as exc:
            raise ConnectError(f"not a WebSocket URL: {exc.uri}") from None
        except (OSError, asyncio.TimeoutError, InvalidHandshake) as exc:
            raise ConnectError(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from None
        try:
            with contextlib.suppress(ConnectionClosed):  # refused at once (full, loading): its error is read next
                await ws.send(encode(start))
            ready = await self._wait_ready(ws)
        except BaseException:
            await ws.close()
            raise
        return ws, ready

    async def _wait_ready(self, ws: ClientConnection) -> Ready:
        try:
            text = await asyncio.wait_for(ws.recv(), self.open_timeout)
        except ConnectionClosed:
            raise StreamClosedError(ws.close_code, ws.close_reason or "") from None
        except asyncio.TimeoutError:
            raise ConnectError(f"no 'ready' from {self.url} within {self.open_timeout:g} s") from None
        try:
            message = parse_server_message(text) if isinstance(text, str) else None
        except (ProtocolError, ValueError, TypeError) as exc:
            raise ClientError(f"bad message from the server: {exc}") from None
        if isinstance(message, Error):
            raise ServerError(message.code, message.message, message.segment)
        if not isinstance(message, Ready):
            raise ClientError(f"expected 'ready' from the server, got {text[:200]!r}")
        return message

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._open().__await__()

    async def __aenter__(self) -> Stream:
        self._stream = await self._open()
        return self._stream

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._stream is not None:
            await self._stream.close()


class Client:
    """`Client.connect(...)` is `connect(...)`, for code that prefers a class as the front door."""
    connect = staticmethod(connect)
