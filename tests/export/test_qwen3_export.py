"""`python -m export qwen3-asr` on the tiny geometry: three graphs, the manifest, verify, and the ONNX
decoder (pipeline/families/qwen3_asr/decoding.py) against the PyTorch model it was exported from."""
from __future__ import annotations

import json
from dataclasses import replace
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.onnx_export import deterministic_waveform
from export.qwen3_asr import DEFAULT_SEED, random_model
from export.verify import verify
from pipeline.modeldir import read_model_directory
from pipeline.families.qwen3_asr.decoding import GRAPHS, PREFILL, STEP, Qwen3Decoder, Qwen3Shapes

CONTAINER, MAX_NEW_TOKENS = 8.0, 16  # conftest.py qwen3_model_dir exports the tiny preset with these


def run_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "export", "qwen3-asr", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def model_dir(qwen3_model_dir):
    return qwen3_model_dir


def served_decoder(model_dir, precision: str) -> Qwen3Decoder:
    directory = read_model_directory(model_dir)
    shapes = Qwen3Shapes.from_dimensions(directory.manifest.dimensions)
    sessions = {graph: ort.InferenceSession(str(model_dir / directory.manifest.graphs[precision][graph]),
                                            providers=["CPUExecutionProvider"]) for graph in GRAPHS}
    return Qwen3Decoder(sessions, directory.manifest.dimensions["prompt"], shapes)


def test_manifest_lists_three_graphs_per_precision(model_dir):
    manifest = read_model_directory(model_dir).manifest
    assert manifest.architecture == "qwen3-asr"
    assert set(manifest.graphs) == {"fp32", "int8", "fp16"} and all(set(g) == set(GRAPHS) for g in manifest.graphs.values())
    shapes = Qwen3Shapes.from_dimensions(manifest.dimensions)
    assert shapes.container_samples == CONTAINER * 16000 and shapes.cache_slots == shapes.prompt_slots + MAX_NEW_TOKENS
    assert not {"cache_step", "prompt_step"} & set(manifest.dimensions["shapes"])  # the server's choice
    assert len((model_dir / "tokens.txt").read_text(encoding="utf-8").splitlines()) == manifest.dimensions["vocab_size"]


def test_verify_passes_every_precision_that_keeps_fp32s_answer(model_dir):
    """Padding invariance holds for every precision; int8 fails only its agreement with fp32 (on these random
    weights no int8 recipe keeps it: tests/export/test_qwen3_sensevoice_agreement.py)."""
    report = verify(model_dir, None, None, (1.5, 6.1))
    assert report["static_shapes"] and not report["forbidden_ops"]
    for precision, entry in report["precisions"].items():
        assert all(r["tokens_equal"] and r["tokens"] > 0 for r in entry["lengths"].values())
        assert entry["passed"] == (precision != "int8"), json.dumps(entry.get("agreement"))[:2000]
    assert not report["precisions"]["int8"]["agreement"]["passed"]


def test_onnx_decoder_equals_the_pytorch_model(model_dir):
    model = random_model("tiny", DEFAULT_SEED)
    audio = deterministic_waveform(3.3, seed=5)
    decoder = served_decoder(model_dir, "fp32")
    container = np.zeros((1, decoder.shapes.container_samples), np.float32)
    container[0, : len(audio)] = audio
    with torch.no_grad():
        mel, mel_lengths = model.features(torch.from_numpy(container), torch.tensor([len(audio)]))
        expected = model.greedy_decode(mel, mel_lengths, MAX_NEW_TOKENS)[0]
    assert decoder.decode(audio).tokens == expected
    assert served_decoder(model_dir, "int8").decode(audio).tokens  # int8 runs and decodes


@pytest.mark.parametrize("precision", ["fp32", "int8", "fp16"])
def test_a_clip_sized_prompt_and_growing_cache_decode_as_the_whole_ones_do(model_dir, precision):
    """Where prefill's prompt and the step's cache follow the clip (the CPU: Qwen3Shapes.prompt_step and
    cache_step), every logit is bit-identical and the tokens equal to decoding over the container's whole
    prompt and cache; prefill ran over the rounded-up prompt, the steps over grown caches, each holding its
    own slot."""
    whole_decoder = served_decoder(model_dir, precision)
    shapes, sessions = whole_decoder.shapes, whole_decoder.sessions
    fed: dict[str, list] = {PREFILL: [], STEP: []}

    class Recording:
        def __init__(self, graph):
            self.graph = graph

        def run(self, names, feed):
            fed[self.graph].append((int(feed["positions"][0]), feed["cache_keys"].shape[3]) if self.graph == STEP
                                   else (int(feed["prompt_lengths"][0]), feed["prompt_ids"].shape[1]))
            return sessions[self.graph].run(names, feed)

    audio = deterministic_waveform(3.3, seed=5)
    whole = whole_decoder.decode(audio)
    clip_sized = Qwen3Decoder({**sessions, PREFILL: Recording(PREFILL), STEP: Recording(STEP)}, whole_decoder.prompt,
                              replace(shapes, cache_step=4, prompt_step=8)).decode(audio)
    assert clip_sized.tokens == whole.tokens and len(whole.tokens) == MAX_NEW_TOKENS  # random weights never stop
    assert np.array_equal(clip_sized.first_logits, whole.first_logits)
    assert len(clip_sized.step_logits) == len(whole.step_logits)
    assert all(np.array_equal(a, b) for a, b in zip(clip_sized.step_logits, whole.step_logits))
    [(length, prompt)] = fed[PREFILL]
    assert prompt == -(-length // 8) * 8 < shapes.prompt_slots
    assert [size for _, size in fed[STEP]] == [-(-(position + 1) // 4) * 4 for position, _ in fed[STEP]]
    assert fed[STEP][-1][1] < shapes.cache_slots and len({size for _, size in fed[STEP]}) > 2


def test_a_forced_language_decodes_as_the_pytorch_model(model_dir):
    """A forced language ends the prompt as the reference's does ("<|im_start|>assistant\n" then "language
    English<asr_text>"); the graphs decode it as the PyTorch model; the prompt slots have room for it."""
    from pipeline.families.qwen3_asr.decoding import forced_language_ids, prompt_ids

    model = random_model("tiny", DEFAULT_SEED)
    directory = read_model_directory(model_dir)
    prompt, tokens = directory.manifest.dimensions["prompt"], directory.tokens
    assert set(directory.manifest.languages) == {"auto", *prompt["languages"]} and "en" in prompt["languages"]
    ids, length = prompt_ids(prompt, 3, 64, "en")
    forced = list(prompt["languages"]["en"])
    assert list(ids[0, length - len(forced) - len(prompt["suffix"]):length]) == [*prompt["suffix"], *forced]
    assert "".join(tokens[i] for i in forced) == "languageĠEnglish<asr_text>"
    audio = deterministic_waveform(7.9, seed=5)  # the whole container's audio tokens and the language
    decoder = served_decoder(model_dir, "fp32")
    container = np.zeros((1, decoder.shapes.container_samples), np.float32)
    container[0, : len(audio)] = audio
    with torch.no_grad():
        mel, mel_lengths = model.features(torch.from_numpy(container), torch.tensor([len(audio)]))
        expected = model.greedy_decode(mel, mel_lengths, MAX_NEW_TOKENS, language="en")[0]
        embeds, token_lengths = model.encode(mel, mel_lengths)
        expected_logits = model.prefill(*model.prompt_ids(token_lengths, decoder.shapes.prompt_slots, "en"), embeds)[0]
    told = decoder.decode(audio, language="en")
    assert told.tokens == expected
    np.testing.assert_allclose(told.first_logits, expected_logits[0].numpy(), atol=1e-4)
    assert np.abs(told.first_logits - decoder.decode(audio).first_logits).max() > 1e-2  # it was told
    with pytest.raises(ValueError, match="cannot be told the language 'xx'"):
        forced_language_ids(prompt, "xx")


def test_audio_longer_than_the_container_is_refused(model_dir):
    decoder = served_decoder(model_dir, "fp32")
    with pytest.raises(ValueError, match="exceeds the 8 s container"):
        decoder.decode(np.zeros(int(CONTAINER * 16000) + 1, np.float32))


def test_fp16_graphs_decode_as_fp32_does(model_dir):
    """The GPU precision: audio and logits float32, embeddings and the KV cache float16; the same tokens."""
    audio = deterministic_waveform(3.3, seed=5)
    fp16 = served_decoder(model_dir, "fp16")
    types = {i.name: i.type for graph in fp16.sessions.values() for i in graph.get_inputs()}
    assert types["audio"] == "tensor(float)" and types["cache_keys"] == types["audio_embeds"] == "tensor(float16)"
    got, want = fp16.decode(audio), served_decoder(model_dir, "fp32").decode(audio)
    assert got.tokens == want.tokens and got.first_logits.dtype == np.float32
    cosine = got.first_logits @ want.first_logits / np.linalg.norm(got.first_logits) / np.linalg.norm(want.first_logits)
    assert cosine > 0.999, cosine


def test_unknown_precision_is_a_clear_error(tmp_path):
    done = run_export("--random-init", "tiny", "--out", str(tmp_path / "x"), "--precision", "bf16")
    assert done.returncode != 0 and "unknown precision 'bf16'" in done.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_step_does_not_depend_on_the_cache_length(model_dir, precision):
    """The same step over every cache length from one free slot up to the served cache (zeros past the
    valid slots) gives bit-identical logits, at several positions, in one session with a free cache axis
    as the engine runs it. With the new token attended after the cache, float32's summation order followed
    the cache length, and int8 amplified that last bit over steps."""
    directory = read_model_directory(model_dir)
    dims, text = directory.manifest.dimensions, directory.manifest.dimensions["text"]
    session = ort.InferenceSession(str(model_dir / directory.manifest.graphs[precision]["step"]),
                                   providers=["CPUExecutionProvider"])
    served = Qwen3Shapes.from_dimensions(dims).cache_slots
    rng = np.random.default_rng(7)
    for valid in (0, 7, 33, served // 2, served - 1):
        kv = (text["num_hidden_layers"], 1, text["num_key_value_heads"], valid, text["head_dim"])
        past_keys, past_values = rng.standard_normal(kv, dtype=np.float32), rng.standard_normal(kv, dtype=np.float32)

        def step_logits(slots: int) -> np.ndarray:
            keys, values = (np.zeros((*kv[:3], slots, kv[4]), np.float32) for _ in range(2))
            keys[:, :, :, :valid], values[:, :, :, :valid] = past_keys, past_values
            feed = {"token_ids": np.array([[5]]), "positions": np.array([valid]), "cache_keys": keys,
                    "cache_values": values}
            return session.run(None, feed)[0]

        expected = step_logits(served)
        differing = [slots for slots in range(valid + 1, served) if not np.array_equal(step_logits(slots), expected)]
        assert not differing, f"{valid} valid slots: cache lengths {differing[:10]} differ from {served}"


def test_prefill_and_step_share_their_decoder_weights_on_the_cpu(model_dir):
    """The export names weights by content, so the engine hands prefill and step one copy of the decoder's
    weights that no kernel prepacks (the token embedding above all); each keeps its own MatMul weights,
    prepacked. The same transcript as with a copy each (ONNX Runtime ignoring the names a graph lacks)."""
    from pipeline.engine import Engine, EngineOptions
    from pipeline.initializers import read_initializers
    from pipeline.families.qwen3_asr.runtime import CONTENT_NAME_PREFIX

    manifest = read_model_directory(model_dir).manifest
    graphs = manifest.graphs["int8"]
    prefill, step = (read_initializers(model_dir / graphs[g]) for g in ("prefill", "step"))
    assert all(name.startswith(CONTENT_NAME_PREFIX) for name in [*prefill, *step])
    common = set(prefill) & set(step)
    assert sum(prefill[n].nbytes for n in common) > 0.9 * sum(a.nbytes for a in step.values())
    unpacked = set(read_initializers(model_dir / graphs["step"], skip_prepacked=True))
    audio = deterministic_waveform(3.3, seed=5)
    shared, separate = (Engine(model_dir, EngineOptions(device="cpu", precision="int8", share_weights=s)).load()
                        for s in (True, False))
    size = shared.policy.largest  # every container's runners hold the same arrays
    given = set(shared.runtime.runners[("step", size)].weights)
    assert given == set(shared.runtime.runners[("prefill", size)].weights) == common & unpacked
    embedding = max(common & unpacked, key=lambda n: step[n].nbytes)
    assert embedding in given and step[embedding].shape[0] == manifest.dimensions["vocab_size"]
    assert not separate.runtime.runners[("step", size)].weights and not shared.runtime.runners[("encoder", size)].weights
    assert shared.transcribe(audio) == separate.transcribe(audio)
