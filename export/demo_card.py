"""The demo model's card (models/demo/README.md), written from the manifest and the measured results."""
from __future__ import annotations

from pathlib import Path

from pipeline.catalog import SENSEVOICE_SMALL, pull_command

from . import synth
from .evaluate import format_groups

# What to run for real speech, as the notice and the card say it: pull the released model, serve it by name.
REAL_SPEECH = (pull_command(SENSEVOICE_SMALL.name), f"python -m server --model {SENSEVOICE_SMALL.name}")
REAL_SPEECH_INSTALL = "pip install -e '.[export]'"  # PyTorch etc., for the one-time export


def demo_notice() -> str:
    """The demo manifest's `notice`: the one line the page and the server's log show with the model's name."""
    return (f"A demo model for synthetic speech: it knows only {len(synth.VOCABULARY)} English words (digits and "
            f"commands such as \"{synth.PHRASES[3]}\"), so natural speech gives empty or wrong text. For real "
            f"speech: {REAL_SPEECH[0]}, then {REAL_SPEECH[1]} (README: \"Serving the real SenseVoiceSmall\").")


def real_speech_block() -> str:
    """The card's commands for real speech (a fenced block): install the export tools, pull, serve."""
    return "\n".join(["```bash", REAL_SPEECH_INSTALL, *REAL_SPEECH, "```"])


def write_model_card(path: Path, manifest, tokens: list[str], results, history: list[dict]) -> None:
    """Markdown: what the model recognises, how it was made, its held-out WER, and what it is not."""
    source = manifest.source
    training = source.get("training", {})
    options = training.get("options", {})
    dims = manifest.dimensions
    rows = "\n".join(
        f"| {r.precision} | {r.wer:.2%} ({r.word_errors}/{r.words}) | {r.sentence_accuracy:.2%} | {r.utterances} |"
        for r in results
    )
    mistakes = "\n".join(f"- `{ref}` -> `{hyp}`" for ref, hyp in results[0].examples[:8]) or "- none"
    curve = ", ".join(f"{h['heldout_wer']:.1%} at step {h['step']}" for h in history) or "not recorded"
    phrases = ", ".join(f'"{p}"' for p in synth.PHRASES)
    by_voice = format_groups(results[0].groups) or "not measured"
    recipe = synth.Recipe()
    long_silence = source.get("recipe", {}).get("long_silence_probability", 0.0)
    recipe_notes = (f"\n  {long_silence:.0%} of the training speech gets a long lead, trail or both "
                    f"({recipe.long_silence[0]:g}-{recipe.long_silence[1]:g} s of silence), so that "
                    "silence around a word decodes to nothing." if long_silence else "")
    room_noise = source.get("recipe", {}).get("room_noise_probability", 0.0)
    round_trip = source.get("recipe", {}).get("round_trip_probability", 0.0)
    recipe_notes += (f"\n  {room_noise:.0%} of the training speech lies under quiet room noise "
                     f"({', '.join(synth.ROOM_NOISE_KINDS)}; {recipe.room_noise_dbfs[0]:g} to "
                     f"{recipe.room_noise_dbfs[1]:g} dBFS, lead and trail included)." if room_noise else "")
    recipe_notes += (f"\n  {round_trip:.0%} of the training utterances went through {synth.CLIENT_RATE // 1000} kHz "
                     "and back, as a Realtime client's audio does." if round_trip else "")
    text = f"""# Unipad demo model: English digits and commands (synthetic speech)

**A demonstration model for synthetic speech, not for human voices.** It was trained only on espeak-ng
speech, so it shows that the whole server works (audio in, text and tags out) without downloading
anything; on a real microphone it will mostly produce wrong or empty text. For real speech, pull the
released SenseVoiceSmall (downloaded, exported, verified and cached once) and serve it by name instead:

{real_speech_block()}

(README: "Serving the real SenseVoiceSmall" has the details: mirrors, ModelScope, precisions.)

## What it recognises
{len(synth.VOCABULARY)} English words, each one token (`▁word`, written the SentencePiece way), in any
order, 1-{synth.Recipe().max_words} words per utterance:
- digits: {", ".join(synth.DIGITS)}
- commands: {", ".join(synth.COMMANDS)}
- short phrases: {phrases}

Like SenseVoiceSmall it first emits four tags, `<|en|><|NEUTRAL|><|Speech|><|woitn|>` (`<|withitn|>`
when ITN is requested; it has no ITN, the words are the same), so decoding follows the real model's path.
Vocabulary: {len(tokens)} tokens (`tokens.txt`: blank, the words, the tags).

## Measured accuracy (held-out)
{source.get("heldout", {}) and "Through `pipeline.engine.Engine` (CPU, container padding), language auto:"}

| precision | WER | sentence accuracy | utterances |
|---|---|---|---|
{rows}

The held-out set uses espeak-ng voice variants never heard in training
({", ".join(synth.HELDOUT_VARIANTS)}, with every accent) and word sequences absent from the training
texts, with the training augmentation except rooms (echo, reverberation), which only training hears.
WER by held-out voice variant (fp32, worst first): {by_voice}.

Greedy WER on 300 other held-out utterances during training
(torch): {curve}.

First mistakes (fp32):
{mistakes}

Limits: one utterance at a time (as the server's segmenter delivers them); pauses of a second or more
inside one clip were never heard in training and produce spurious words.

Re-measure: `python -m export eval models/demo` (needs espeak-ng) or
`python -m export eval models/demo --data tests/fixtures/demo`.

## How it was made
`{source.get("command", "python -m export train-demo")}` (seed {source.get("seed")}), in about
{source.get("total_minutes", "?")} minutes on 2 CPU cores (data {training.get("data_seconds", "?")} s,
training {training.get("train_seconds", "?")} s, {training.get("steps", "?")} steps).
- Data: {source.get("utterances")} utterances from espeak-ng, {len(synth.VOICE_BASES)} English accents
  ({", ".join(synth.VOICE_BASES)}) x {len(synth.TRAIN_VARIANTS)} voice variants, random speaking rate,
  pitch and word gap; speed perturbation, spectral tilt, gain, leading/trailing silence, white noise
  (15-40 dB SNR on 60 % of utterances); 5 % of the utterances are white, pink or brown noise alone
  (-60 to -5 dBFS, empty transcript) so that noisy segments decode to no words; rooms: a feedback echo
  ({recipe.echo_delay[0] * 1000:g}-{recipe.echo_delay[1] * 1000:g} ms, on {recipe.echo_probability:.0%} of the speech) or a
  synthetic reverberation tail (RT60 {recipe.rt60[0]:g}-{recipe.rt60[1]:g} s, on {recipe.reverb_probability:.0%}); mel-axis warping and
  small frequency/time masks while training.{recipe_notes}
  The full recipe is in `manifest.json` (`source`).
- Model: the project's SenseVoice definition (SAN-M encoder, in-graph fbank + LFR + CMVN),
  d={dims.get("output_size")}, {dims.get("attention_heads")} heads, FFN {dims.get("linear_units")},
  {dims.get("num_blocks")} + {dims.get("tp_blocks")} layers; CMVN (`am.mvn` equivalent) from the training
  features; CTC on the 4 tags + word tokens; AdamW (peak learning rate {options.get("peak_lr", "?")}),
  warmup and cosine decay; {training.get("precision", "fp32")} matrix products (autocast; the weights stay fp32).
- Exported with the normal export path (`export/onnx_export.py`): `model.onnx` (fp32) and
  `model.int8.onnx` (dynamic int8 MatMul, 7-bit weights).
"""
    path.write_text(text, encoding="utf-8")
