"""The engine runs a Paraformer in two stages: the decoder on the smallest token container that holds the CIF
count, every (audio container, token container) session warmed at load, and the same output as a decoder
run on all frames + 1 rows (FunASR's own tiny Paraformer, conftest's `paraformer_model_dir`)."""
from __future__ import annotations

import numpy as np
import pytest

from export.onnx_export import deterministic_waveform
from pipeline.audio import encoder_frames, seconds_to_samples
from pipeline.batching import Clip
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import UnwarmedShapeError
from pipeline.families.paraformer.stages import container_for
from pipeline.shapes import DEFAULT_CPU_TOKEN_CONTAINERS, OPEN_STEP, token_containers

CONTAINERS = (2.0, 8.0)
LENGTHS = (0.5, 1.7, 2.0, 4.4, 8.0)


def test_token_containers_hold_every_count() -> None:
    assert token_containers(encoder_frames(seconds_to_samples(30.0))) == (16, 32, 64, 128, 256, 501)
    assert token_containers(encoder_frames(seconds_to_samples(1.0))) == (16, 18)
    ladder = (16, 32, 64, 501)
    assert [container_for(n, ladder) for n in (0, 16, 17, 64, 65, 501)] == [16, 16, 32, 64, 501, 501]


@pytest.fixture(scope="module", params=["fp32", "int8"])
def engines(request, paraformer_model_dir):
    """The default token ladder, and a decoder that runs on all frames + 1 rows (the single graph's way)."""
    options = dict(device="cpu", precision=request.param, containers=CONTAINERS)
    return (request.param, Engine(paraformer_model_dir, EngineOptions(**options)).load(),
            Engine(paraformer_model_dir, EngineOptions(**options, token_containers=(10**6,))).load())


def test_every_decoder_session_is_warmed_and_the_output_does_not_change(engines) -> None:
    precision, engine, every_row = engines
    sessions = engine.runtime.decoder.sessions
    expected = {(seconds_to_samples(c), k) for c in CONTAINERS
                for k in token_containers(encoder_frames(seconds_to_samples(c)), DEFAULT_CPU_TOKEN_CONTAINERS)}
    assert set(sessions) == expected and engine.ready and all(s.warmed for s in sessions.values())
    # On the CPU one prepacked session per graph serves every shape (each shape warmed through its runner).
    assert len({id(s.session) for s in sessions.values()}) == 1
    assert len({id(s.session) for s in engine.runtime.sessions.sessions.values()}) == 1
    assert set(every_row.runtime.decoder.sessions) == {(seconds_to_samples(c), encoder_frames(seconds_to_samples(c)) + 1)
                                                for c in CONTAINERS}
    counts = []
    for seconds in LENGTHS:
        audio = deterministic_waveform(seconds, seed=int(seconds * 10))
        ours, reference = engine.infer([Clip(audio)])[0], every_row.infer([Clip(audio)])[0]
        counts.append(len(ours.token_ids))
        np.testing.assert_array_equal(ours.token_ids, reference.token_ids)
        np.testing.assert_array_equal(ours.peaks, reference.peaks)  # stage one is the same session shape
        if precision == "int8":
            np.testing.assert_array_equal(ours.token_logprobs, reference.token_logprobs)
        else:
            np.testing.assert_allclose(ours.token_logprobs, reference.token_logprobs, atol=1e-5)
        assert engine.transcribe(audio).text == every_row.transcribe(audio).text
    assert min(counts) < 8 < 16 < max(counts)  # clips on the first rung and on larger ones
    assert engine.stats.unwarmed_calls == 0 and engine.stats.failures == 0
    assert engine.stats.calls == 4 * len(LENGTHS)  # two stages per clip, per infer and per transcribe


def test_an_unwarmed_decoder_shape_is_refused_and_counted(engines) -> None:
    _, engine, _ = engines
    session = next(iter(engine.runtime.decoder.sessions.values()))
    session.warmed = False
    try:
        with pytest.raises(UnwarmedShapeError, match="no session was warmed for the decoder on"):
            engine.infer([Clip(np.zeros(seconds_to_samples(0.5), np.float32))])
    finally:
        session.warmed = True
    assert engine.stats.unwarmed_calls == 1


def test_without_shared_weights_every_shape_has_its_own_session(paraformer_model_dir) -> None:
    engine = Engine(paraformer_model_dir, EngineOptions(precision="int8", containers=(2.0,), share_weights=False,
                                                        token_containers=(8, 16))).load()
    assert set(engine.runtime.decoder.sessions) == {(32000, 8), (32000, 16), (32000, 34)}
    assert len({id(s.session) for s in engine.runtime.decoder.sessions.values()}) == 3
    audio = deterministic_waveform(1.5, seed=3)
    assert engine.transcribe(audio).text and engine.stats.unwarmed_calls == 0



OPEN_LENGTHS = (0.3, 0.4, 0.5, 0.77, 1.0, 1.7, 2.0, 3.33, 4.4, 8.0, 12.5, 29.9, 30.0)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_cpus_unwarmed_open_shapes_give_the_warmed_containers_output(paraformer_model_dir, precision) -> None:
    """The CPU's default: each clip at its own length (pipeline/shapes.py open shapes), only the largest
    container warmed; its output is the output of a warmed ladder's container (1 s rungs, every decoder
    shape warmed, the former default): same tokens and text, int8 bit-identical, fp32 within rounding."""
    opened = Engine(paraformer_model_dir, EngineOptions(device="cpu", precision=precision)).load()
    ladder = tuple(float(s) for s in range(1, 31))
    warmed = Engine(paraformer_model_dir, EngineOptions(device="cpu", precision=precision, containers=ladder)).load()
    assert opened.policy.step == OPEN_STEP and opened.containers == (30.0,)
    assert list(opened.runtime.decoder.sessions) == [(seconds_to_samples(30.0), encoder_frames(seconds_to_samples(30.0)) + 1)]
    for seconds in OPEN_LENGTHS:
        audio = deterministic_waveform(seconds, seed=int(seconds * 100))
        ours, reference = opened.infer([Clip(audio)])[0], warmed.infer([Clip(audio)])[0]
        np.testing.assert_array_equal(ours.token_ids, reference.token_ids)
        if precision == "int8":
            np.testing.assert_array_equal(ours.token_logprobs, reference.token_logprobs)
        else:
            np.testing.assert_allclose(ours.token_logprobs, reference.token_logprobs, atol=1e-5)
            np.testing.assert_allclose(ours.peaks, reference.peaks, atol=1e-5)
        assert opened.transcribe(audio) == warmed.transcribe(audio)
    # Each length met a stage-one shape and a decoder shape of its own (30.0 s: the warmed stage one), run, not
    # refused; the second run of a shape is not cold.
    assert opened.stats.cold_shape_calls == 2 * len(OPEN_LENGTHS) - 1
    assert opened.stats.unwarmed_calls == 0 and opened.stats.failures == 0 and warmed.stats.cold_shape_calls == 0
