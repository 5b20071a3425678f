"""The door table (server/doors.py): every handler a row names exists, and each path finds its door."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from server.config import ServerConfig
from server.doors import DOORS, door_for, load, post_door, stream_door
from server.streaming import StreamConnection


@pytest.mark.parametrize("door", DOORS, ids=lambda door: door.name)
def test_every_row_names_handlers_that_exist(door):
    if door.stream is not None:
        assert issubclass(load(door.stream), StreamConnection)
    for handler in (door.handshake, door.post, door.start):
        if handler is not None:
            assert callable(load(handler))
    if door.post is not None or door.start is not None:
        assert inspect.iscoroutinefunction(load(door.post or door.start))
    assert (door.path is None) == (door.port is not None) == (door.start is not None)
    if door.port is not None:
        assert door.port in {field.name for field in dataclasses.fields(ServerConfig)}
    assert not door.prefix or door.path.endswith("/")


def test_each_path_finds_its_door():
    assert door_for("/v1/stream", "handshake").name == "unipad"
    assert door_for("/v1/stream/", "handshake").name == "unipad"  # as typed or pasted
    assert door_for("/v1/listen", "handshake").name == "deepgram"
    assert door_for("/v1/listen/", "handshake").name == "openai"  # only Unipad's path takes a slash
    assert door_for("/v1/realtime", "handshake").name == "openai-realtime"
    assert door_for("/v1/models", "handshake").name == "openai"
    assert door_for("/healthz", "handshake") is None
    assert post_door("/v1/listen").name == "deepgram"
    assert post_door("/v1/stream").name == "openai"  # OpenAI's 404 names the endpoints
    assert post_door("/").name == "openai"
    assert stream_door("/v1/realtime").name == "openai-realtime"
    assert stream_door("/v1/listen").name == "deepgram"
    assert stream_door("/v1/stream/").name == "unipad"


def test_names_are_unique():
    assert len({door.name for door in DOORS}) == len(DOORS)
