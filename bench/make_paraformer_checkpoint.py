"""Write a released-size Paraformer-large checkpoint directory with random weights, built by FunASR's classes.

    /tmp/funasr-venv/bin/python -m bench.make_paraformer_checkpoint --out /tmp/pf_large [--seed S] [--layer-norms]

The layout of ModelScope's release (model.pt, config.yaml, am.mvn, tokens.json), so that
`python -m export paraformer --checkpoint OUT` reads it exactly as it reads the released model. The
weights are FunASR's own initialisation of funasr.models.paraformer.model.Paraformer at the released
geometry (models.paraformer PRESETS["full"]: 50 encoder blocks, 16 decoder blocks, vocabulary 8404; --size
tiny for the tests), seeded; nothing is tuned, so the checks made on it (int8 against fp32, the fp32 bound
at depth: export/verify.py) see a model that nobody shaped to pass them. --layer-norms, the CMVN and
made_by.json: bench/reference_checkpoint.py. Needs the `funasr` package (the benchmark and the exporter
never import it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .reference_checkpoint import checkpoint_main, seeded_model, write_made_by, write_speech_cmvn


def write_checkpoint(out: Path, seed: int, layer_norms: bool = False, size: str = "full") -> dict:
    import torch
    import yaml

    from export.paraformer import FRONTEND, SUPPORTED, synthetic_tokens
    from models.paraformer import ParaformerDimensions

    from .make_paraformer_peer import funasr_conf, funasr_model

    dims = ParaformerDimensions.preset(size)
    model = seeded_model(lambda: funasr_model(dims), seed, layer_norms)
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
    write_speech_cmvn(out / "am.mvn")
    return write_made_by(out, "bench/make_paraformer_checkpoint.py", model,
                         {"size": size, "seed": seed, "layer_norms": layer_norms})


def main(argv: list[str] | None = None) -> int:
    return checkpoint_main(argv, "bench.make_paraformer_checkpoint", __doc__, write_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
