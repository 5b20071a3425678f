"""Real HAProxy (deploy/haproxy.cfg) in front of three real servers (subprocesses on 127.0.0.1): a full
server gets no new streams, 30 resumable streams survive one server's drain and another's death with
every final exactly once, and a hung server's streams move on. The harness is `python -m bench failover` (bench/failover.py)."""
from __future__ import annotations

import asyncio

import pytest

from bench.cluster import haproxy_binary
from bench.failover import failover, hang

pytestmark = pytest.mark.skipif(
    haproxy_binary() is None, reason="HAProxy is not installed (Debian: apt-get install haproxy; .ci/run does)")


def test_streams_survive_a_drained_and_a_killed_server(test_model_dir):
    # The figures go to docs/benchmarks.md through `python -m bench failover`; the test prints nothing.
    result = asyncio.run(failover(test_model_dir, streams=30, term_at=3.0, kill_at=5.0))
    assert not result["reference_errors"]
    # HAProxy took the full server (its /readyz 503) out of the rotation: none of 30 streams went there.
    assert result["saturated_server_new_streams"] == 0
    # leastconn spread the streams; every one on the two failed servers had to resume elsewhere.
    assert all(n > 0 for n in result["streams_per_server_at_term"].values()), result["streams_per_server_at_term"]
    moved = sum(result["streams_per_server_at_term"][result["faults"][fault]] for fault in ("sigterm", "sigkill"))
    assert result["resumptions"] >= moved
    assert result["finals_expected"] == 30 * 4
    assert (result["lost"], result["duplicated"], result["differing"]) == (0, 0, 0), result["problems"]
    assert result["finals_received"] == result["finals_expected"]
    assert result["resumed_utterances"] > 0
    assert result["drained_server_exit"] == 0  # SIGTERM: drained and exited cleanly


def test_a_hung_servers_streams_move_on(test_model_dir):
    """SIGSTOP: the server keeps its TCP connections and answers nothing. HAProxy's checks time out, it marks
    the server DOWN and cuts its streams at once (on-marked-down shutdown-sessions), so they resume elsewhere
    instead of waiting for the clients' pings to time out."""
    result = asyncio.run(hang(test_model_dir, streams=6, stop_at=2.0))
    assert not result["reference_errors"]
    assert result["streams_on_hung_server"] > 0
    assert result["sessions_held_when_down"] == 0  # cut when marked DOWN, not left to the clients' pings
    assert result["moved_streams"] >= result["streams_on_hung_server"]
    assert (result["lost"], result["duplicated"], result["differing"]) == (0, 0, 0), result["problems"]
    assert result["finals_received"] == result["finals_expected"] == 6 * 4
