"""`python -m export qwen3-asr --checkpoint` and `python -m export pull qwen3-asr-0.6b`, on the tiny fixture's
weights written in the released layout (tests/qwen3_released.py: Qwen/Qwen3-ASR-0.6B's config.json with a
thinker_config, model.safetensors with `thinker.*` keys, vocab.json, merges.txt, tokenizer_config.json's
added tokens).

The fixture (tests/fixtures/qwen3, made by make_qwen3_fixture.py with the `qwen-asr` package) holds the
reference model's state_dict and its greedy tokens on three clips; the exported graphs must decode the same.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from hub_mirror import HubMirror, MirrorFile

from export.__main__ import main
from export.qwen3_asr import GRAPH_FILES
from pipeline import catalog
from pipeline.catalog import QWEN3_ASR_0_6B, HubFile
from pipeline.modeldir import read_model_directory
from pipeline.families.qwen3_asr.decoding import GRAPHS, Qwen3Decoder, Qwen3Shapes, serving_overrides
from qwen3_released import CONFIG, FIXTURE, SPECIAL, released_files

REFERENCE = np.load(FIXTURE / "reference.npz")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3-released")
    for name, data in released_files().items():
        (directory / name).write_bytes(data)
    return directory


def clip_audio(clip: str) -> np.ndarray:
    samples, rate = soundfile.read(FIXTURE.parent / "three_utterances.wav", dtype="float32")
    start, seconds = CONFIG["clips"][clip]
    return samples[int(start * rate): int(start * rate) + int(seconds * rate)]


def decoder(model_dir: Path, precision: str) -> Qwen3Decoder:
    import onnxruntime as ort

    directory = read_model_directory(model_dir)
    dims = directory.manifest.dimensions
    made = {}
    for graph in GRAPHS:
        options = ort.SessionOptions()
        for name, size in serving_overrides(dims)[graph].items():
            options.add_free_dimension_override_by_name(name, size)
        made[graph] = ort.InferenceSession(str(model_dir / directory.manifest.graphs[precision][graph]), options)
    return Qwen3Decoder(made, dims["prompt"], Qwen3Shapes.from_dimensions(dims))


def test_checkpoint_exports_the_reference_model(qwen3_released_model_dir):
    """conftest's export of the released layout (`--checkpoint`, fp32 and int8): the prompt's tokens looked
    up by text, the tokenizer's files kept, and fp32 decodes the reference's tokens."""
    out = qwen3_released_model_dir
    directory = read_model_directory(out)
    assert directory.manifest.source["kind"] == "checkpoint"
    prompt = dict(directory.manifest.dimensions["prompt"])  # looked up by token text
    languages = prompt.pop("languages")  # every language: its name encoded with the checkpoint's merges
    assert len(languages) == 30 and languages["zh"] == [20, 22, 249] and languages["en"] == [20, 21, 249]
    assert languages["yue"] == [20, 23, 24, 249]  # " Cantonese" is " Cant" + "onese" here
    # the added tokens; written as nothing: the special ones (all but <asr_text>); room for a context
    assert prompt.pop("added_ids") == sorted(SPECIAL) and prompt.pop("special_ids") == sorted(set(SPECIAL) - {249})
    assert prompt.pop("context_tokens") == 128 and prompt.pop("context_at") == 3
    assert prompt == {k: CONFIG["dims"]["prompt"][k] for k in ("prefix", "suffix", "audio_token_id", "eos_token_ids")}
    assert set(directory.manifest.languages) == {"auto", *languages}
    assert [directory.tokens[i] for i in SPECIAL] == list(SPECIAL.values()) and directory.tokens[13] == "Ċ"
    assert (out / "merges.txt").read_bytes() == released_files()["merges.txt"]  # to encode hotwords
    fp32 = decoder(out, "fp32")
    for clip in CONFIG["clips"]:
        assert fp32.decode(clip_audio(clip)).tokens == REFERENCE[f"tokens_{clip}"].tolist(), clip


def test_a_checkpoint_without_the_prompt_tokens_is_refused(checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in checkpoint.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {}}))
    assert main(["qwen3-asr", "--checkpoint", str(broken), "--out", str(tmp_path / "x")]) == 1
    assert "the tokenizer lacks the prompt's tokens <|audio_end|>" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


async def test_pull_then_serve_by_name(tmp_path, monkeypatch, capsys, speech, serve_test_server):
    """The catalogue's real repository and revision, its file list swapped for the tiny files' hashes."""
    from clients.client import connect
    from pipeline.audio import SAMPLE_RATE
    from server.cli import build_parser, config_from_args

    monkeypatch.setenv("UNIPAD_HOME", str(tmp_path / "unipad"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    files = {name: MirrorFile(data, lfs=name == "model.safetensors") for name, data in released_files().items()}
    entry = dataclasses.replace(QWEN3_ASR_0_6B, files=tuple(HubFile(n, len(f.data), f.sha256) for n, f in files.items()))
    monkeypatch.setitem(catalog.MODELS, entry.name, entry)
    source = entry.source("hf")
    with HubMirror({source.repo: files}, revisions=(source.revision,)) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        code = main(["pull", entry.name, "--precision", "int8"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert hub.errors == []
    config = config_from_args(build_parser().parse_args(["--model", entry.name]))
    assert config.model == tmp_path / "unipad" / "models" / entry.name
    # an int8-only export keeps none of the fp32 graphs it was quantised from
    assert sorted(p.name for p in config.model.iterdir()) == sorted(
        ["manifest.json", "tokens.txt", "merges.txt", *GRAPH_FILES["int8"].values()])
    async with serve_test_server(config.model) as url:
        async with connect(url, sample_rate=SAMPLE_RATE) as stream:
            assert stream.ready.model == entry.name
            pcm = (speech.audio * 32767).astype(np.int16)
            for i in range(0, len(pcm), SAMPLE_RATE // 10):
                await stream.send(pcm[i:i + SAMPLE_RATE // 10])
            done = await stream.stop()
    assert done.segments == len(speech.utterances) == len(stream.finals)


def test_a_sharded_bf16_checkpoint_loads_exactly(checkpoint, tmp_path):
    """The 1.7B release's layout: bf16 weights in two shards and model.safetensors.index.json. Loaded (bf16
    into the float32 parameters, without a float32 copy of the state) into exactly the weights the same
    bf16 tensors give converted up front."""
    from safetensors.torch import save_file

    from export.qwen3_checkpoint import checkpoint_model

    state = {k: v.to(torch.bfloat16) for k, v in torch.load(FIXTURE / "model.pt", map_location="cpu",
                                                             weights_only=True).items()}
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name in ("config.json", "vocab.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    for shard, names in shards.items():
        save_file({k: state[k] for k in names}, str(tmp_path / shard))
    weight_map = {k: shard for shard, names in shards.items() for k in names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model, tokens = checkpoint_model(tmp_path)
    loaded = model.state_dict()
    assert sorted(loaded) == keys and all(loaded[k].dtype == torch.float32 for k in keys)
    assert all(torch.equal(loaded[k], state[k].float()) for k in keys)
    assert tokens == checkpoint_model(checkpoint)[1]
