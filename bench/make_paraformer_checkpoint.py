"""Write a released-size Paraformer-large checkpoint directory with random weights, built by FunASR's classes.

    /tmp/funasr-venv/bin/python -m bench.make_paraformer_checkpoint --out /tmp/pf_large [--seed S] [--layer-norms]

The layout of ModelScope's release (model.pt, config.yaml, am.mvn, tokens.json), so that
`python -m export paraformer --checkpoint OUT` reads it exactly as it reads the released model. The
weights are FunASR's own initialisation of funasr.models.paraformer.model.Paraformer at the released
geometry (models.paraformer PRESETS["full"]: 50 encoder blocks, 16 decoder blocks, vocabulary 8404), seeded;
nothing is tuned, so the checks made on it (int8 against fp32, the fp32 bound at depth: export/verify.py)
see a model that nobody shaped to pass them. With --layer-norms, the LayerNorm gains and biases are drawn
away from FunASR's 1 and 0 as the test fixtures draw them (tests/fixtures/make_parity_fixture.py): channels
of unequal scale, as a trained model has, which is what a per-tensor int8 scale handles worst. The CMVN comes from the LFR statistics of the frontend (models/frontend.py, which
matches FunASR's WavFrontend; FunASR's own needs torchaudio or kaldi-native-fbank) on tests/fixtures/three_utterances.wav (espeak-ng speech), so the encoder sees unit-scale features
as the released model does. Needs the `funasr` package (the benchmark and the exporter never import it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEECH = HERE.parent / "tests" / "fixtures" / "three_utterances.wav"
DEFAULT_SEED = 20261126


def write_checkpoint(out: Path, seed: int, layer_norms: bool = False) -> dict:
    import numpy as np
    import soundfile
    import torch
    import yaml

    from export.paraformer import FRONTEND, SUPPORTED, synthetic_tokens
    from models.frontend import Frontend, write_am_mvn
    from models.paraformer import ParaformerDimensions

    from .make_paraformer_peer import funasr_conf, funasr_model

    dims = ParaformerDimensions.preset("full")
    torch.manual_seed(seed)
    model = funasr_model(dims)
    if layer_norms:
        sys.path.insert(0, str(SPEECH.parent))
        from make_parity_fixture import randomise_layer_norms

        with torch.no_grad():
            randomise_layer_norms(model, torch.Generator().manual_seed(seed + 1))
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    encoder_conf, decoder_conf, predictor_conf = funasr_conf(dims)
    frontend_conf = dict(FRONTEND, dither=0.0)
    config = {"model": SUPPORTED["model"], "model_conf": {"ctc_weight": 0.0},
              "encoder": SUPPORTED["encoder"], "encoder_conf": encoder_conf,
              "decoder": SUPPORTED["decoder"], "decoder_conf": decoder_conf,
              "predictor": SUPPORTED["predictor"], "predictor_conf": predictor_conf,
              "input_size": dims.input_size, "frontend": "WavFrontend", "frontend_conf": frontend_conf}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (out / "tokens.json").write_text(json.dumps(synthetic_tokens(dims.vocab_size), ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    audio, _ = soundfile.read(SPEECH, dtype="float32")
    with torch.no_grad():  # the in-graph frontend, equal to FunASR's WavFrontend (tests/test_paraformer*.py)
        raw, _ = Frontend()(torch.from_numpy(audio)[None], torch.tensor([len(audio)]))
    raw = raw[0].double().numpy()
    write_am_mvn(out / "am.mvn", -raw.mean(0), 1.0 / (raw.std(0) + 1e-3))
    parameters = sum(p.numel() for p in model.parameters())
    info = {"made_by": "bench/make_paraformer_checkpoint.py", "seed": seed, "layer_norms": layer_norms,
            "parameters": parameters,
            "torch": torch.__version__, "numpy": np.__version__}
    (out / "made_by.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.make_paraformer_checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--layer-norms", action="store_true", help="randomise the LayerNorm gains and biases")
    args = parser.parse_args(argv)
    print(json.dumps(write_checkpoint(args.out, args.seed, args.layer_norms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
