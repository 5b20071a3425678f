"""Cross-clip batching at fixed shapes and in-graph decoding, on real ONNX Runtime sessions: the tiny exported
SenseVoice (tiny_model_dir, with decoding outputs) and the signature graph of tests/fixtures/tiny_graph.py
(an "old" directory without them). The CUDA-graph replay is in test_cuda.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pipeline.audio import seconds_to_samples
from pipeline.batching import Clip, Run, host_decoding, parse_batch_sizes, plan_batches
from pipeline.engine import Engine, EngineOptions
from pipeline.modeldir import DECODING_OUTPUT_NAMES, read_model_directory

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS = (2.0, 4.0)


def clip(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(seconds_to_samples(seconds)) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def batched(tiny_model_dir: Path) -> Engine:
    """fp32 on CPU with batches of 1 and 4 rows over two containers: four warmed sessions."""
    return Engine(tiny_model_dir, EngineOptions(device="cpu", precision="fp32", containers=CONTAINERS,
                                                batch_sizes=(1, 4))).load()


def test_plan_groups_by_container_and_pads_to_the_grid():
    s2, s4 = seconds_to_samples(2.0), seconds_to_samples(4.0)
    runs = plan_batches([s2, s4, s2, s2, s2, s2, s4], (1, 4), call_overhead=3.0)
    assert runs == [Run(4, s2, (0, 2, 3, 4)), Run(1, s2, (5,)), Run(4, s4, (1, 6))]
    assert plan_batches([s2] * 3, (1, 4, 16), 3.0) == [Run(4, s2, (0, 1, 2))]
    assert [r.batch for r in plan_batches([s2] * 5, (1, 4, 16), 3.0)] == [4, 1]  # not 16 with 11 spare rows
    assert [r.batch for r in plan_batches([s2] * 14, (1, 4, 16), 3.0)] == [16]
    assert [r.batch for r in plan_batches([s2] * 40, (1, 4, 16), 3.0)] == [16, 16, 4, 4]
    assert [r.batch for r in plan_batches([s2] * 2, (1, 4), 0.5)] == [1, 1]  # CPU: spare rows cost real work
    assert parse_batch_sizes("16,1,4") == (1, 4, 16)
    for bad in ("4,16", "1,x", "1,65"):
        with pytest.raises(ValueError):
            parse_batch_sizes(bad)


def test_a_clip_in_a_batch_equals_the_clip_alone(batched):
    clips = [Clip(clip(s, seed), lang) for seed, (s, lang) in
             enumerate([(1.7, "en"), (0.4, "auto"), (1.99, "zh"), (3.1, "en"), (2.5, "auto")])]
    together = batched.infer(clips, topk=True, full=True)
    assert batched.stats.last_batch == 4 or batched.stats.spare_rows > 0  # batches really formed
    for c, got in zip(clips, together):
        alone = batched.infer([c], topk=True, full=True)[0]
        assert got.length == alone.length
        np.testing.assert_allclose(got.logprobs[:got.length], alone.logprobs[:alone.length], atol=1e-5, rtol=0)
        np.testing.assert_array_equal(got.best_ids, alone.best_ids)  # greedy tokens identical
        np.testing.assert_array_equal(got.topk_ids[:, 0], alone.topk_ids[:, 0])
    texts = batched.transcribe_many(clips, [1.0] * len(clips))
    assert texts == [batched.transcribe(c.audio, c.language, offset=1.0) for c in clips]


def test_unwarmed_calls_stay_zero_under_mixed_load(batched):
    rng = np.random.default_rng(7)
    calls, rows = batched.stats.calls, batched.stats.rows
    for _ in range(12):
        n = int(rng.integers(1, 10))
        batched.infer([Clip(clip(float(rng.uniform(0.1, 4.0)), int(rng.integers(1 << 30)))) for _ in range(n)])
    assert batched.stats.unwarmed_calls == 0 and batched.stats.failures == 0
    assert batched.stats.rows > rows and batched.stats.calls - calls < batched.stats.rows - rows  # batched


def test_graph_decoding_outputs_equal_host_decoding(batched, tiny_model_dir):
    assert read_model_directory(tiny_model_dir).manifest.top_k == 8 and batched.in_graph_decoding
    outs = batched.infer([Clip(clip(1.5, 1)), Clip(clip(3.5, 2))], topk=True, full=True)
    for out in outs:
        ids, lps, topk_ids, topk_lps = host_decoding(out.logprobs[:out.length], 8)
        np.testing.assert_array_equal(out.best_ids, ids)
        np.testing.assert_array_equal(out.best_logprobs, lps)
        np.testing.assert_array_equal(out.topk_ids, topk_ids)
        np.testing.assert_array_equal(out.topk_logprobs, topk_lps)
        assert out.topk_ids.shape == (out.length, 8)
    lean = batched.infer([Clip(clip(1.5, 1))])[0]  # the serving call: no full log-probs, no top-k
    assert lean.logprobs is None and lean.topk_ids is None
    np.testing.assert_array_equal(lean.best_ids, outs[0].best_ids)


def test_serving_fetches_only_the_decoding_outputs(batched):
    """The host receives [frames] arrays, not [frames, vocab]: the output-name list reaches the session."""
    session = batched.runtime.sessions.sessions[(1, seconds_to_samples(2.0))]
    seen = []
    real = session.session.run
    session.session.run = lambda names, feed: seen.append(tuple(names)) or real(names, feed)
    try:
        batched.transcribe(clip(1.0, 3))
    finally:
        session.session.run = real
    assert seen == [("logprob_lengths", "best_ids", "best_logprobs")]


def test_old_model_directory_serves_and_upgrades(tmp_path):
    from fixtures.tiny_graph import write_tiny_model_dir

    old = write_tiny_model_dir(tmp_path / "old")
    eng = Engine(old, EngineOptions(containers=(2.0,))).load()
    assert not eng.in_graph_decoding
    audio = clip(1.5, 4)
    before = eng.infer([Clip(audio)], topk=True, full=True)[0]
    text = eng.transcribe(audio).text
    np.testing.assert_array_equal(before.best_ids, np.argmax(before.logprobs[:before.length], -1))

    done = subprocess.run([sys.executable, "-m", "export", "add-decoding", str(old), "--top-k", "5"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["top_k"] == 5
    assert read_model_directory(old).manifest.top_k == 5
    new = Engine(old, EngineOptions(containers=(2.0,))).load()
    assert new.in_graph_decoding
    after = new.infer([Clip(audio)], topk=True, full=True)[0]
    np.testing.assert_array_equal(after.logprobs, before.logprobs)  # the graph's old outputs are untouched
    np.testing.assert_array_equal(after.best_ids, before.best_ids)
    np.testing.assert_array_equal(after.topk_ids, before.topk_ids[:, :5])
    assert new.transcribe(audio).text == text


def test_int8_runs_one_clip_per_call(tiny_model_dir):
    eng = Engine(tiny_model_dir, EngineOptions(device="cpu", precision="int8", containers=(2.0,),
                                               batch_sizes=(1, 4))).load()
    assert eng.batch_sizes == (1,)
    eng.infer([Clip(clip(1.0, s)) for s in range(3)])
    assert eng.stats.calls == 3 and eng.stats.unwarmed_calls == 0


def test_session_memory_is_reported(batched):
    assert set(batched.stats.session_rss) == {"1x2s", "4x2s", "1x4s", "4x4s"}


def test_hotword_clips_share_a_batch_and_the_graph_top_k_matches_the_host(demo_speech):
    """Beam search over the graph's top-k, inside a batch, gives what the host's top-k of the full log-probs
    gives alone (the path before in-graph decoding)."""
    from pipeline.families.sensevoice.beam_search import beam_search, top_k
    from pipeline.hotwords import Hotword

    eng = Engine(ROOT / "models" / "demo", EngineOptions(device="cpu", precision="fp32", containers=(4.0,),
                                                        batch_sizes=(1, 4))).load()
    graph = eng.hotword_graph((Hotword("stop", 2.0),))
    audios = [demo_speech.audio[int(u["start"] * 16000):int(u["end"] * 16000)][:64000]
              for u in demo_speech.utterances[:3]]
    clips = [Clip(audios[0], hotwords=graph), Clip(audios[1]), Clip(audios[2], hotwords=graph)]
    together = eng.transcribe_many(clips)
    assert eng.stats.last_batch == 4
    m = eng.model.manifest
    for c, got in zip(clips, together):
        assert got == eng.transcribe(c.audio, hotwords=c.hotwords)
        if c.hotwords is not None:
            logprobs, length = eng.run(c.audio)
            ids, values = top_k(logprobs, length, blank_id=m.blank_id)
            assert got == beam_search(ids, values, length, eng.model.tokens, graph, blank_id=m.blank_id,
                                      prompt_frames=m.prompt_frames, frame_seconds=m.output_frame_seconds)
