"""bench/make_qwen3_checkpoint.py writes a released-layout Qwen3-ASR checkpoint with the qwen-asr package's
own seeded initialisation, which the exporter's reader (export.qwen3_checkpoint.checkpoint_model, what
`python -m export qwen3-asr --checkpoint` runs) loads strictly, with the released prompt. Run at the tiny
size under the Python that has qwen-asr (QWEN_PYTHON, default /opt/qwen-venv/bin/python); skipped where it
is absent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from export.qwen3_asr import synthetic_dimensions
from export.qwen3_checkpoint import checkpoint_model

ROOT = Path(__file__).resolve().parents[2]
QWEN_PYTHON = Path(os.environ.get("QWEN_PYTHON", "/opt/qwen-venv/bin/python"))
SCRIPT = "bench.make_qwen3_checkpoint"


def make(python: Path | str, out: Path, seed: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", SCRIPT, "--out", str(out), "--size", "tiny", "--seed", str(seed)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(not QWEN_PYTHON.is_file(), reason=f"no qwen-asr Python at {QWEN_PYTHON}")
def test_the_exporter_reads_the_reference_checkpoint_as_released(tmp_path: Path) -> None:
    done = make(QWEN_PYTHON, tmp_path / "a", seed=7)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["made_by"] == "bench/make_qwen3_checkpoint.py" and info["seed"] == 7 and info["parameters"] > 0

    model, tokens = checkpoint_model(tmp_path / "a")  # strict: every tensor of the checkpoint, no other
    wanted = synthetic_dimensions("tiny")
    assert (model.dims.audio, model.dims.text) == (wanted.audio, wanted.text)
    prompt = model.dims.prompt
    assert (prompt.prefix, prompt.suffix, prompt.audio_token_id, prompt.eos_token_ids) == (
        wanted.prompt.prefix, wanted.prompt.suffix, wanted.prompt.audio_token_id, wanted.prompt.eos_token_ids)
    assert len(tokens) == wanted.text.vocab_size and tokens[prompt.audio_token_id] == "<|audio_pad|>"

    # the package's own init (transformers' _init_weights): linear weights ~ N(0, 0.02), norms 1, biases 0
    state = load_file(str(tmp_path / "a" / "model.safetensors"))
    norms = [t for name, t in state.items() if "norm" in name and name.endswith("weight")]
    assert norms and all(torch.all(t == 1) for t in norms)
    proj = state["thinker.model.layers.0.mlp.up_proj.weight"].float()
    assert abs(proj.std().item() - 0.02) < 0.004

    again = make(QWEN_PYTHON, tmp_path / "b", seed=7)
    assert again.returncode == 0, again.stderr[-2000:]
    other = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(state[name], other[name]) for name in state)  # seeded: the same weights


def test_without_qwen_asr_it_says_so(tmp_path: Path) -> None:
    done = make(sys.executable, tmp_path / "c", seed=1)  # the project's Python never has qwen-asr
    assert done.returncode == 2 and "qwen-asr is not installed" in done.stderr
    assert not (tmp_path / "c").exists()
