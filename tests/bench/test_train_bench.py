"""`python -m bench train`: bad input exits with one clear line; the training step is timed per precision."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from export import synth

ROOT = Path(__file__).resolve().parents[2]


def bench_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_zero_step_run_is_refused() -> None:
    proc = bench_train("--steps", "0")
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: --steps and --utterances must be positive, --warmup not negative"]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_both_precisions_are_timed() -> None:
    """Real espeak-ng utterances, the loop's own step: a row per precision with a positive time."""
    try:
        synth.require_espeak()
    except RuntimeError:
        pytest.skip("espeak-ng is not installed here")
    proc = bench_train("--utterances", "40", "--steps", "2", "--warmup", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith(("| fp32", "| bf16"))}
    assert set(rows) == {"fp32", "bf16"}
    assert all(float(row.split("|")[2]) > 0 for row in rows.values())
