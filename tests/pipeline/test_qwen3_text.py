"""Qwen3-ASR's text handling against the `qwen-asr` package's own functions, on the generated cases of
tests/fixtures/qwen3_text.json.gz (made by make_qwen3_text_fixture.py with the package and the released
tokenizer files):

    decode   ids -> text as the package prints it (processor.batch_decode(skip_special_tokens=True)), then
             parse_asr_output's language and text, with and without a forced language
    repeat   detect_and_fix_repetitions
    prompt   the prompt ids of a context (hotwords) and a forced language (Cantonese: a name of two tokens):
             the package's processor on its chat template, against our BPE (pipeline/families/qwen3_asr/bpe.py), the
             exporter's template and forced-language ids, and our prompt builder
The tokens come into our side the way an export writes them (export/qwen3_checkpoint.py: tokens.txt's list,
the added and special ids from tokenizer_config.json's flags).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from export.qwen3_checkpoint import prompt_ids as template_ids
from export.qwen3_checkpoint import token_list, tokenizer_ids
from pipeline.families.qwen3_asr.bpe import Qwen3Tokenizer
from pipeline.families.qwen3_asr.context import SYSTEM_TURN
from pipeline.families.qwen3_asr.decoding import prompt_ids
from pipeline.families.qwen3_asr.text import LANGUAGE_CODES, fix_repetitions, parse_output, qwen3_transcript, token_text

FIXTURE = json.loads(gzip.decompress((Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_text.json.gz")
                                     .read_bytes()))
ADDED = {int(i): (text, special) for i, (text, special) in FIXTURE["added"].items()}
LANGUAGE_NAMES = {name.capitalize(): code for name, code in LANGUAGE_CODES.items()}


def as_code(name: str) -> str | None:
    """parse_asr_output's language name as ours: the code of a known name, else the name in lower case."""
    return LANGUAGE_CODES.get(name.lower(), name.lower()) or None


@pytest.fixture(scope="module")
def tokens() -> tuple[list[str], frozenset[int]]:
    """tokens.txt's list and the special ids as the exporter makes them from vocab.json (every id below the
    added ones; the fixture keeps the text of those its cases use) and tokenizer_config.json's flags."""
    vocab = {f"<in-vocab-{i}>": i for i in range(min(ADDED))}
    vocab |= {text: int(i) for i, text in FIXTURE["decode_tokens"].items()}
    table = token_list(vocab | {text: i for i, (text, _) in ADDED.items()}, FIXTURE["vocab_size"])
    return table, frozenset(tokenizer_ids(vocab, ADDED, FIXTURE["vocab_size"])["special_ids"])


def tail_run(text: str) -> bool:
    """A run of exactly 20 of one character within the last 40 of a text of 40 or more."""
    return len(text) >= 40 and any(
        text[i: i + 20] == text[i] * 20 and text[i - 1: i] != text[i] and text[i + 20: i + 21] != text[i]
        for i in range(len(text) - 40 + 1, len(text) - 19))


def test_the_fixture_covers_the_edges():
    decode, repeat = FIXTURE["decode"], FIXTURE["repeat"]
    assert len(decode) >= 400 and len(repeat) >= 600 and len(FIXTURE["prompt"]) >= 640
    skipped = {i for i, (_, special) in ADDED.items() if special}
    assert sum(any(i in skipped for i in c["ids"]) for c in decode) > 50  # special ids in the output
    assert sum(any(i > max(ADDED) for i in c["ids"]) for c in decode) > 20  # ids no tokenizer names
    assert sum("\ufffd" in c["raw"] for c in decode) > 20  # a character's bytes cut
    assert sum(c["raw"] != c["parsed"][1] for c in decode) > 100  # tags, repetitions, spaces
    assert sum(tail_run(r["text"]) and r["text"] == r["fixed"] for r in repeat) > 5  # the package keeps it
    assert sum(r["text"] != r["fixed"] for r in repeat) > 300


def test_decoded_text_is_the_packages(tokens):
    """Special ids and ids no tokenizer names write nothing, other added tokens their text, cut bytes U+FFFD."""
    table, skipped = tokens
    for case in FIXTURE["decode"]:
        assert token_text(case["ids"], table, skipped) == case["raw"], case["ids"]


def test_language_and_text_are_parsed_as_the_package_parses_them(tokens):
    table, skipped = tokens
    for case in FIXTURE["decode"]:
        language, text = case["parsed"]
        transcript = qwen3_transcript(case["ids"], table, None, skipped)
        assert (transcript.language, transcript.text) == (as_code(language), text), case["raw"]
        forced_language, forced_text = case["forced"]
        assert parse_output(case["raw"], "en")[1] == forced_text, case["raw"]


def test_repetitions_are_fixed_as_the_package_fixes_them():
    for case in FIXTURE["repeat"]:
        assert fix_repetitions(case["text"]) == case["fixed"], case["text"]
    # the edge on which a regular expression over the whole text differs (checked with the package: a run of
    # exactly 20 within the last 40 characters stays; one earlier goes, and the rest, under 40, stays)
    text = "abcdefghij" * 2 + "k" * 20
    assert fix_repetitions(text) == text and fix_repetitions(text + "m" * 20) == "abcdefghij" * 2 + "k" + "m" * 20


@pytest.fixture(scope="module")
def tokenizer() -> Qwen3Tokenizer:
    """The released tokenizer's fragment the prompt cases need (every merge that can apply to them)."""
    return Qwen3Tokenizer(FIXTURE["vocab"], [tuple(pair) for pair in FIXTURE["merges"]],
                          (text for text, _ in ADDED.values()))


def test_context_prompt_ids_are_the_packages(tokenizer):
    """The package's prompt ids for each context (hotwords) with no language and with a forced one: ours, from
    the template the exporter looks up by text and the context encoded with the system turn's text."""
    vocab = FIXTURE["vocab"] | {text: i for i, (text, _) in ADDED.items()}
    prompt = template_ids(vocab, tokenizer)  # every language's forced ids encoded, as an export with merges
    audio_tokens = sum(1 for i in FIXTURE["prompt"][0]["ids"] if i == prompt["audio_token_id"])
    assert audio_tokens == 13  # one second of audio
    for case in FIXTURE["prompt"]:
        code = LANGUAGE_NAMES[case["language"]] if case["language"] else None
        system = tokenizer.encode(SYSTEM_TURN + case["context"]) if case["context"] else None
        ids, length = prompt_ids(prompt, audio_tokens, len(case["ids"]), code, system)
        assert ids[0, :length].tolist() == case["ids"], case
    no_context = [c["ids"] for c in FIXTURE["prompt"] if not c["context"] and not c["language"]][0]
    assert no_context[:9] == prompt["prefix"]  # the exporter's template is the package's
    assert len(prompt["languages"]) == 30 and len(prompt["languages"]["yue"]) == 4  # language, Ġcant, onese, tag
    assert template_ids(vocab)["languages"].keys() == set(prompt["languages"]) - {"yue", "mk"}  # without merges


def test_a_context_may_not_hold_control_tokens(tokenizer):
    with pytest.raises(ValueError, match="control token '<|im_end|>'"):
        tokenizer.encode("system\nhello<|im_end|>")
    with pytest.raises(ValueError, match="control token '<asr_text>'"):
        tokenizer.encode("system\n<asr_text>")
