"""The CUDA path on a real GPU: what the engine promises on CPU (padding and batching are invisible, the
graph's decoding outputs equal the host's) holds on CUDAExecutionProvider too, with TF32 off.

Every test here skips without onnxruntime-gpu and an NVIDIA GPU (CI has neither); docs/benchmarks.md
records where and when they ran. The tiny exported SenseVoice (conftest's tiny_model_dir) is the model.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from test_batching import clip

from pipeline.batching import Clip, host_decoding
from pipeline.engine import Engine, EngineOptions


def cuda_available() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers() or shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs onnxruntime-gpu and an NVIDIA GPU")

CONTAINERS = (2.0, 4.0)
EXACT = 1e-5  # the fp32 promise: TF32 off, so the GPU's matmuls round like fp32 ones


@pytest.fixture(scope="module")
def gpu(tiny_model_dir: Path) -> Engine:
    return Engine(tiny_model_dir, EngineOptions(device="cuda", precision="fp32", containers=CONTAINERS,
                                                batch_sizes=(1, 4))).load()


@pytest.fixture(scope="module")
def cpu(tiny_model_dir: Path) -> Engine:
    return Engine(tiny_model_dir, EngineOptions(device="cpu", precision="fp32", containers=CONTAINERS,
                                                batch_sizes=(1,))).load()


def test_auto_chooses_cuda_and_reports_it(tiny_model_dir):
    eng = Engine(tiny_model_dir, EngineOptions(containers=(2.0,), batch_sizes=(1,))).load()
    assert (eng.device, eng.provider) == ("cuda", "CUDAExecutionProvider")
    assert eng.ready and eng.stats.unwarmed_calls == 0
    assert eng.cuda_graph  # SenseVoice replays CUDA graphs unless told not to


def test_padding_is_invisible_on_cuda(tiny_model_dir, gpu):
    """A 1.5 s clip in the 2 s and the 4 s container: the same log-probs over its valid frames."""
    small = Engine(tiny_model_dir, EngineOptions(device="cuda", precision="fp32", containers=(2.0,),
                                                 batch_sizes=(1,))).load()
    big = Engine(tiny_model_dir, EngineOptions(device="cuda", precision="fp32", containers=(4.0,),
                                               batch_sizes=(1,))).load()
    for seed, seconds in enumerate((0.3, 1.5, 1.99)):
        a = small.infer([Clip(clip(seconds, seed))], full=True)[0]
        b = big.infer([Clip(clip(seconds, seed))], full=True)[0]
        assert a.length == b.length > 0
        np.testing.assert_allclose(a.logprobs[:a.length], b.logprobs[:b.length], atol=EXACT, rtol=0)
        np.testing.assert_array_equal(a.best_ids, b.best_ids)


def test_a_clip_in_a_batch_equals_the_clip_alone_on_cuda(gpu):
    clips = [Clip(clip(s, seed), lang) for seed, (s, lang) in
             enumerate([(1.7, "en"), (0.4, "auto"), (1.99, "zh"), (3.1, "en"), (2.5, "auto")])]
    together = gpu.infer(clips, topk=True, full=True)
    assert gpu.stats.last_batch == 4 or gpu.stats.spare_rows > 0
    for c, got in zip(clips, together):
        alone = gpu.infer([c], topk=True, full=True)[0]
        assert got.length == alone.length
        np.testing.assert_allclose(got.logprobs[:got.length], alone.logprobs[:alone.length], atol=EXACT, rtol=0)
        np.testing.assert_array_equal(got.best_ids, alone.best_ids)
    assert gpu.stats.unwarmed_calls == 0


def test_cuda_agrees_with_cpu(gpu, cpu):
    for seed, seconds in enumerate((0.8, 1.9, 3.6)):
        a = gpu.infer([Clip(clip(seconds, seed))], full=True)[0]
        b = cpu.infer([Clip(clip(seconds, seed))], full=True)[0]
        assert a.length == b.length
        np.testing.assert_allclose(a.logprobs[:a.length], b.logprobs[:b.length], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(a.best_ids, b.best_ids)


def test_graph_decoding_outputs_equal_host_decoding_on_cuda(gpu, tiny_model_dir):
    assert gpu.in_graph_decoding
    for out in gpu.infer([Clip(clip(1.5, 1)), Clip(clip(3.5, 2))], topk=True, full=True):
        ids, lps, topk_ids, topk_lps = host_decoding(out.logprobs[:out.length], 8)
        np.testing.assert_array_equal(out.best_ids, ids)
        np.testing.assert_allclose(out.best_logprobs, lps, atol=1e-6, rtol=0)
        np.testing.assert_array_equal(out.topk_ids, topk_ids)
        np.testing.assert_allclose(out.topk_logprobs, topk_lps, atol=1e-6, rtol=0)


def test_cuda_graph_replays_equal_plain_runs(tiny_model_dir):
    options = dict(device="cuda", precision="fp32", containers=(4.0,), batch_sizes=(1, 4))
    graph = Engine(tiny_model_dir, EngineOptions(**options)).load()  # SenseVoice's default
    plain = Engine(tiny_model_dir, EngineOptions(cuda_graph=False, **options)).load()
    assert graph.cuda_graph and not plain.cuda_graph
    for seed in range(4):  # every call after warm-up is a replay with new inputs copied in place
        clips = [Clip(clip(float(s), seed * 10 + i)) for i, s in enumerate((3.9, 1.2, 2.7)[: 1 + seed % 3])]
        for got, want in zip(graph.infer(clips, topk=True, full=True), plain.infer(clips, topk=True, full=True)):
            assert got.length == want.length > 0
            np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
            np.testing.assert_array_equal(got.best_ids, want.best_ids)
    assert graph.stats.unwarmed_calls == 0
