"""`python -m export sensevoice` and `python -m export verify`: the tiny random model end to end, a FunASR
checkpoint directory we make ourselves (the parity fixture's weights plus a tiny sentencepiece model), and
every bad input ending in one clear `error:` line, a non-zero exit and no directory left behind.

The successful runs go through real subprocesses (the tiny model is conftest's session-wide
`tiny_model_dir`); the failures call `export.__main__.main(argv)` in-process, the same function the
command runs, to skip a torch import per case.
"""
from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export.__main__ import main
from export.onnx_export import write_model_dir
from export.verify import DEFAULT_LENGTHS, MAX_SCALED_ERR, MIN_COSINE, make_session
from models.frontend import FEATURE_SIZE
from pipeline.audio import SAMPLE_RATE, seconds_to_samples
from pipeline.modeldir import DECODING_OUTPUT_NAMES, OUTPUT_NAMES, ModelManifest, read_model_directory

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "tests" / "fixtures" / "parity"
PARITY_CONFIG = json.loads((PARITY / "config.json").read_text(encoding="utf-8"))
WORDS = "please open the window now seven green apples on the table thank you very much".split()
TAGS = ["<|zh|>", "<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|withitn|>", "<|woitn|>"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "export", *args], cwd=ROOT, capture_output=True, text=True)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def train_bpe(path: Path, vocab_size: int) -> list[str]:
    """A tiny sentencepiece BPE model (the released one's kind) with a few SenseVoice tags; its pieces."""
    import sentencepiece

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        user_defined_symbols=TAGS, minloglevel=2,
    )
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def make_checkpoint(directory: Path, state: dict | None = None, mvn: bytes | None = None,
                    bpe_vocab: int | None = None, omit: tuple[str, ...] = ()) -> Path:
    """A released-style model directory: model.pt, am.mvn, config.yaml, *.bpe.model (FunASR's layout)."""
    directory.mkdir(parents=True)
    torch.save(torch.load(PARITY / "model.pt", weights_only=True) if state is None else state, directory / "model.pt")
    (directory / "am.mvn").write_bytes((PARITY / "am.mvn").read_bytes() if mvn is None else mvn)
    heads = PARITY_CONFIG["model"]["encoder_conf"]["attention_heads"]
    (directory / "config.yaml").write_text(f"encoder: SenseVoiceEncoderSmall\nencoder_conf:\n  attention_heads: {heads}\n")
    train_bpe(directory / "tiny.bpe.model", bpe_vocab or PARITY_CONFIG["model"]["vocab_size"])
    for name in omit:
        (directory / name).unlink()
    return directory


def greedy_ids(logprobs: np.ndarray) -> list[int]:
    best = logprobs.argmax(-1)
    return best[np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)].tolist()


def parity_state() -> dict:
    return torch.load(PARITY / "model.pt", weights_only=True)


def assert_clean_failure(code: int, stderr: str, out: Path, *words: str) -> None:
    """Non-zero exit, exactly one `error:` line naming the problem, no traceback, nothing written."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert code != 0
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in errors[0], errors[0]
    assert not out.exists()
    if out.parent.exists():
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temp sibling


def fail(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


# ---- success: random-init tiny, fp32 and int8 ---------------------------------------------------------

def test_random_tiny_export_and_verify_pass(tiny_model_dir: Path) -> None:
    model = read_model_directory(tiny_model_dir)
    assert set(model.manifest.files) == {"fp32", "int8"}
    assert model.manifest.source["kind"] == "random-init" and model.manifest.dimensions["vocab_size"] == len(model.tokens)
    assert "recognises no speech" in model.manifest.notice  # what the page and the log say about it
    done = run_cli("verify", str(tiny_model_dir))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = last_json(done.stdout)
    assert summary["passed"] is True and summary["tokens_equal"] is True
    assert summary["max_abs_err"] <= MAX_SCALED_ERR and summary["max_scaled_err"] <= summary["max_abs_err"] and summary["cosine"] >= MIN_COSINE
    assert summary["forbidden_ops"] == [] and summary["static_shapes"] is True
    assert set(summary["precisions"]) == {"fp32", "int8"}
    for precision, lengths in summary["precisions"].items():
        assert set(lengths) == {f"{s:g}s" for s in DEFAULT_LENGTHS} >= {"0.3s", "1s", "29s"}, precision
        for figures in lengths.values():
            assert figures["max_abs_err"] <= MAX_SCALED_ERR and figures["cosine"] >= MIN_COSINE and figures["tokens_equal"]


def test_an_fp16_only_export_skips_the_fp32_graph(tiny_fp16_model_dir: Path) -> None:
    """A GPU's export (the lease's, bench/gpu_check.sh): one graph traced, with its decoding outputs."""
    import onnx

    out = tiny_fp16_model_dir  # `sensevoice --random-init tiny --precision fp16` (tests/fixtures/make_exports.py)
    model = read_model_directory(out)
    assert model.manifest.files == {"fp16": "model.fp16.onnx"} and model.manifest.top_k == 8
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.fp16.onnx", "tokens.txt"]
    graph = onnx.load(str(out / "model.fp16.onnx"), load_external_data=False).graph
    assert [o.name for o in graph.output] == list(OUTPUT_NAMES + DECODING_OUTPUT_NAMES)
    # Its FSMN blocks are 1-D depthwise convs (3-D weights), whose first run on CUDA costs a tenth of the
    # 2-D conv's that the CPU's graphs keep (models/sensevoice.py fsmn_memory)
    weights = {i.name: len(i.dims) for i in graph.initializer}
    grouped = [n for n in graph.node if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(grouped) == model.manifest.dimensions["num_blocks"] + model.manifest.dimensions["tp_blocks"]
    assert all(weights[n.input[1]] == 3 for n in grouped)


# ---- success: a FunASR checkpoint directory -----------------------------------------------------------

def test_checkpoint_export_matches_funasr(tmp_path: Path) -> None:
    """The real loading path (strict state_dict, am.mvn, config.yaml heads, sentencepiece tokens) on the
    parity fixture's FunASR weights; the exported graph reproduces FunASR's log-probs and greedy tokens in a
    larger container whose samples past the clip are garbage (tests/models/test_parity.py holds the same
    weights to FunASR in PyTorch; this is their one ONNX export)."""
    import soundfile

    checkpoint = make_checkpoint(tmp_path / "SenseVoiceTiny")
    pieces = train_bpe(tmp_path / "pieces.model", PARITY_CONFIG["model"]["vocab_size"])
    out = tmp_path / "exported"
    done = run_cli("sensevoice", "--checkpoint", str(checkpoint), "--out", str(out), "--precision", "fp32")
    assert done.returncode == 0, done.stderr[-3000:]
    model = read_model_directory(out)
    assert model.manifest.source["kind"] == "checkpoint" and model.manifest.notice == ""  # name + languages
    assert list(model.tokens) == pieces
    assert {model.tokens[i] for ids in model.manifest.tag_tokens.values() for i in ids} == set(TAGS)
    conf = PARITY_CONFIG["model"]["encoder_conf"]
    assert {k: model.manifest.dimensions[k] for k in ("output_size", "linear_units", "num_blocks", "tp_blocks")} == {
        k: conf[k] for k in ("output_size", "linear_units", "num_blocks", "tp_blocks")}

    audio, rate = soundfile.read(PARITY / "audio.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    session = make_session(model.onnx_path("fp32"), seconds_to_samples(5.0))
    container = np.random.default_rng(7).uniform(-1, 1, seconds_to_samples(5.0)).astype(np.float32)
    container[: len(audio)] = audio  # the graph must ignore what lies past audio_lengths
    for run, entry in PARITY_CONFIG["runs"].items():
        logprobs, lengths = session.run(["logprobs", "logprob_lengths"], {
            "audio": container[None], "audio_lengths": np.array([len(audio)], np.int32),
            "language": np.array([entry["language_row"]], np.int32),
            "textnorm": np.array([entry["textnorm_row"]], np.int32),
        })
        valid, reference = logprobs[0, : int(lengths[0])], np.load(PARITY / f"logprobs_{run}.npy")
        assert valid.shape == reference.shape
        np.testing.assert_allclose(valid, reference, rtol=0, atol=1e-4)
        assert greedy_ids(valid) == greedy_ids(reference)


def test_wrapped_state_dict_is_accepted(tmp_path: Path) -> None:
    from export.sensevoice import checkpoint_model

    checkpoint = make_checkpoint(tmp_path / "wrapped", state={"state_dict": parity_state()})
    model, tokens = checkpoint_model(checkpoint)
    assert len(tokens) == model.dims.vocab_size == PARITY_CONFIG["model"]["vocab_size"]


# ---- failures ------------------------------------------------------------------------------------------

def _drop(key: str):
    def mutate(state: dict) -> dict:
        del state[key]
        return state
    return mutate


def _set(key: str, value: torch.Tensor):
    def mutate(state: dict) -> dict:
        state[key] = value
        return state
    return mutate


def _mvn(transform) -> bytes:
    return transform((PARITY / "am.mvn").read_text(encoding="utf-8")).encode()


def _long_shift(text: str) -> str:
    lines = text.split("\n")
    shift = next(i for i, line in enumerate(lines) if line.startswith("<AddShift>")) + 1
    lines[shift] = lines[shift].replace(" ]", " 1.5 ]")
    return "\n".join(lines)


def _nan_scale(text: str) -> str:
    lines = text.split("\n")
    scale = next(i for i, line in enumerate(lines) if line.startswith("<Rescale>")) + 1
    values = lines[scale].split(" ")
    values[3] = "nan"
    lines[scale] = " ".join(values)
    return "\n".join(lines)


BAD_CHECKPOINTS = {
    "missing key": (dict(state=_drop("encoder.tp_norm.bias")), ("1 missing", "encoder.tp_norm.bias")),
    "missing head": (dict(state=_drop("ctc.ctc_lo.weight")), ("missing", "ctc.ctc_lo.weight")),
    "unexpected key": (dict(state=_set("encoder.extra.weight", torch.zeros(3))), ("1 unexpected", "encoder.extra.weight")),
    "wrong shape": (dict(state=_set("encoder.tp_norm.bias", torch.zeros(3))), ("wrong shape", "encoder.tp_norm.bias")),
    "not a checkpoint": (dict(raw_model=b"not a checkpoint" * 8), ("model.pt", "not a PyTorch state_dict")),
    "am.mvn too long": (dict(mvn=_mvn(_long_shift)), ("am.mvn", f"{FEATURE_SIZE + 1} values, expected {FEATURE_SIZE}")),
    "am.mvn garbage": (dict(mvn=b"hello\nthis is not a cmvn file\n"), ("am.mvn", "no <AddShift>")),
    "am.mvn binary": (dict(mvn=bytes(range(256))), ("am.mvn", "not a text file")),
    "am.mvn nan": (dict(mvn=_mvn(_nan_scale)), ("am.mvn", "<Rescale> has non-finite values")),
    "no model.pt": (dict(omit=("model.pt",)), ("model.pt is missing",)),
    "no am.mvn": (dict(omit=("am.mvn",)), ("am.mvn is missing",)),
    "no bpe model": (dict(omit=("tiny.bpe.model",)), ("no sentencepiece",)),
    "bpe vocab mismatch": (dict(bpe_vocab=48), ("48 pieces", "64")),
}


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_bad_checkpoint_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture, case: str) -> None:
    spec, words = BAD_CHECKPOINTS[case]
    spec = dict(spec)
    raw_model = spec.pop("raw_model", None)
    if "state" in spec:
        spec["state"] = spec["state"](parity_state())
    checkpoint = make_checkpoint(tmp_path / "checkpoint", **spec)
    if raw_model is not None:
        (checkpoint / "model.pt").write_bytes(raw_model)
    out = tmp_path / "models" / "out"
    code, stderr = fail(capsys, ["sensevoice", "--checkpoint", str(checkpoint), "--out", str(out), "--precision", "fp32"])
    assert_clean_failure(code, stderr, out, *words)


def test_missing_checkpoint_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    code, stderr = fail(capsys, ["sensevoice", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(out)])
    assert_clean_failure(code, stderr, out, "model.pt is missing")


def test_unknown_precision(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    code, stderr = fail(capsys, ["sensevoice", "--random-init", "tiny", "--out", str(out), "--precision", "fp32,fp64"])
    assert_clean_failure(code, stderr, out, "unknown precision 'fp64'")


def test_existing_out_is_refused_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, stderr = fail(capsys, ["sensevoice", "--random-init", "tiny", "--out", str(out)])
    assert code != 0 and stderr.strip().splitlines()[-1].startswith("error: ") and "already exists" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["keep.txt"]


def test_failed_export_leaves_no_temporary_directory(tmp_path: Path) -> None:
    """A failure inside the export itself (here: not a model at all) removes the half-written sibling."""
    manifest = ModelManifest(name="x", architecture="sensevoice", dimensions={}, files={}, source={})
    with pytest.raises(AttributeError):
        write_model_dir(object(), ["<unk>"], tmp_path / "out", manifest, ("fp32",))
    assert list(tmp_path.iterdir()) == []


def test_verify_container_shorter_than_test_audio(tiny_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code, stderr = fail(capsys, ["verify", str(tiny_model_dir), "--container", "20"])
    assert code != 0 and stderr.strip().splitlines() == ["error: the container (20 s) is shorter than the 29 s test audio"]


def test_verify_unknown_precision(tiny_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code, stderr = fail(capsys, ["verify", str(tiny_model_dir), "--precision", "fp64"])
    assert code != 0 and len(stderr.strip().splitlines()) == 1 and "no fp64 graph" in stderr


def test_verify_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, stderr = fail(capsys, ["verify", str(tmp_path / "nowhere")])
    assert code != 0 and len(stderr.strip().splitlines()) == 1 and "does not exist" in stderr


@pytest.mark.parametrize("flag, value", [("--lengths", "abc"), ("--lengths", "0"), ("--lengths", "-1"),
                                         ("--container", "0"), ("--container", "nan")])
def test_verify_bad_seconds_name_the_flag(tiny_model_dir: Path, capsys: pytest.CaptureFixture, flag: str,
                                          value: str) -> None:
    # These used to end in numpy's words ("zero-size array to reduction operation maximum"), or, for
    # --container 0, in a silent run on the manifest's container.
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(tiny_model_dir), f"{flag}={value}"])
    assert exit_.value.code == 2
    assert f"argument {flag}: expected positive seconds" in capsys.readouterr().err.strip().splitlines()[-1]


def test_verify_names_a_damaged_graph(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_model_dir, damaged)
    graph = damaged / read_model_directory(damaged).manifest.files["fp32"]
    graph.write_bytes(b"not a graph")
    code, stderr = fail(capsys, ["verify", str(damaged), "--precision", "fp32"])
    # was "error: DecodeError: Error parsing message with type 'onnx.ModelProto'...", naming no file
    assert code == 1 and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith(f"error: {graph}: not a readable ONNX graph ("), stderr


def test_rewritten_external_weights_are_fresh_and_as_readable_as_the_graph(tmp_path: Path) -> None:
    """save_graph, which add-decoding and the Qwen3 export use to rewrite a graph past 2 GB in place: onnx
    refuses to write over the old weights file (add-decoding failed on such a graph with FileExistsError)
    and makes a new one 0600 (a service account could read the graph but not its weights)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from export.onnx_export import external_data_file, save_graph

    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "weight")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "weight"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [weight])
    path, data = tmp_path / "g.onnx", external_data_file(tmp_path / "g.onnx")
    onnx.save_model(helper.make_model(graph), str(path), save_as_external_data=True, location=data.name,
                    size_threshold=1024)  # a graph past 2 GB, as torch.onnx writes it
    path.chmod(0o644)
    for _ in range(3):
        save_graph(onnx.load(str(path)), path)
    assert data.stat().st_size == 64 * 64 * 4  # once, not three times
    assert data.stat().st_mode & 0o777 == 0o644
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ numpy_helper.to_array(weight))
