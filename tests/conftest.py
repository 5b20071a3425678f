"""Fixtures shared by the whole suite. Keep this small: helpers of one test module live in that module."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipeline.audio import SAMPLE_RATE

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Before any test imports torch (its OpenMP reads this once), and inherited by every process a test starts: the
# suite's three processes share two cores, and OpenMP's threads spin while they wait for work, taking the core
# from the other processes (a few bf16 training steps: 3.5 s alone, 37 s in the suite; 6.5 s passive). Training
# sets the same itself (export/train_demo.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@dataclass(frozen=True)
class Speech:
    """A multi-utterance recording: float32 [n] at SAMPLE_RATE, and where its speech is (seconds)."""

    audio: np.ndarray
    utterances: list[dict]  # {"text", "start", "end"} per utterance, in order

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def load_recording(wav: Path) -> Speech:
    """A WAV fixture and its JSON sidecar ({"speech": [{"text", "start", "end"}]})."""
    audio, rate = soundfile.read(wav, dtype="float32")
    assert rate == SAMPLE_RATE
    sidecar = json.loads(wav.with_suffix(".json").read_text(encoding="utf-8"))
    audio.setflags(write=False)  # shared by every test: nobody may modify it
    return Speech(audio=audio, utterances=sidecar["speech"])


@pytest.fixture(scope="session")
def speech() -> Speech:
    """tests/fixtures/three_utterances.wav: sentences outside the demo model's vocabulary."""
    return load_recording(FIXTURES / "three_utterances.wav")


@pytest.fixture(scope="session")
def demo_speech() -> Speech:
    """tests/fixtures/demo/multi.wav: three utterances in the demo model's vocabulary (exact words)."""
    return load_recording(FIXTURES / "demo" / "multi.wav")


# ---- a real server for end-to-end tests (server helper) ------------------------------------------------
# Usage, in any test module (no import needed):
#
#     async def test_something(serve_test_server):
#         async with serve_test_server(partial_interval=0.3) as url:   # ServerConfig overrides
#             async with websockets.connect(url) as ws: ...            # url: ws://127.0.0.1:PORT/v1/stream
#             url.http          # "http://127.0.0.1:PORT" for /healthz, /readyz, /metrics, the page
#             url.server        # the running server.server.Server (metrics, config, engine)
#
# The model is `test_model_dir`: $UNIPAD_TEST_MODEL if set, else the shipped demo model (models/demo)
# when it exists, else the tiny graph of tests/fixtures/tiny_graph.py (real ONNX Runtime, garbage text,
# real segmentation and protocol behaviour).

import shutil  # noqa: E402
from typing import Any  # noqa: E402

from serving import serve_test_server  # noqa: E402

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory the end-to-end tests serve (see above)."""
    if os.environ.get("UNIPAD_TEST_MODEL"):
        return Path(os.environ["UNIPAD_TEST_MODEL"])
    if (DEMO_MODEL / "manifest.json").is_file():
        return DEMO_MODEL
    from fixtures.tiny_graph import write_tiny_model_dir

    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(name="serve_test_server")
def _serve_test_server_fixture(test_model_dir: Path) -> Any:
    """`serve_test_server` with the suite's model as the default."""

    def start(model: Path | None = None, **kwargs: Any) -> Any:
        return serve_test_server(model or test_model_dir, **kwargs)

    return start


# ---- exports every test may share ------------------------------------------------------------------------
# tests/fixtures/make_exports.py writes them (the real exporter) into tests/fixtures/exports, committed with the
# SHA-256 of every file they were made from. While those files are unchanged, a run copies the committed export
# into its own temporary root; else it exports there itself (tests/test_committed_exports.py then fails until the
# script is run again). `.ci/run` spreads the test files over three processes (pytest-xdist); each export is
# copied or written once per run, by whichever process asks first, while the others wait for it.

def exported_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """tests/fixtures/make_exports.py's export `name`, once per run, whatever the number of worker processes."""
    import subprocess
    import sys

    from filelock import FileLock

    from fixtures.make_exports import OUT, changed_sources

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's temp root lies in the run's
        root = root.parent
    out = root / "exported" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / "manifest.json").is_file():
            shutil.rmtree(out, ignore_errors=True)  # what a failed attempt left
            if not changed_sources():
                shutil.copytree(OUT / name, out)  # a copy: no test can change the committed one
            else:
                command = [sys.executable, str(FIXTURES / "make_exports.py"), "--only", name, "--out", str(out)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    pytest.fail(f"{' '.join(command[1:])} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SenseVoice model directory with seeded random tiny weights (fp32 and int8), as `python -m export
    sensevoice --random-init tiny` writes it. Garbage text, but the real graph: frontend, prompt rows, padding."""
    return exported_once(tmp_path_factory, "sensevoice-tiny")


@pytest.fixture(scope="session")
def tiny_fp16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model exported fp16 only (`--precision fp16`): a GPU's export."""
    return exported_once(tmp_path_factory, "sensevoice-tiny-fp16")


@pytest.fixture(scope="session")
def paraformer_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FunASR's own tiny Paraformer (tests/fixtures/paraformer, a released directory's layout) exported by
    `python -m export paraformer --checkpoint` in fp32 and int8: parity, verify and serving tests share it."""
    return exported_once(tmp_path_factory, "paraformer")


@pytest.fixture(scope="session")
def ct_punc_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FunASR's own tiny CT-Transformer (tests/fixtures/ct_punc, a released ct-punc directory's layout) exported
    by `python -m export ct-punc --checkpoint` in fp32 and int8."""
    return exported_once(tmp_path_factory, "ct-punc")


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-ASR's tiny geometry with seeded random weights, fp32, int8 and fp16, in an 8 s container, as
    `python -m export qwen3-asr --random-init tiny` writes it: export, verify and serving tests share it. Its
    words are noise (a random decoder repeats one token), the graphs are the real ones."""
    return exported_once(tmp_path_factory, "qwen3-tiny")


@pytest.fixture(scope="session")
def qwen3_external_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model written as a full-size export is, every graph's weights in "<graph>.data" files."""
    return exported_once(tmp_path_factory, "qwen3-tiny-external")


@pytest.fixture(scope="session")
def qwen3_released_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `qwen-asr` package's tiny model in Qwen's released layout with a small byte-level BPE tokenizer
    (tests/qwen3_released.py), exported by `python -m export qwen3-asr --checkpoint` in fp32 and int8, an 8 s
    container, as many new tokens as the fixture's reference decoded: fp32 must decode the reference's tokens,
    and it is a Qwen3-ASR that takes hotwords (its merges.txt encodes them into the prompt)."""
    return exported_once(tmp_path_factory, "qwen3-released")


@pytest.fixture(scope="session")
def paraformer_unmasked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A defective tiny Paraformer (fp32) whose attention takes no mask: padding reaches every attention."""
    return exported_once(tmp_path_factory, "paraformer-unmasked")
