"""Fixtures the `pull` tests share (test_pull.py, test_pull_paraformer.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty UNIPAD_HOME; HF_HOME beside it, so no real hub token or cache leaks in."""
    monkeypatch.setenv("UNIPAD_HOME", str(tmp_path / "unipad"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "unipad"
