"""Access control helpers: the client's address, a per-address limit on failed token checks, and secrets
kept out of the logs.

    forwarded_client  the client's address behind trusted proxies (--forwarded-allow-ips): a load balancer
                   makes every client one address, so its X-Forwarded-For names them, and is believed only
                   from the proxies the operator names (anyone else could write any address there).
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
import ipaddress
import logging
import re
import time
from typing import Callable, Sequence

MAX_TRACKED = 10_000  # client addresses remembered; beyond it the stalest are forgotten
FORWARDED_FOR = "X-Forwarded-For"  # HAProxy's `option forwardfor`, nginx's $proxy_add_x_forwarded_for
FORWARDED_ALLOW_IPS_ENV = "UNIPAD_FORWARDED_ALLOW_IPS"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_SECRET_PATTERNS = (
    re.compile(r"(token=)[^&\s\"']+", re.IGNORECASE),
    re.compile(r"(\"token\"\s*:\s*\")[^\"]*", re.IGNORECASE),
    re.compile(r"(bearer\s+)\S+", re.IGNORECASE),
)


def proxy_networks(addresses: Sequence[str]) -> tuple[Network, ...]:
    """The trusted proxies: addresses or networks ("10.0.0.5", "10.0.0.0/8", "::1"); ValueError naming the flag."""
    networks = []
    for address in addresses:
        try:
            networks.append(ipaddress.ip_network(address.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--forwarded-allow-ips: {address!r} is not an IP address or network") from None
    return tuple(networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:10.0.0.5 from a dual-stack socket is 10.0.0.5
    return mapped or address


def forwarded_client(peer: str, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """The client's address: `peer` (the TCP peer), unless `peer` is a trusted proxy; then the X-Forwarded-For
    entries (`forwarded_for`: the header's values in order) from the right, the first that is not a trusted
    proxy. Each trusted proxy appends whom it got the request from; what the client wrote itself lies further
    left and is never reached while a trusted proxy stands to its right. A malformed entry ends the walk
    at the last trusted hop."""

    def is_trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        return address is not None and any(address in network for network in trusted)

    client = peer
    if not is_trusted(_address(peer)):
        return client
    entries = [entry for value in forwarded_for for entry in value.split(",")]
    for entry in reversed(entries):
        address = _address(entry)
        if address is None:
            return client
        client = str(address)
        if not is_trusted(address):
            return client
    return client


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
