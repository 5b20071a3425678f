"""`python -m export paraformer` and `verify` on Paraformer directories.

conftest's `paraformer_model_dir` is FunASR's own tiny Paraformer (tests/fixtures/paraformer, laid out as
a released directory: model.pt, config.yaml, am.mvn, tokens.json) exported by the real command in fp32
and int8. Its graphs must pass verify (padding invariance, no forbidden operator, static shapes) and give
FunASR's tokens, log-probs and text in a container; bad inputs end in one `error:` line, a non-zero exit
and no directory. The random-init path is the same code with other weights (`--random-init tiny` runs in
the slow test).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import yaml

from export.__main__ import main
from export.verify import FP16_MAX_SCALED_ERR
from export.verify_paraformer import Stages, compare, decode, near_ties, run_encoder
from pipeline.audio import seconds_to_samples
from pipeline.engine import Engine
from pipeline.errors import ModelLoadError
from pipeline.modeldir import read_model_directory
from pipeline.families.paraformer.decoding import ParaformerOutput, decode_paraformer
from pipeline.shapes import DEFAULT_CPU_TOKEN_CONTAINERS
from server.cli import main as cli_main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paraformer"
CONFIG = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
REFERENCE = np.load(FIXTURE / "reference.npz")
LOGPROB_TOL = 1e-4


def fail(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


def released_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "released"
    shutil.copytree(FIXTURE, copy)
    return copy


def test_manifest_and_tokens(paraformer_model_dir: Path) -> None:
    directory = read_model_directory(paraformer_model_dir)
    assert directory.manifest.architecture == "paraformer"
    assert sorted(directory.manifest.files) == ["fp32", "int8"]
    assert list(directory.tokens) == json.loads((FIXTURE / "tokens.json").read_text(encoding="utf-8"))


def test_verify_passes(paraformer_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["verify", str(paraformer_model_dir), "--lengths", "1,3,7.5"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["passed"] and report["tokens_equal"] and report["static_shapes"]
    assert report["forbidden_ops"] == [] and report["max_abs_err"] <= 4e-6
    assert all(r["max_abs_err"] == 0 for r in report["precisions"]["int8"].values())  # int8: bit-identical
    # The 8 s container's decoder runs on the CPU's token containers up to 128, or 134 (its frames + 1) rows;
    # every one that holds a clip's count is compared with the decoder alone, int8 identical across them.
    for results in report["precisions"].values():
        for result in results.values():
            served = [int(k) for k in result["token_containers"]]
            assert served == [k for k in DEFAULT_CPU_TOKEN_CONTAINERS[:17] + (134,) if k >= result["tokens"]]
            assert result["token_containers_identical"]


def test_only_near_ties_may_turn_in_fp16() -> None:
    """verify's fp16 rule: a token picked otherwise in the container than alone passes only when both picks'
    log-probs lie within the bound (a near-tie that rounding broke); fp32 and int8 (bound 0) allow none."""
    def output(ids, logprobs):
        return ParaformerOutput(np.array(ids, np.int32), np.array(logprobs, np.float32), np.zeros(3), np.zeros(3))

    alone = output([5, 7, 9], [-3.0, -3.2416, -2.0])
    assert near_ties(alone, output([5, 7, 9], [-3.0, -3.2416, -2.0]), 0.0) == 0
    assert near_ties(alone, output([5, 8, 9], [-3.0, -3.2423, -2.0]), 5e-3) == 1  # the tiny model's flip at 29 s
    assert near_ties(alone, output([5, 8, 9], [-3.0, -3.2423, -2.0]), 0.0) is None
    assert near_ties(alone, output([5, 8, 9], [-3.0, -3.4, -2.0]), 5e-3) is None  # a lead of 0.16: no tie
    assert near_ties(alone, output([5, 7], [-3.0, -3.2416]), 5e-3) is None  # another count


def test_a_cif_fire_may_move_a_frame_in_fp16_only() -> None:
    """verify's fp16 rule for the CIF: a token that fires one frame later alone than in the container, its
    cumulative weight having met the whole number within rounding of the frame's edge, is a near-tie (the
    tiny model's 29 s clip on CUDA: its peaks differed by 0.997 at two frames); the cumulative weight is
    what fp16 compares, so a fire moved by weights that really differ still fails (the per-frame weights
    too); fp32 and int8 (bound 0) allow none."""
    def output(alphas):
        total = np.cumsum(alphas)
        whole = np.floor(total)
        fired = np.diff(whole, prepend=0.0) > 0
        peaks = (total - whole + fired).astype(np.float32)
        return ParaformerOutput(np.array([4, 6], np.int32), np.array([-1.0, -2.0], np.float32),
                                np.array(alphas, np.float32), peaks)

    alone = output([0.5, 0.4995, 0.6, 0.5])  # fires at frames 2 and 3
    rounded = output([0.5, 0.5005, 0.6, 0.499])  # fires at frames 1 and 3: the first moved a frame
    assert np.abs(alone.peaks - rounded.peaks).max() > 0.99
    tie = compare(alone, rounded, FP16_MAX_SCALED_ERR)
    assert tie["tokens_equal"] and tie["fires_moved"] == 1
    assert tie["max_abs_err"] < 2e-3 and tie["max_scaled_err"] <= FP16_MAX_SCALED_ERR
    assert not compare(alone, rounded, 0.0)["tokens_equal"]
    assert compare(alone, alone, 0.0)["max_abs_err"] == 0 and compare(alone, alone, 0.0)["fires_moved"] == 0
    drifted = compare(alone, output([0.6, 0.6, 0.5, 0.3995]), FP16_MAX_SCALED_ERR)  # moved by 0.1 of weight
    assert drifted["fires_moved"] == 1 and drifted["max_scaled_err"] > FP16_MAX_SCALED_ERR
    # The cumulative weight judged relative to itself: 400 frames whose rounding (2^-14 a frame, binary
    # fractions so that the sums are exact) sums to 0.024 pass, where the peaks themselves differ by 0.024
    long_alone = output([0.75] * 399 + [0.5])
    long_rounded = output([0.75 + 2 ** -14] * 399 + [0.5])
    long = compare(long_alone, long_rounded, FP16_MAX_SCALED_ERR)
    assert long["tokens_equal"] and long["max_scaled_err"] < 1e-4 and long["worst_part"] == "cif_peaks"
    assert compare(alone, output([0.5, 0.5005, 0.6, 0.3]), FP16_MAX_SCALED_ERR)["fires_moved"] is None  # 1 fire


def test_fsmn_blocks_are_two_dimensional_depthwise_convs(paraformer_model_dir: Path) -> None:
    """Every FSMN memory block (encoder and decoder, fp32 and int8) is a 2-D conv of height 1 with 4-D
    weights: ONNX Runtime's CPU provider runs those as blocked (NCHWc) depthwise kernels, 3-4x faster than
    the 1-D conv between transposes they replaced (models/sensevoice.py fsmn_memory)."""
    import onnx

    directory = read_model_directory(paraformer_model_dir)
    for precision in ("fp32", "int8"):
        for decoder in (False, True):
            graph = onnx.load(str(directory.onnx_path(precision, decoder=decoder))).graph
            weights = {i.name: list(i.dims) for i in graph.initializer}
            grouped = [n for n in graph.node if n.op_type == "Conv"
                       and any(a.name == "group" and a.i > 1 for a in n.attribute)]
            blocks = directory.manifest.dimensions["decoder_blocks" if decoder else "num_blocks"]
            assert len(grouped) >= blocks
            assert all(len(weights[n.input[1]]) == 4 and weights[n.input[1]][2] == 1 for n in grouped)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_onnx_matches_funasr_in_a_larger_container(paraformer_model_dir: Path, precision: str) -> None:
    """Both stages, the decoder alone and on each token container of the 5 s container: FunASR's output."""
    directory = read_model_directory(paraformer_model_dir)
    audio, _ = soundfile.read(FIXTURE / "audio.wav", dtype="float32")
    container = np.zeros(seconds_to_samples(5.0), np.float32)
    container[: len(audio)] = audio
    stages = Stages(directory, precision, len(container), "cpu")
    first = run_encoder(stages.encoder_padded, container, len(audio))
    count = int(first["token_counts"][0])
    served = [k for k in stages.token_containers if k >= count]
    assert len(served) >= 2 and count > 0  # at least one ladder rung and the container's frames + 1
    results = [decode(stages.decoders[k], first, k) for k in served] + [decode(stages.decoder_alone, first, count)]
    for result in results:
        if precision == "int8":  # quantised weights: the same model, not the same numbers; equal across containers
            assert len(result.token_ids) == CONFIG["result"]["token_count"]
            np.testing.assert_array_equal(result.token_logprobs, results[0].token_logprobs)
            continue
        np.testing.assert_array_equal(result.token_ids, REFERENCE["token_ids"])
        best = REFERENCE["logprobs"][: len(result.token_ids)].max(-1)
        np.testing.assert_allclose(result.token_logprobs, best, atol=LOGPROB_TOL)
        np.testing.assert_allclose(result.peaks, REFERENCE["peaks"], atol=LOGPROB_TOL)
        assert decode_paraformer(result, directory.tokens).text == CONFIG["result"]["text"]


def test_a_single_graph_export_asks_for_a_re_export(paraformer_model_dir: Path, tmp_path: Path) -> None:
    """A directory from before the two-stage split (no decoder graphs) is refused with what to do."""
    old = tmp_path / "old"
    shutil.copytree(paraformer_model_dir, old)
    manifest = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    del manifest["decoder_files"]
    (old / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ModelLoadError, match="single-graph Paraformer export.*re-export it with `python -m export paraformer`"):
        Engine(old)
    assert cli_main(["--model", str(old)]) == 2


def test_another_architecture_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = released_copy(tmp_path)
    config = yaml.safe_load((source / "config.yaml").read_text(encoding="utf-8"))
    config.update(model="BiCifParaformer", predictor="CifPredictorV3")
    (source / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    out = tmp_path / "out"
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(source), "--out", str(out)])
    assert code == 1 and len(lines) == 1
    assert "describes model BiCifParaformer, predictor CifPredictorV3" in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_seaco_paraformer_is_refused_naming_the_release(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """FunASR's `paraformer-zh` alias downloads SeACo-Paraformer: the refusal says what to export instead."""
    source = released_copy(tmp_path)
    config = yaml.safe_load((source / "config.yaml").read_text(encoding="utf-8"))
    (source / "config.yaml").write_text(yaml.safe_dump(config | {"model": "SeacoParaformer"}), encoding="utf-8")
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(source), "--out", str(tmp_path / "out")])
    assert code == 1 and len(lines) == 1 and "describes model SeacoParaformer" in lines[0]
    assert "speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch" in lines[0]


def test_bad_container_or_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for container in ("-1", "0", "nan", "601"):
        code, lines = fail(capsys, ["paraformer", "--checkpoint", str(FIXTURE), "--out", str(tmp_path / "out"),
                                    "--container", container])
        assert code == 1 and lines == [f"error: --container {float(container):g}: give a length in seconds, "
                                       "more than 0 and at most 600"], container
    out = Path("/proc/unipad-test/out")  # cannot be created, even by root
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(FIXTURE), "--out", str(out)])
    assert code == 1 and lines == [f"error: cannot create {out}: No such file or directory"]
    assert not (tmp_path / "out").exists()


def test_a_sensevoice_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = released_copy(tmp_path)
    shutil.copy(FIXTURE.parent / "parity" / "model.pt", source / "model.pt")
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(source), "--out", str(tmp_path / "out")])
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: checkpoint does not match the model")


def test_missing_or_wrong_tokens(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = released_copy(tmp_path)
    (source / "tokens.json").unlink()
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(source), "--out", str(tmp_path / "out")])
    assert code == 1 and lines == [f"error: {source}: no tokens.json or tokens.txt (the token list is needed to serve text)"]
    (source / "tokens.txt").write_text("a\nb\n", encoding="utf-8")
    code, lines = fail(capsys, ["paraformer", "--checkpoint", str(source), "--out", str(tmp_path / "out")])
    assert code == 1 and lines == [f"error: {source / 'tokens.txt'} has 2 tokens but the checkpoint's output layer has 64"]
    assert not (tmp_path / "out").exists()


def test_verify_container_shorter_than_test_audio(paraformer_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code, lines = fail(capsys, ["verify", str(paraformer_model_dir), "--container", "20"])
    assert code != 0 and lines == ["error: the container (20 s) is shorter than the 29 s test audio"]


def test_verify_names_a_corrupt_graph(paraformer_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(paraformer_model_dir, broken)
    (broken / "model.int8.onnx").write_bytes((broken / "model.int8.onnx").read_bytes()[:1000])  # a cut download
    code, lines = fail(capsys, ["verify", str(broken), "--precision", "int8", "--lengths", "1"])
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith(f"error: {broken / 'model.int8.onnx'}: not a readable ONNX graph"), lines


@pytest.mark.slow
def test_random_init_tiny_exports_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "tiny"
    assert main(["paraformer", "--random-init", "tiny", "--out", str(out), "--precision", "fp32,int8"]) == 0
    assert main(["verify", str(out), "--container", "12", "--lengths", "2,5,11"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["passed"]
