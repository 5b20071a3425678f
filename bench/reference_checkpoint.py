"""What every released-layout random checkpoint script shares (bench/make_paraformer_checkpoint.py,
bench/make_sensevoice_checkpoint.py; bench/make_qwen3_checkpoint.py takes the seed and made_by.json): FunASR's own seeded initialisation, optionally LayerNorms drawn away
from 1 and 0, the CMVN from the frontend's statistics on real speech, made_by.json, and the command line.

The CMVN comes from the LFR statistics of the frontend (models/frontend.py, which matches FunASR's
WavFrontend; FunASR's own needs torchaudio or kaldi-native-fbank) on tests/fixtures/three_utterances.wav
(espeak-ng speech), so the encoder sees unit-scale features as a released model's does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
SPEECH = FIXTURES / "three_utterances.wav"
DEFAULT_SEED = 20261126
SIZES = ("full", "tiny")  # the models' PRESETS both families have: the released geometry, and the tests'


def seeded_model(build, seed: int, layer_norms: bool):
    """`build()` under torch.manual_seed(seed): the reference's own initialisation, nothing tuned. With
    `layer_norms`, LayerNorm gains and biases drawn as the test fixtures draw them (tests/fixtures/
    make_parity_fixture.py): channels of unequal scale, as a trained model has, which is what a per-tensor
    int8 scale handles worst."""
    import torch

    torch.manual_seed(seed)
    model = build()
    if layer_norms:
        sys.path.insert(0, str(FIXTURES))
        from make_parity_fixture import randomise_layer_norms

        with torch.no_grad():
            randomise_layer_norms(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()


def write_speech_cmvn(path: Path) -> None:
    """am.mvn from the raw LFR features of SPEECH: shift -mean, scale 1 / (std + 1e-3)."""
    import soundfile
    import torch

    from models.frontend import Frontend, write_am_mvn

    audio, _ = soundfile.read(SPEECH, dtype="float32")
    with torch.no_grad():  # the in-graph frontend, equal to FunASR's WavFrontend (tests/test_paraformer*.py)
        raw, _ = Frontend()(torch.from_numpy(audio)[None], torch.tensor([len(audio)]))
    raw = raw[0].double().numpy()
    write_am_mvn(path, -raw.mean(0), 1.0 / (raw.std(0) + 1e-3))


def write_made_by(out: Path, script: str, model, info: dict) -> dict:
    """made_by.json: the script, its settings (`info`), the parameter count and the library versions."""
    import numpy as np
    import torch

    info = {"made_by": script, **info, "parameters": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "numpy": np.__version__}
    (out / "made_by.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def checkpoint_main(argv: list[str] | None, prog: str, doc: str, write_checkpoint) -> int:
    """The command line of a checkpoint script: write_checkpoint(out, seed, layer_norms, size), under a
    Python that has funasr; prints made_by.json's contents."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--size", default="full", choices=SIZES, help="the model's preset (default: full, the released)")
    parser.add_argument("--layer-norms", action="store_true", help="randomise the LayerNorm gains and biases")
    args = parser.parse_args(argv)
    try:
        import funasr  # noqa: F401
    except ModuleNotFoundError:
        print("error: funasr is not installed in this Python (use /tmp/funasr-venv/bin/python)", file=sys.stderr)
        return 2
    print(json.dumps(write_checkpoint(args.out, args.seed, args.layer_norms, args.size)))
    return 0
