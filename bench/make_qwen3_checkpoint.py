"""Write a released-size Qwen3-ASR checkpoint directory with random weights, built by the `qwen-asr` package's class.

    PYTHONPATH=$PWD /opt/qwen-venv/bin/python -m bench.make_qwen3_checkpoint --out /tmp/q3_ref06 [--size 0.6b] [--seed S]

The layout Qwen releases Qwen3-ASR-0.6B in (config.json with a thinker_config, model.safetensors in bf16 with
`thinker.*` keys, vocab.json, tokenizer_config.json's added tokens), so that `python -m export qwen3-asr
--checkpoint OUT` reads it exactly as it reads the released model. The weights are the package's own
initialisation of Qwen3ASRForConditionalGeneration at the released geometry (transformers' `_init_weights`:
every Linear, Conv and Embedding ~ N(0, initializer_range = 0.02), biases 0, norms 1), seeded; nothing is
tuned, so the checks made on it (int8 against fp32 in `export verify`, issue 40) see a model nobody shaped to
pass them. `python -m export qwen3-asr --random-init` draws harder weights of its own (norm gains and biases
spread, export/qwen3_asr.py): both are measured in docs/benchmarks.md.

No tokenizer can be downloaded here: vocab.json names every id `<|tok{i}|>` except the chat template's
tokens, at the released ids, and a one-token name per forced language (export/qwen3_asr.py's
synthetic_tokens), so the prompt is the released model's. No merges.txt: no hotwords on such a model.
Needs the `qwen-asr` package (the exporter and the server never import it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .reference_checkpoint import DEFAULT_SEED, FIXTURES, write_made_by

SIZES = ("tiny", "0.6b", "1.7b")  # models/qwen3_asr.py's presets


def reference_model(size: str, seed: int):
    """The package's Qwen3ASRForConditionalGeneration at `size`, with its own seeded initialisation."""
    import torch
    from qwen_asr.core.transformers_backend import Qwen3ASRForConditionalGeneration

    from export.qwen3_asr import synthetic_dimensions

    sys.path.insert(0, str(FIXTURES))
    from make_qwen3_fixture import reference_config

    dims = synthetic_dimensions(size)
    config = reference_config(dims)
    torch.manual_seed(seed)
    return Qwen3ASRForConditionalGeneration(config).eval(), dims, config


def write_checkpoint(out: Path, size: str, seed: int) -> dict:
    import torch
    from safetensors.torch import save_file

    from export.qwen3_asr import synthetic_tokens
    from export.qwen3_checkpoint import PROMPT_PREFIX, PROMPT_SUFFIX

    model, dims, config = reference_model(size, seed)
    tokens = synthetic_tokens(dims)
    for ids, texts in ((dims.prompt.prefix, PROMPT_PREFIX), (dims.prompt.suffix, PROMPT_SUFFIX)):
        for i, text in zip(ids, texts):
            tokens[i] = text
    # the added tokens: the template's <|...|> ones and <asr_text> (synthetic ids <|tok{i}|> are vocabulary)
    added = {i: text for i, text in enumerate(tokens)
             if text == "<asr_text>" or (text.startswith("<|") and not text.startswith("<|tok"))}
    vocab = {text: i for i, text in enumerate(tokens) if i not in added}

    out.mkdir(parents=True, exist_ok=True)
    thinker = config.thinker_config
    released = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
                "thinker_config": {"audio_config": thinker.audio_config.to_dict(),
                                   "text_config": thinker.text_config.to_dict(),
                                   "audio_token_id": dims.prompt.audio_token_id}}
    (out / "config.json").write_text(json.dumps(released, indent=1), encoding="utf-8")
    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}
    if thinker.text_config.tie_word_embeddings:  # safetensors refuses shared storage
        state.pop("thinker.lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    decoder = {str(i): {"content": text, "special": text != "<asr_text>"} for i, text in sorted(added.items())}
    (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}), encoding="utf-8")
    return write_made_by(out, "bench/make_qwen3_checkpoint.py", model, {"size": size, "seed": seed})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.make_qwen3_checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    parser.add_argument("--size", default="0.6b", choices=SIZES)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    try:
        import qwen_asr  # noqa: F401
    except ModuleNotFoundError:
        print("error: qwen-asr is not installed in this Python (use /opt/qwen-venv/bin/python)", file=sys.stderr)
        return 2
    print(json.dumps(write_checkpoint(args.out, args.size, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
