"""Access control: failed-token rate limit per address, tokens never logged, safe defaults, TLS."""
from __future__ import annotations

import json
import logging
import ssl
import subprocess

import pytest
import websockets

from server.access import AuthFailures, forwarded_client, proxy_networks, redact
from server.cli import build_parser
from server.config import ServerConfig
from server.http import token_matches
from server.protocol import CLOSE_POLICY
from server_testkit import http_get, send_and_collect

SECRET = "s3cret-Tok3n"
START = '{"type": "start"}'
STOP = '{"type": "stop"}'


def test_auth_failures_block_after_the_limit_then_cool_down():
    clock = [100.0]
    limiter = AuthFailures(max_failures=3, cooldown=60.0, now=lambda: clock[0])
    for _ in range(2):
        limiter.record("10.0.0.1")
    assert limiter.blocked("10.0.0.1") == 0
    clock[0] += 10
    limiter.record("10.0.0.1")
    assert limiter.blocked("10.0.0.1") == pytest.approx(50.0)  # until the oldest failure is 60 s old
    assert limiter.blocked("10.0.0.2") == 0  # per address
    clock[0] += 50.5
    assert limiter.blocked("10.0.0.1") == 0  # the window slid past the first failure
    clock[0] += 60
    assert limiter.blocked("10.0.0.1") == 0
    assert limiter._failures == {}  # expired entries are forgotten (and at most MAX_TRACKED are kept)


def test_the_client_address_is_forwarded_only_by_trusted_proxies():
    trusted = proxy_networks(["127.0.0.1", "10.0.0.0/8"])
    assert forwarded_client("203.0.113.9", ["198.51.100.1"], trusted) == "203.0.113.9"  # not a proxy: its own
    assert forwarded_client("127.0.0.1", [], trusted) == "127.0.0.1"  # a proxy that named nobody
    assert forwarded_client("127.0.0.1", ["198.51.100.1"], trusted) == "198.51.100.1"
    # A client's own header lies to the left of what the proxies appended: never believed.
    assert forwarded_client("127.0.0.1", ["6.6.6.6, 198.51.100.1"], trusted) == "198.51.100.1"
    assert forwarded_client("127.0.0.1", ["6.6.6.6", "198.51.100.1, 10.1.2.3"], trusted) == "198.51.100.1"
    assert forwarded_client("::ffff:127.0.0.1", ["2001:db8::1"], trusted) == "2001:db8::1"
    assert forwarded_client("127.0.0.1", ["10.1.2.3"], trusted) == "10.1.2.3"  # only proxies: the farthest
    assert forwarded_client("127.0.0.1", ["198.51.100.1, junk, 10.1.2.3"], trusted) == "10.1.2.3"
    with pytest.raises(ValueError, match="--forwarded-allow-ips: 'proxy' is not"):
        proxy_networks(["proxy"])


def test_token_compare_and_redaction():
    assert token_matches("ключ", "ключ") and not token_matches("ключ", "ключ2") and not token_matches("a", None)
    line = f'GET /v1/stream?token={SECRET}&x=1 Authorization: Bearer {SECRET} {{"type": "start", "token": "{SECRET}"}}'
    assert SECRET not in redact(line)
    assert "x=1" in redact(line) and '"type": "start"' in redact(line)


def test_default_bind_is_loopback():
    assert ServerConfig().host == "127.0.0.1"
    assert build_parser().parse_args([]).host == "127.0.0.1"
    assert ServerConfig().token is None  # documented in docs/security.md: no auth unless asked for


async def test_repeated_failures_from_one_address_get_429(serve_test_server):
    async with serve_test_server(token=SECRET, auth_max_failures=3) as url:
        ok = await send_and_collect(url, [json.dumps({"type": "start", "token": SECRET}), STOP])
        missing = await send_and_collect(url, ['{"type": "start"}'])
        wrong = await send_and_collect(url, [json.dumps({"type": "start", "token": "guess"})])
        with pytest.raises(websockets.InvalidStatus) as third:
            await send_and_collect(url + "?token=guess2", [])
        with pytest.raises(websockets.InvalidStatus) as locked:  # even the right token, for a while
            await send_and_collect(url + f"?token={SECRET}", [])
        status, _, _ = await http_get(url.http, "/healthz")  # plain HTTP is not locked out
        metrics = (await http_get(url.http, "/metrics"))[2].decode()
    assert [m["type"] for m in ok.messages] == ["ready", "done"]
    for result in (missing, wrong):
        assert [m["code"] for m in result.messages] == ["unauthorized"] and result.close_code == CLOSE_POLICY
    assert third.value.response.status_code == 401
    assert locked.value.response.status_code == 429
    assert int(locked.value.response.headers["Retry-After"]) > 0
    assert status == 200
    assert 'unipad_sessions_refused_total{reason="auth_cooldown"} 1.0' in metrics


@pytest.mark.parametrize("trusted", [(), ("10.9.9.9",), ("127.0.0.0/8",)])
async def test_a_forwarded_address_is_locked_out_alone_behind_a_trusted_proxy(serve_test_server, trusted):
    """Wrong tokens "forwarded for" one address; another forwarded address still gets in only when this
    peer (127.0.0.1) is a trusted proxy: else the header is anyone's to write and the peer is the client."""
    def as_client(address: str) -> dict:
        return {"additional_headers": {"X-Forwarded-For": address}}

    async with serve_test_server(token=SECRET, auth_max_failures=2, forwarded_allow_ips=trusted) as url:
        for _ in range(2):
            with pytest.raises(websockets.InvalidStatus):
                await send_and_collect(url + "?token=guess", [], **as_client("198.51.100.1"))
        with pytest.raises(websockets.InvalidStatus) as guesser:
            await send_and_collect(url + f"?token={SECRET}", [], **as_client("198.51.100.1"))
        try:
            other = (await send_and_collect(url + f"?token={SECRET}", [START, STOP], **as_client("198.51.100.2"))).messages
        except websockets.InvalidStatus as refused:
            other = refused.response.status_code
    assert guesser.value.response.status_code == 429
    assert other == 429 if trusted in ((), ("10.9.9.9",)) else [m["type"] for m in other] == ["ready", "done"]


async def test_tokens_never_reach_the_logs_even_at_debug(serve_test_server, caplog):
    caplog.set_level(logging.DEBUG)
    async with serve_test_server(token=SECRET) as url:
        await send_and_collect(url, [json.dumps({"type": "start", "token": SECRET}), STOP])
        await send_and_collect(url + f"?token={SECRET}", ['{"type": "start"}', STOP])
        await send_and_collect(url, ['{"type": "start"}', STOP], additional_headers={"Authorization": f"Bearer {SECRET}"})
        await send_and_collect(url, [json.dumps({"type": "start", "token": SECRET + "x"})])
        with pytest.raises(websockets.InvalidStatus):
            await send_and_collect(url + f"?token={SECRET}y", [])
    server_side = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert any("wrong token" in r.getMessage() for r in server_side)  # failures are logged ...
    assert any("token=***" in r.getMessage() for r in server_side)  # ... and the handshake, redacted
    leaked = [r.getMessage() for r in server_side if SECRET in r.getMessage()]
    assert leaked == []


async def test_tls_with_token(serve_test_server, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    client = ssl.create_default_context(cafile=str(cert))
    async with serve_test_server(certfile=cert, keyfile=key, token=SECRET) as url:
        secure = url.replace("ws://", "wss://")
        ok = await send_and_collect(secure + f"?token={SECRET}", ['{"type": "start"}', STOP], ssl=client)
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the cert
            await send_and_collect(secure, ['{"type": "start"}'])
        with pytest.raises((websockets.InvalidMessage, ConnectionError, EOFError, OSError)):
            await send_and_collect(url, ['{"type": "start"}'], open_timeout=10)  # plain ws to a TLS port
    assert [m["type"] for m in ok.messages] == ["ready", "done"]
