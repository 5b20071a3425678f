"""Write the peer: FunASR's own ONNX export of SenseVoiceSmall, with the weights of our random model.

    /opt/funasr-venv/bin/python -m bench.make_peer --out /tmp/sv_peer [--size full] [--seed S]

Runs only under a Python that has the `funasr` package (the benchmark itself never imports it). It builds
our seeded random model (export.sensevoice.random_model(size, seed)), loads its state_dict strictly into
FunASR's SenseVoiceSmall, and exports it the way `funasr.utils.export_utils._onnx` does: FunASR's
export_meta forward (features in, prompts prepended, raw CTC logits out), the TorchScript exporter,
opset 14, dynamic batch and time axes. Then the int8 graph with our own recipe (export.onnx_export.
quantize_int8), so that only the graph differs, not the quantisation. Writes into OUT:

    peer.onnx, peer.int8.onnx   inputs speech f32 [B, T, 560], speech_lengths i32 [B], language i32 [B],
                                textnorm i32 [B]; outputs ctc_logits [B, T + 4, V], encoder_out_lens [B]
    am.mvn                      our model's CMVN in Kaldi text form (the peer applies it outside the graph)
    peer.json                   size, seed, dimensions, parameter count, how it was made
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path


ENCODER = "SenseVoiceEncoderSmall"  # FunASR's class name, as the released config.yaml spells it


def funasr_encoder_conf(dims) -> dict:
    """FunASR's encoder_conf for the geometry of our ModelDimensions (as the released config.yaml spells it)."""
    return dict(
        output_size=dims.output_size, attention_heads=dims.attention_heads, linear_units=dims.linear_units,
        num_blocks=dims.num_blocks, tp_blocks=dims.tp_blocks, dropout_rate=0.1, positional_dropout_rate=0.1,
        attention_dropout_rate=0.1, input_layer="pe", pos_enc_class="SinusoidalPositionEncoder",
        normalize_before=True, kernel_size=dims.kernel_size, sanm_shfit=dims.sanm_shift,
        selfattention_layer_type="sanm",
    )


def funasr_model(dims):
    """FunASR's SenseVoiceSmall with the geometry of our ModelDimensions (eval mode, random weights)."""
    from funasr.models.sense_voice.model import SenseVoiceSmall

    model = SenseVoiceSmall(encoder=ENCODER, encoder_conf=funasr_encoder_conf(dims),
                            input_size=dims.input_size, vocab_size=dims.vocab_size)
    return model.eval()


def export_peer(size: str, seed: int, out: Path) -> dict:
    from export.sensevoice import random_model

    ours, _ = random_model(size, seed)
    peer = funasr_model(ours.dims)
    state = ours.state_dict()
    missing, unexpected = peer.load_state_dict(state, strict=False)
    # FunASR's model may hold extra non-weight modules (loss criteria); every tensor of ours must land.
    if [k for k in missing if k in peer.state_dict() and not k.startswith("criterion")] or unexpected:
        raise SystemExit(f"state_dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    peer = peer.export(max_seq_len=512)  # FunASR's export_rebuild_model: the export_meta forward
    return write_peer(ours, peer, out, {"size": size, "seed": seed})


def write_peer(ours, peer, out: Path, info: dict) -> dict:
    """Export FunASR's `peer` (its export_meta forward) as FunASR does, quantise it with our recipe, and
    write OUT's files (module docstring); `info` starts peer.json. Shared by every family's peer script."""
    import torch

    from export.onnx_export import quantize_int8
    from models.frontend import write_am_mvn

    out.mkdir(parents=True, exist_ok=True)
    write_am_mvn(out / "am.mvn", ours.frontend.cmvn_shift.numpy(), ours.frontend.cmvn_scale.numpy())
    path = out / "peer.onnx"
    began = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            peer, peer.export_dummy_inputs(), str(path), do_constant_folding=True, opset_version=14,
            input_names=peer.export_input_names(), output_names=peer.export_output_names(),
            dynamic_axes=peer.export_dynamic_axes(), dynamo=False,
        )
    exported = time.perf_counter() - began
    quantize_int8(path, out / "peer.int8.onnx")
    info = {
        **info, "dimensions": ours.dims.to_dict(),
        "parameters": sum(p.numel() for p in ours.state_dict().values()),
        "files": {"fp32": "peer.onnx", "int8": "peer.int8.onnx"}, "cmvn": "am.mvn",
        "exporter": f"torch {torch.__version__} torch.onnx.export(dynamo=False, opset 14) of FunASR export_meta",
        "quantisation": "export.onnx_export.quantize_int8 (same recipe as ours)",
        "export_seconds": round(exported, 1),
    }
    (out / "peer.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    return peer_main(argv, "bench.make_peer", __doc__, export_peer, "sensevoice")


def peer_main(argv: list[str] | None, prog: str, doc: str, export_peer, export_module: str) -> int:
    """The command line of a peer script: `export_peer(size, seed, out)` under a Python with funasr."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--seed", type=int, default=None, help=f"default: export/{export_module}.py's DEFAULT_SEED")
    args = parser.parse_args(argv)
    try:
        import funasr  # noqa: F401
    except ModuleNotFoundError:
        print("error: funasr is not installed in this Python (use /opt/funasr-venv/bin/python)", file=sys.stderr)
        return 2
    default_seed = importlib.import_module(f"export.{export_module}").DEFAULT_SEED
    info = export_peer(args.size, default_seed if args.seed is None else args.seed, args.out)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
