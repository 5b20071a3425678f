"""The client tests stream the demo model's multi-utterance recording, so that with the shipped model
(the default) they check every word that reaches a client, and only structure with a tiny graph."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def speech(demo_speech):
    return demo_speech
