"""`python -m bench paraformer` times the serving path: the engine as the server builds it, both stages, every
decoder shape warmed (FunASR's own tiny Paraformer, conftest's `paraformer_model_dir`), and with --punc what
punctuating a final adds (FunASR's tiny ct-punc, `ct_punc_model_dir`)."""
from __future__ import annotations

import json

from bench.cli import main
from pipeline.audio import encoder_frames, seconds_to_samples
from pipeline.shapes import DEFAULT_CPU_TOKEN_CONTAINERS, token_containers


def test_the_paraformer_bench_times_the_serving_path(paraformer_model_dir, capsys) -> None:
    argv = ["paraformer", str(paraformer_model_dir), "--precision", "int8", "--lengths", "0.5,3",
            "--containers", "1,4", "--repeats", "1"]
    assert main(argv) == 0
    part = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["precisions"]["int8"]
    frames = [encoder_frames(seconds_to_samples(c)) for c in (1.0, 4.0)]
    assert part["decoder_shapes"] == sum(len(token_containers(f, DEFAULT_CPU_TOKEN_CONTAINERS)) for f in frames)
    assert part["unwarmed_calls"] == 0 and set(part["ours"]) == {"0.5", "3"} and part["tokens"]["3"] > 0


def test_the_paraformer_bench_times_what_punctuation_adds(paraformer_model_dir, ct_punc_model_dir, capsys) -> None:
    """--punc: a final, and the punctuation of its transcript and of a text of 5 words a second."""
    argv = ["paraformer", str(paraformer_model_dir), "--precision", "int8", "--lengths", "2", "--repeats", "1",
            "--punc", str(ct_punc_model_dir)]
    assert main(argv) == 0
    punctuation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["precisions"]["int8"]["punctuation"]
    assert punctuation["model"] == "ct-punc" and punctuation["precision"] == "fp32"
    assert punctuation["text_words"]["2"] == 10 and punctuation["words"]["2"] > 0
    assert punctuation["final"]["2"]["median"] > 0 and punctuation["punc_share"]["2"] > 0


def test_the_int8_ab_bench_times_two_exports_alike(paraformer_model_dir, capsys) -> None:
    """bench.int8_ab on one export twice: both sides timed, the same tokens (it fed untimed calls to
    `interleaved`, which takes (wall, CPU) pairs, and stopped with a ValueError)."""
    from bench.int8_ab import main as int8_ab

    model = str(paraformer_model_dir)
    assert int8_ab([model, model, "--lengths", "1", "--repeats", "2", "--token-containers", ""]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["before_s"]["1"] > 0 and result["after_s"]["1"] > 0 and result["ratio"]["1"] > 0
    assert result["tokens"]["1"][0] == result["tokens"]["1"][1] > 0
