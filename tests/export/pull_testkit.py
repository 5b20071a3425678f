"""What the `pull` tests ask of a run: run it as the command line does, check how it failed and what it left
in UNIPAD_HOME, and serve what it pulled by name (test_pull.py, test_pull_paraformer.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.client import connect
from export.__main__ import main
from export.hub import COMMIT_FILE
from export.pull import LOCK_FILE
from pipeline.audio import SAMPLE_RATE
from server.cli import build_parser, config_from_args
from server.protocol import Final


def run_pull(capsys: pytest.CaptureFixture, name: str, *args: str) -> tuple[int, str, str]:
    """`python -m export pull NAME ARGS...` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["pull", name, *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_failed_cleanly(code: int, err: str, home: Path, *words: str) -> None:
    """Non-zero exit, one `error:` line (the last) naming the problem, no traceback, no model installed."""
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code != 0
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err
    assert "Traceback" not in err
    for word in words:
        assert word in errors[0], errors[0]
    models = home / "models"
    assert not models.exists() or list(models.iterdir()) == [], list(models.iterdir())


def staged(home: Path) -> list[str]:
    """The files in UNIPAD_HOME/downloads (finished and partial), without the lock and the served commit."""
    root = home / "downloads"
    hidden = (LOCK_FILE, COMMIT_FILE)
    return sorted(p.name for p in root.rglob("*") if p.is_file() and p.name not in hidden) if root.exists() else []


async def transcribe_by_name(name: str, speech: Any, serve_test_server: Any) -> tuple[Path, list[Final]]:
    """`python -m server --model NAME` as the CLI resolves the name (to the cache), streaming `speech` (conftest's
    recording) to it in 100 ms messages: the model directory served, and the finals, one per utterance."""
    config = config_from_args(build_parser().parse_args(["--model", name]))
    async with serve_test_server(config.model) as url:
        async with connect(url, sample_rate=SAMPLE_RATE) as stream:
            assert stream.ready.model == name
            pcm = (speech.audio * 32767).astype(np.int16)
            for i in range(0, len(pcm), SAMPLE_RATE // 10):
                await stream.send(pcm[i:i + SAMPLE_RATE // 10])
            done = await stream.stop()
    assert done.segments == len(speech.utterances) == len(stream.finals)
    return config.model, stream.finals
