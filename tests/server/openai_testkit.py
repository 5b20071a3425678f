"""Helpers of the OpenAI API tests (test_openai_http.py, test_openai_realtime.py)."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import openai

from clients.client import connect
from pipeline.audio import SAMPLE_RATE

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "fixtures" / "demo"
HELD_OUT = DEMO / "multi.wav"  # three utterances the demo model never trained on
TOKEN = "openai-test-token"


def knows_words(model_dir: Path) -> bool:
    """The trained demo model is served: compare words; otherwise (tiny random graph) shapes only."""
    return Path(model_dir).resolve() == (ROOT / "models" / "demo").resolve()


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


def sdk(url: Any, key: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url.http}/v1", api_key=key, max_retries=0)


async def own_protocol_text(url: Any, audio: np.ndarray) -> str:
    """What our own WebSocket protocol answers for the same audio (sent at once, then stop)."""
    async with connect(str(url), token=TOKEN, sample_rate=SAMPLE_RATE) as stream:
        pcm = np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)
        for i in range(0, len(pcm), SAMPLE_RATE // 10):
            await stream.send(pcm[i:i + SAMPLE_RATE // 10])
        await stream.stop()
    return " ".join(f.text for f in stream.finals)


async def raw_exchange(port: int, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send a hand-written request; the status and the body of the answer (read to the close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


async def post(port: int, path: str, body: bytes, headers: dict[str, str], chunked: bool = False) -> tuple[int, Any]:
    """POST `body` (Content-Length, or chunked in 4 KiB pieces); the status and the JSON or text answer."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        body = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096])
                        for i in range(0, len(body), 4096)) + b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}")
    status, answer = await raw_exchange(port, "\r\n".join(lines) + "\r\n\r\n", body)
    return status, json.loads(answer) if answer.startswith(b"{") else answer.decode()
