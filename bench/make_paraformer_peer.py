"""Write the Paraformer peer: FunASR's own ONNX export of Paraformer, with the weights of our random model.

    /opt/funasr-venv/bin/python -m bench.make_paraformer_peer --out /tmp/pf_peer [--size full]

As bench/make_peer.py does for SenseVoice: our seeded random model (export.paraformer.random_model),
its state_dict loaded strictly into FunASR's Paraformer, exported the way `funasr.utils.export_utils._onnx`
does it (FunASR's export_meta forward: features in, CifPredictorV2Export with cif_v1_export, decoder
log-probs and token counts out; the TorchScript exporter, opset 14, dynamic batch and time axes), and the
int8 graph with our own quantisation recipe. Writes peer.onnx, peer.int8.onnx, am.mvn and peer.json
(inputs speech f32 [B, T, 560], speech_lengths i32 [B]; outputs logits [B, N, V], token_num [B]).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .make_peer import peer_main, write_peer


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
    model = Paraformer(encoder="SANMEncoder", encoder_conf=encoder_conf, decoder="ParaformerSANMDecoder",
                       decoder_conf=decoder_conf, predictor="CifPredictorV2", predictor_conf=predictor_conf,
                       ctc_weight=0.0, input_size=dims.input_size, vocab_size=dims.vocab_size)
    return model.eval()


def export_peer(size: str, seed: int, out: Path) -> dict:
    from export.paraformer import random_model

    ours, _ = random_model(size, seed)
    peer = funasr_model(ours.dims)
    missing, unexpected = peer.load_state_dict(ours.state_dict(), strict=False)
    if [k for k in missing if not k.startswith("criterion")] or unexpected:
        raise SystemExit(f"state_dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    peer = peer.export(encoder="SANMEncoder", predictor="CifPredictorV2", decoder="ParaformerSANMDecoder",
                       max_seq_len=512, type="onnx")
    return write_peer(ours, peer, out, {"architecture": "paraformer", "size": size, "seed": seed})


def main(argv: list[str] | None = None) -> int:
    return peer_main(argv, "bench.make_paraformer_peer", __doc__, export_peer, "paraformer")


if __name__ == "__main__":
    sys.exit(main())
