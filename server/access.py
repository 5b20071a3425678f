"""Access control helpers: a per-address limit on failed token checks, and secrets kept out of the logs.

    AuthFailures   after `max_failures` wrong or missing tokens from one client address within
                   `cooldown` seconds, that address is refused (HTTP 429 in the handshake) until its
                   oldest failure in the window is `cooldown` seconds old. Memory is bounded: at most
                   MAX_TRACKED addresses, each with at most `max_failures` timestamps.
    RedactSecrets  a logging filter that blanks tokens (`?token=`, `"token": "..."`, `Bearer ...`)
                   in a record before it is written: websockets logs request lines, headers and
                   frames at debug level, and a token must never reach a log file.
The clock is injectable (`now`) so the policy is testable without sleeping.
"""
from __future__ import annotations

import collections
import logging
import re
import time
from typing import Callable

MAX_TRACKED = 10_000  # client addresses remembered; beyond it the stalest are forgotten
_SECRET_PATTERNS = (
    re.compile(r"(token=)[^&\s\"']+", re.IGNORECASE),
    re.compile(r"(\"token\"\s*:\s*\")[^\"]*", re.IGNORECASE),
    re.compile(r"(bearer\s+)\S+", re.IGNORECASE),
)


class AuthFailures:
    """Failed authentications per client address in a sliding window of `cooldown` seconds."""

    def __init__(self, max_failures: int, cooldown: float, now: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = max_failures
        self.cooldown = cooldown
        self._now = now
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def _recent(self, address: str) -> collections.deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        horizon = self._now() - self.cooldown
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def blocked(self, address: str) -> float:
        """Seconds until `address` may try again; 0 when it may try now."""
        times = self._recent(address)
        if times is None or len(times) < self.max_failures:
            return 0.0
        return max(times[0] + self.cooldown - self._now(), 0.0)

    def record(self, address: str) -> None:
        """Count one failed attempt from `address`."""
        times = self._recent(address)
        if times is None:
            times = self._failures[address] = collections.deque(maxlen=self.max_failures)
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)
        self._failures.move_to_end(address)
        times.append(self._now())


def redact(text: str) -> str:
    """`text` with every token value replaced by `***`."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(r"\1***", text)
    return text


class RedactSecrets(logging.Filter):
    """Rewrites a record's message with its tokens blanked (see `redact`); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_redaction(logger: logging.Logger) -> logging.Logger:
    """Add one RedactSecrets filter to `logger` (idempotent); returns the logger."""
    if not any(isinstance(f, RedactSecrets) for f in logger.filters):
        logger.addFilter(RedactSecrets())
    return logger
