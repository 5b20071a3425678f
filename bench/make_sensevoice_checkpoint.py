"""Write a released-size SenseVoiceSmall checkpoint directory with random weights, built by FunASR's classes.

    /tmp/funasr-venv/bin/python -m bench.make_sensevoice_checkpoint --out /tmp/sv_ckpt [--seed S] [--layer-norms]

The layout of the release (ModelScope's iic/SenseVoiceSmall, Hugging Face's FunAudioLLM/SenseVoiceSmall:
model.pt, config.yaml, am.mvn, chn_jpn_yue_eng_ko_spectok.bpe.model, configuration.json), so that `python -m export sensevoice
--checkpoint OUT` reads it exactly as it reads the released model. The weights are FunASR's own
initialisation of funasr.models.sense_voice.model.SenseVoiceSmall at the released geometry (models.sensevoice
PRESETS["full"]: 50 + 20 encoder blocks of 512, vocabulary 25055; --size tiny for the tests), seeded; nothing
is tuned, so the checks made on it (int8 against fp32, the fp32 bound at depth: export/verify.py) see a model
that nobody shaped to pass them; bench/make_peer.py, by contrast, loads OUR random weights into FunASR's
class. The sentencepiece model holds the pieces of export.sensevoice.synthetic_tokens (SenseVoice's tags at
their released ids), so the token list read back is the one `--random-init` uses. --layer-norms, the CMVN and
made_by.json: bench/reference_checkpoint.py. Needs the `funasr` package (the benchmark and the exporter never
import it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .reference_checkpoint import checkpoint_main, seeded_model, write_made_by, write_speech_cmvn

# sentencepiece piece types (sentencepiece_model.proto, ModelProto.SentencePiece.Type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
BPE = 2  # TrainerSpec.ModelType


def bpe_model(pieces: list[str]) -> bytes:
    """A sentencepiece BPE model (the released kind) whose id -> piece table is exactly `pieces`: built as a
    ModelProto, since training one to 25,055 pieces needs a corpus that large. <unk> 0, <s> 1, </s> 2 as
    released; the <|tags|> are user-defined pieces, so they encode whole."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.trainer_spec.model_type = BPE
    proto.trainer_spec.vocab_size = len(pieces)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    special = {0: UNKNOWN, 1: CONTROL, 2: CONTROL}
    for i, text in enumerate(pieces):
        kind = special.get(i, USER_DEFINED if text.startswith("<|") else NORMAL)
        proto.pieces.add(piece=text, score=0.0 if kind != NORMAL else -float(i), type=kind)
    return proto.SerializeToString()


def write_checkpoint(out: Path, seed: int, layer_norms: bool = False, size: str = "full") -> dict:
    import torch
    import yaml

    from export.paraformer import FRONTEND
    from export.sensevoice import synthetic_tokens
    from models.sensevoice import ModelDimensions
    from pipeline.catalog import SENSEVOICE_SMALL

    from .make_peer import ENCODER, funasr_encoder_conf, funasr_model

    dims = ModelDimensions.preset(size)
    model = seeded_model(lambda: funasr_model(dims), seed, layer_norms)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    bpe_name = next(f.name for f in SENSEVOICE_SMALL.files if f.name.endswith(".bpe.model"))
    config = {"encoder": ENCODER, "encoder_conf": funasr_encoder_conf(dims),
              "model": "SenseVoiceSmall", "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2,
                                                         "ignore_id": -1},
              "tokenizer": "SentencepiecesTokenizer",
              "tokenizer_conf": {"bpemodel": bpe_name, "unk_symbol": "<unk>", "split_with_space": True},
              "input_size": dims.input_size, "vocab_size": dims.vocab_size,
              "frontend": "WavFrontend", "frontend_conf": dict(FRONTEND, cmvn_file="am.mvn")}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    # ModelScope's configuration.json: where FunASR's AutoModel finds the files of a downloaded model
    configuration = {"framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
                     "pipeline": {"type": "funasr-pipeline"},
                     "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                                         "tokenizer_conf": {"bpemodel": bpe_name},
                                         "frontend_conf": {"cmvn_file": "am.mvn"}}}
    (out / "configuration.json").write_text(json.dumps(configuration, indent=2) + "\n", encoding="utf-8")
    (out / bpe_name).write_bytes(bpe_model(synthetic_tokens(dims.vocab_size)))
    write_speech_cmvn(out / "am.mvn")
    return write_made_by(out, "bench/make_sensevoice_checkpoint.py", model,
                         {"size": size, "seed": seed, "layer_norms": layer_norms})


def main(argv: list[str] | None = None) -> int:
    return checkpoint_main(argv, "bench.make_sensevoice_checkpoint", __doc__, write_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
