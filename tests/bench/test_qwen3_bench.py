"""`python -m bench qwen3` on the tiny Qwen3-ASR export (conftest's qwen3_model_dir): it prints its figures."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("sharing", ["--share-weights", "--no-share-weights"])
def test_bench_prints_its_figures(qwen3_model_dir, sharing):
    done = subprocess.run([sys.executable, "-m", "bench", "qwen3", str(qwen3_model_dir), "--seconds", "3",
                           "--tokens", "4", "--repeat", "1", sharing], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["tokens"] == 4 and figures["encoder_s"] > 0 and figures["ms_per_token"] > 0
    assert figures["share_weights"] is (sharing == "--share-weights")
    assert figures["container_seconds"] == 4.0  # 3 s in the tiny ladder's 4 s container
    assert figures["largest_container_max_abs_diff"] == 0.0 and figures["largest_container_tokens_equal"]
