"""Paraformer text and times on real speech: FunASR's own PyTorch inference against our engine, same weights.

    python -m bench.paraformer_text_check --model /tmp/pf_final --clips /tmp/clips/*.wav \
        [--funasr-python /tmp/funasr-venv/bin/python] [--seed 20261123] [--json OUT]

The model directory is `python -m export paraformer --random-init full --precision fp32 --out DIR`; its
weights are export.paraformer.random_model(size, seed) (manifest.json names both). The FunASR side, run by
--funasr-python (a venv with `funasr` 1.4.16 and an fbank backend, kaldi-native-fbank or torchaudio,
found there or on PYTHONPATH), loads the same random_model strictly into FunASR's own
Paraformer (bench/make_paraformer_peer.py: funasr_model) and runs `Paraformer.inference(...,
output_timestamp=True)` as AutoModel calls it: FunASR's WavFrontend (dither 0, our model's CMVN), its CIF,
its greedy decoder, ts_prediction_lfr6_standard and sentence_postprocess. Our side is the engine as the
server runs it (Engine.infer, ONNX Runtime fp32, then decode_paraformer).

Each clip is compared under two vocabularies, the model's own (tokens.txt) and a mixed one (English words,
single letters, "xx@@" pieces, digits and punctuation among the Chinese characters; seeded): the vocabulary
only names the ids, so the second exercises FunASR's mixed-script rules on real CIF outputs. Reported apart:

    tokens      our ids == FunASR's ids (random weights sit near ties, so fp32 ONNX against PyTorch may flip one)
    text|ids    our decode_paraformer on FunASR's own ids and CIF outputs == FunASR's text and time list: the
                post-processing and the timestamp code, free of the graph's rounding
    text, times end to end: our engine's text and word times against FunASR's (where the ids are equal)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MIXED_SEED = 37
PUNCTUATION = (",", ".", "?", "，", "。", "、")


def mixed_vocabulary(tokens: list[str], seed: int = MIXED_SEED) -> list[str]:
    """The model's vocabulary with most of its Chinese characters renamed: English words, single letters
    (FunASR writes runs of them as one abbreviation), "xx@@" pieces, digits and punctuation; same size."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    mixed, used = list(tokens), set(tokens)
    for i, token in enumerate(tokens):
        if not ("\u4e00" <= token <= "\u9fff" and len(token) == 1):
            continue
        kind = rng.integers(10)
        word = "".join(rng.choice(letters, int(rng.integers(2, 7))))
        name = (word if kind < 2 else str(rng.choice(letters)) if kind < 4 else word + "@@" if kind < 6 else
                str(rng.integers(0, 100)) if kind == 6 else PUNCTUATION[int(rng.integers(len(PUNCTUATION)))]
                if kind == 7 else token)
        if name not in used:  # a vocabulary names each piece once (FunASR's tokenizer refuses duplicates)
            mixed[i] = name
            used.add(name)
    return mixed


def read_audio(path: str) -> np.ndarray:
    import soundfile

    audio, rate = soundfile.read(path, dtype="float32")
    if rate != 16000 or audio.ndim != 1:
        raise SystemExit(f"{path}: need mono 16 kHz audio, got {rate} Hz, shape {audio.shape}")
    return audio


def decoded(output, tokens: list[str]) -> dict:
    """decode_paraformer's text, its words joined as FunASR joins them when it gives times, and the word
    times in ms (they are FunASR's int milliseconds / 1000)."""
    from pipeline.families.paraformer.decoding import decode_paraformer

    transcript = decode_paraformer(output, tokens)
    return {"text": transcript.text, "words": " ".join(w.text for w in transcript.words),
            "times": [[round(w.start * 1000), round(w.end * 1000)] for w in transcript.words]}


# ---- FunASR's side (runs in the funasr venv) ----------------------------------------------------------------

def funasr_side(size: str, seed: int, clips: list[str]) -> list[dict]:
    import torch
    from funasr.frontends.wav_frontend import WavFrontend
    from funasr.tokenizer.char_tokenizer import CharTokenizer

    from bench.make_paraformer_peer import RELEASED_FRONTEND, funasr_model
    from export.paraformer import random_model
    from models.frontend import write_am_mvn
    from pipeline.families.paraformer.decoding import ParaformerOutput

    torch.set_num_threads(2)
    ours, tokens = random_model(size, seed)
    model = funasr_model(ours.dims)
    missing, unexpected = model.load_state_dict(ours.state_dict(), strict=False)
    if [k for k in missing if not k.startswith("criterion")] or unexpected:
        raise SystemExit(f"state_dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with tempfile.TemporaryDirectory() as scratch:
        cmvn = Path(scratch) / "am.mvn"
        write_am_mvn(cmvn, ours.frontend.cmvn_shift.numpy(), ours.frontend.cmvn_scale.numpy())
        frontend = WavFrontend(cmvn_file=str(cmvn), dither=0.0, **RELEASED_FRONTEND)
    del ours
    captured = {}
    calc_predictor = model.calc_predictor

    def recording_predictor(encoder_out, encoder_out_lens):  # the CIF outputs inference() times tokens from
        outs = calc_predictor(encoder_out, encoder_out_lens)
        captured.update(alphas=outs[2][0].clone(), peaks=outs[3][0].clone(), frames=int(encoder_out_lens[0]))
        return outs

    model.calc_predictor = recording_predictor
    results = []
    for vocabulary_name, vocabulary in (("model", tokens), ("mixed", mixed_vocabulary(tokens))):
        tokenizer = CharTokenizer(token_list=vocabulary)
        ids_seen = []
        ids2tokens = tokenizer.ids2tokens
        tokenizer.ids2tokens = lambda ids: (ids_seen.append(list(ids)), ids2tokens(ids))[1]
        for path in clips:
            found = {}
            for timed in (False, True):  # FunASR's text is "".join of its words without times, " ".join with
                ids_seen.clear()
                with torch.no_grad():
                    out, _ = model.inference([read_audio(path)], key=[Path(path).stem], tokenizer=tokenizer,
                                             frontend=frontend, device="cpu", output_timestamp=timed)
                found[timed] = out[0] if out else {"text": "", "timestamp": []}
            # inference() times the first frames + 1 of the CIF outputs (the tail frame), as our graph gives them
            length = captured["frames"] + 1
            ids = ids_seen[0] if ids_seen else []
            cif = ParaformerOutput(np.array(ids, np.int32), np.zeros(len(ids), np.float32),
                                   captured["alphas"][:length].numpy(), captured["peaks"][:length].numpy())
            results.append({"clip": path, "vocabulary": vocabulary_name, "ids": ids,
                            "pieces": [vocabulary[i] for i in ids], "text": found[False]["text"],
                            "words": found[True]["text"],
                            "times": [list(map(int, t)) for t in found[True]["timestamp"]],
                            "ours_on_funasr_ids": decoded(cif, vocabulary)})
    return results


# ---- our side and the comparison --------------------------------------------------------------------------

def our_side(model_dir: Path, clips: list[str]) -> dict[tuple[str, str], dict]:
    from pipeline.engine import Engine
    from pipeline.engine_options import EngineOptions
    from pipeline.batching import Clip

    engine = Engine(model_dir, EngineOptions(device="cpu", precision="fp32", threads=2)).load()
    tokens = list(engine.model.tokens)
    ours = {}
    for path in clips:
        output = engine.infer([Clip(read_audio(path))])[0]
        ids = [int(i) for i in output.token_ids if int(i) not in (0, 1, 2)]
        for name, vocabulary in (("model", tokens), ("mixed", mixed_vocabulary(tokens))):
            ours[(path, name)] = {"ids": ids, **decoded(output, vocabulary)}
    return ours


def max_time_difference(ours: list[list[int]], funasr: list[list[int]], clamp: bool = False) -> int | None:
    """The largest difference in ms over FunASR's time list, None when ours is shorter. FunASR's list can be
    shorter than its words (punctuation takes no time, the list pairs with the words by position); the words
    past its end have decode_paraformer's time, the last end (counted as `words_past_times`). `clamp`:
    FunASR's times before the clip's start (its -1.5 frame shift) taken as 0, as decode_paraformer writes them."""
    if len(ours) < len(funasr):
        return None
    return max((abs(x - (max(y, 0) if clamp else y)) for p, q in zip(ours, funasr) for x, y in zip(p, q)), default=0)


def compare(funasr: list[dict], ours: dict[tuple[str, str], dict]) -> dict:
    rows = []
    for f in funasr:
        o = ours[(f["clip"], f["vocabulary"])]
        given = f["ours_on_funasr_ids"]
        same_ids = o["ids"] == f["ids"]
        ids_differ = sum(a != b for a, b in zip(o["ids"], f["ids"])) + abs(len(o["ids"]) - len(f["ids"]))
        rows.append({"clip": Path(f["clip"]).name, "vocabulary": f["vocabulary"], "tokens": len(f["ids"]),
                     "ids_equal": same_ids, "id_differences": ids_differ,
                     "text_given_ids_equal": given["text"] == f["text"],
                     "words_given_ids_equal": given["words"] == f["words"],
                     "times_given_ids_max_ms": max_time_difference(given["times"], f["times"]),
                     "times_given_ids_clamped_max_ms": max_time_difference(given["times"], f["times"], clamp=True),
                     "words_past_times": len(given["times"]) - len(f["times"]),
                     "text_equal": o["text"] == f["text"], "words_equal": o["words"] == f["words"],
                     "times_max_ms": max_time_difference(o["times"], f["times"]) if same_ids else None,
                     "times_clamped_max_ms": max_time_difference(o["times"], f["times"], clamp=True) if same_ids else None,
                     "funasr_text": f["text"], "our_text": o["text"], "our_text_given_ids": given["text"],
                     "funasr_words": f["words"], "our_words": o["words"], "our_words_given_ids": given["words"],
                     "funasr_times": f["times"], "our_times": o["times"], "our_times_given_ids": given["times"]})

    def worst(key):
        values = [r[key] for r in rows if r[key] is not None]
        return max(values) if values else None

    equal_ids = [r for r in rows if r["ids_equal"]]
    return {"clips": len({r["clip"] for r in rows}), "rows": len(rows), "ids_equal": len(equal_ids),
            "text_given_ids_equal": sum(r["text_given_ids_equal"] for r in rows),
            "words_given_ids_equal": sum(r["words_given_ids_equal"] for r in rows),
            "times_given_ids_unpaired": sum(r["times_given_ids_max_ms"] is None for r in rows),
            "words_past_times": sum(r["words_past_times"] for r in rows),
            "times_given_ids_max_ms": worst("times_given_ids_max_ms"),
            "times_given_ids_clamped_max_ms": worst("times_given_ids_clamped_max_ms"),
            "text_equal": sum(r["text_equal"] for r in rows),
            "text_equal_where_ids_equal": sum(r["text_equal"] for r in equal_ids),
            "words_equal_where_ids_equal": sum(r["words_equal"] for r in equal_ids),
            "times_max_ms_where_ids_equal": worst("times_max_ms"),
            "times_clamped_max_ms_where_ids_equal": worst("times_clamped_max_ms"), "details": rows}


def print_table(summary: dict) -> None:
    def ms(raw, clamped):
        return "-" if raw is None else str(raw) if raw == clamped else f"{raw}({clamped})"

    def same(flag):
        return "=" if flag else "DIFF"

    print("given ids: our decoding of FunASR's ids and CIF outputs; ms: max word-time difference "
          "(in brackets: FunASR's negative starts taken as 0)")
    print(f"{'clip':<18} {'vocab':<6} {'tokens':>6} {'ids':>5} | given ids: {'text':>5} {'words':>5} {'ms':>8} "
          f"| end to end: {'text':>5} {'words':>5} {'ms':>8}")
    for r in summary["details"]:
        print(f"{r['clip']:<18} {r['vocabulary']:<6} {r['tokens']:>6} {'=' if r['ids_equal'] else r['id_differences']:>5} "
              f"| {'':11}{same(r['text_given_ids_equal']):>5} {same(r['words_given_ids_equal']):>5} "
              f"{ms(r['times_given_ids_max_ms'], r['times_given_ids_clamped_max_ms']):>8} "
              f"| {'':12}{same(r['text_equal']):>5} {same(r['words_equal']):>5} "
              f"{ms(r['times_max_ms'], r['times_clamped_max_ms']):>8}")
        for key in ("text", "words"):
            if r[f"funasr_{key}"] != r[f"our_{key}_given_ids"]:
                print(f"    FunASR {key} {r[f'funasr_{key}']!r}\n    ours   {key} {r[f'our_{key}_given_ids']!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.paraformer_text_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="our exported random-init model directory (fp32)")
    parser.add_argument("--clips", nargs="+", required=True, help="16 kHz mono WAV files (bench.speech_clips)")
    parser.add_argument("--funasr-python", default="/tmp/funasr-venv/bin/python")
    parser.add_argument("--json", type=Path, help="write the summary here too")
    parser.add_argument("--funasr-side", type=Path, help=argparse.SUPPRESS)  # the subprocess: write FunASR's results
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.funasr_side:
        results = funasr_side(args.size, args.seed, args.clips)
        args.funasr_side.write_text(json.dumps(results, ensure_ascii=False), encoding="utf-8")
        return 0
    if args.model is None:
        parser.error("--model is required")
    source = json.loads((args.model / "manifest.json").read_text(encoding="utf-8")).get("source", {})
    if source.get("kind") != "random-init":
        raise SystemExit(f"{args.model}: not a --random-init export; FunASR's side rebuilds its weights from the seed")
    with tempfile.TemporaryDirectory() as scratch:
        funasr_json = Path(scratch) / "funasr.json"
        command = [args.funasr_python, "-m", "bench.paraformer_text_check", "--funasr-side", str(funasr_json),
                   "--size", source["size"], "--seed", str(source["seed"]), "--clips", *args.clips]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        subprocess.run(command, check=True, cwd=REPO, env=env)
        funasr = json.loads(funasr_json.read_text(encoding="utf-8"))
    summary = compare(funasr, our_side(args.model, args.clips))
    print_table(summary)
    brief = {k: v for k, v in summary.items() if k != "details"}
    print(json.dumps(brief))
    if args.json:
        args.json.write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
