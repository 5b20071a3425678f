"""Write the Paraformer peer: a model directory as `funasr_onnx.Paraformer` reads it, made by FunASR's own
export from the weights of our random model.

    /tmp/funasr-venv/bin/python -m bench.make_paraformer_peer --out /tmp/pf_peer [--size full]

Our seeded random model (export.paraformer.random_model) is loaded strictly into FunASR's Paraformer, then
exported by `funasr.utils.export_utils.export(model, type="onnx", quantize=True)`, the function
`AutoModel.export` calls: FunASR's export_meta forward (features in, CIF, decoder log-probs and token counts
out), its TorchScript export at opset 14 (the exporter its call was written for: torch 2.13 defaults to dynamo), and its own int8 recipe (quantize_dynamic of the MatMuls,
per-channel QUInt8, the output and bias_encoder/bias_decoder nodes left in float). Writes into OUT:

    model.onnx, model_quant.onnx   FunASR's fp32 export and its int8 quantisation
    am.mvn                         our model's CMVN (funasr_onnx applies it outside the graph)
    config.yaml, tokens.json       what funasr_onnx.Paraformer reads: the released frontend_conf, the tokens
    peer.json                      size, seed, dimensions, how it was made (bench/funasr_onnx_peer.py)
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

from .make_peer import peer_main

# paraformer-large's released config.yaml frontend_conf: funasr_onnx builds its WavFrontend from these
# (dither is not set there, so funasr_onnx's own default applies, as for every user of the release).
RELEASED_FRONTEND = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                     "lfr_m": 7, "lfr_n": 6}
STAGES = dict(encoder="SANMEncoder", predictor="CifPredictorV2", decoder="ParaformerSANMDecoder")


def funasr_conf(dims) -> tuple[dict, dict, dict]:
    """FunASR's encoder_conf, decoder_conf and predictor_conf for the geometry of our ParaformerDimensions
    (as a released config.yaml spells them)."""
    encoder_conf = dict(output_size=dims.output_size, attention_heads=dims.attention_heads,
                        linear_units=dims.linear_units, num_blocks=dims.num_blocks, input_layer="pe",
                        pos_enc_class="SinusoidalPositionEncoder", normalize_before=True,
                        kernel_size=dims.kernel_size, sanm_shfit=dims.sanm_shift, selfattention_layer_type="sanm")
    decoder_conf = dict(attention_heads=dims.decoder_attention_heads, linear_units=dims.decoder_linear_units,
                        num_blocks=dims.decoder_blocks, att_layer_num=dims.decoder_blocks,
                        kernel_size=dims.decoder_kernel_size, sanm_shfit=dims.decoder_sanm_shift)
    predictor_conf = dict(idim=dims.output_size, threshold=1.0, l_order=dims.predictor_l_order,
                          r_order=dims.predictor_r_order, tail_threshold=dims.tail_threshold)
    return encoder_conf, decoder_conf, predictor_conf


def funasr_model(dims):
    """FunASR's Paraformer with the geometry of our ParaformerDimensions (eval mode)."""
    from funasr.models.paraformer.model import Paraformer

    encoder_conf, decoder_conf, predictor_conf = funasr_conf(dims)
    model = Paraformer(encoder=STAGES["encoder"], encoder_conf=encoder_conf, decoder=STAGES["decoder"],
                       decoder_conf=decoder_conf, predictor=STAGES["predictor"], predictor_conf=predictor_conf,
                       ctc_weight=0.0, input_size=dims.input_size, vocab_size=dims.vocab_size)
    return model.eval()


def export_peer(size: str, seed: int, out: Path) -> dict:
    import torch
    import yaml
    from funasr.utils.export_utils import export

    from export.paraformer import random_model
    from models.frontend import write_am_mvn

    ours, tokens = random_model(size, seed)
    peer = funasr_model(ours.dims)
    missing, unexpected = peer.load_state_dict(ours.state_dict(), strict=False)
    if [k for k in missing if not k.startswith("criterion")] or unexpected:
        raise SystemExit(f"state_dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    # FunASR's export calls torch.onnx.export without `dynamo`, written for the TorchScript exporter (opset 14,
    # dynamic_axes); torch >= 2.9 would switch it to the dynamo exporter, so the call keeps the one it was made for.
    plain_export = torch.onnx.export
    torch.onnx.export = functools.partial(plain_export, dynamo=False)
    try:
        with torch.no_grad():  # AutoModel.export's call, on the model it would have built from config.yaml
            export(peer, quantize=True, type="onnx", output_dir=str(out), device="cpu",
                   init_param=str(out / "model.pt"), **STAGES)  # export reads init_param's folder eagerly
    finally:
        torch.onnx.export = plain_export
    exported = time.perf_counter() - began
    write_am_mvn(out / "am.mvn", ours.frontend.cmvn_shift.numpy(), ours.frontend.cmvn_scale.numpy())
    (out / "tokens.json").write_text(json.dumps(list(tokens), ensure_ascii=False), encoding="utf-8")
    config = {"model": "Paraformer", **STAGES, "frontend": "WavFrontend", "frontend_conf": RELEASED_FRONTEND,
              "model_conf": {"ctc_weight": 0.0, "predictor_bias": 1}}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    info = {"architecture": "paraformer", "size": size, "seed": seed, "dimensions": ours.dims.to_dict(),
            "parameters": sum(p.numel() for p in ours.state_dict().values()),
            "files": {"fp32": "model.onnx", "int8": "model_quant.onnx"}, "cmvn": "am.mvn",
            "exporter": f"funasr.utils.export_utils.export(type='onnx', quantize=True), torch {torch.__version__}",
            "quantisation": "FunASR's own: quantize_dynamic MatMul, per_channel, QUInt8, output/bias nodes in float",
            "runtime": "funasr_onnx.Paraformer (bench/funasr_onnx_peer.py)", "export_seconds": round(exported, 1)}
    (out / "peer.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    return peer_main(argv, "bench.make_paraformer_peer", __doc__, export_peer, "paraformer")


if __name__ == "__main__":
    sys.exit(main())
