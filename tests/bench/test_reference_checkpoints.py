"""bench/make_sensevoice_checkpoint.py and bench/make_paraformer_checkpoint.py write released-layout
checkpoints with FunASR's own seeded initialisation, which the exporters' readers (export.<family>.
checkpoint_model, what `python -m export <family> --checkpoint` runs) load strictly (and FunASR's
AutoModel loads SenseVoice's as a download). Run at the tiny size under the Python that has FunASR
(FUNASR_PYTHON, default /tmp/funasr-venv/bin/python); skipped where it is absent."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

ROOT = Path(__file__).resolve().parents[2]
FUNASR_PYTHON = Path(os.environ.get("FUNASR_PYTHON", "/tmp/funasr-venv/bin/python"))
SPEECH = ROOT / "tests" / "fixtures" / "three_utterances.wav"
SEED = 7
SCRIPTS = {"sensevoice": "bench.make_sensevoice_checkpoint", "paraformer": "bench.make_paraformer_checkpoint"}

needs_funasr = pytest.mark.skipif(not FUNASR_PYTHON.is_file(), reason=f"no FunASR Python at {FUNASR_PYTHON}")


def make(family: str, out: Path, *options: str) -> dict:
    done = subprocess.run([str(FUNASR_PYTHON), "-m", SCRIPTS[family], "--out", str(out), "--size", "tiny",
                           "--seed", str(SEED), *options], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """family -> (made_by.json, directory) of the tiny checkpoint at SEED, made once per module."""
    made: dict[str, tuple[dict, Path]] = {}

    def get(family: str) -> tuple[dict, Path]:
        if family not in made:
            out = tmp_path_factory.mktemp(family) / "plain"
            made[family] = make(family, out), out
        return made[family]
    return get


@needs_funasr
@pytest.mark.parametrize("family", sorted(SCRIPTS))
def test_the_exporter_reads_the_reference_checkpoint_as_released(family: str, plain_checkpoint, tmp_path: Path) -> None:
    exporter = importlib.import_module(f"export.{family}")
    info, plain = plain_checkpoint(family)
    layer_norms = tmp_path / "layer_norms"
    make(family, layer_norms, "--layer-norms")

    model, tokens = exporter.checkpoint_model(plain)  # strict: every tensor of the release, no other
    assert model.dims == type(model.dims).preset("tiny")
    assert tokens == exporter.synthetic_tokens(model.dims.vocab_size)
    state = torch.load(plain / "model.pt", weights_only=True)
    assert info["parameters"] == sum(t.numel() for t in state.values()) and info["seed"] == SEED

    # The CMVN is the speech's own statistics: its normalised features are unit-scale, as a release's are.
    audio, _ = soundfile.read(SPEECH, dtype="float32")
    with torch.no_grad():
        features, _ = model.features(torch.from_numpy(audio)[None], torch.tensor([len(audio)]))
    features = features[0].double().numpy()
    assert np.abs(features.mean(0)).max() < 1e-3 and np.abs(features.std(0) - 1).max() < 0.01

    # Seeded: the same seed draws the same weights; --layer-norms moves the LayerNorms and nothing else.
    other = torch.load(layer_norms / "model.pt", weights_only=True)
    norms = {k for k in state if ("norm" in k) and not torch.equal(state[k], other[k])}
    assert norms and all(torch.equal(state[k], other[k]) for k in state if k not in norms)
    assert all(torch.equal(state[k], torch.ones_like(state[k])) for k in norms if k.endswith("weight"))


@needs_funasr
def test_the_sensevoice_checkpoint_has_the_released_files_and_tags(plain_checkpoint) -> None:
    import sentencepiece
    import yaml

    from pipeline.catalog import SENSEVOICE_SMALL

    _, directory = plain_checkpoint("sensevoice")
    assert {f.name for f in SENSEVOICE_SMALL.files} <= {p.name for p in directory.iterdir()}
    bpe = next(directory.glob("*.bpe.model"))
    processor = sentencepiece.SentencePieceProcessor(model_file=str(bpe))
    assert processor.encode("hello <|en|>")[-1] == processor.piece_to_id("<|en|>")  # a tag is one piece, as released
    assert processor.unk_id() == 0 and processor.bos_id() == 1 and processor.eos_id() == 2
    config = yaml.safe_load((directory / "config.yaml").read_text(encoding="utf-8"))
    assert config["model"] == "SenseVoiceSmall" and config["tokenizer_conf"]["bpemodel"] == bpe.name


FUNASR_LOADS = """
import json, sys, torch
from funasr import AutoModel
model = AutoModel(model=sys.argv[1], device="cpu", disable_update=True, log_level="ERROR")
saved = torch.load(sys.argv[1] + "/model.pt", weights_only=True)
print(json.dumps({"model": type(model.model).__name__, "pieces": model.kwargs["tokenizer"].get_vocab_size(),
                  "same_weights": all(torch.equal(v, saved[k]) for k, v in model.model.state_dict().items())}))
"""


@needs_funasr
def test_funasr_loads_the_sensevoice_checkpoint_as_a_download(plain_checkpoint) -> None:
    """FunASR's own AutoModel reads the directory as a ModelScope download (configuration.json's paths):
    its model, its tokenizer, the weights written."""
    _, directory = plain_checkpoint("sensevoice")
    done = subprocess.run([str(FUNASR_PYTHON), "-c", FUNASR_LOADS, str(directory)], cwd=directory,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"model": "SenseVoiceSmall", "pieces": 64, "same_weights": True}


def test_the_checkpoint_scripts_say_where_funasr_is_missing(tmp_path: Path) -> None:
    """Run by a Python without FunASR (this suite's), a script exits 2 with one error line, writing nothing."""
    if importlib.util.find_spec("funasr") is not None:
        pytest.skip("this Python has funasr")
    for family, module in SCRIPTS.items():
        done = subprocess.run([sys.executable, "-m", module, "--out", str(tmp_path / family), "--size", "tiny"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith("error: funasr is not installed"), done.stderr
        assert not (tmp_path / family).exists()
