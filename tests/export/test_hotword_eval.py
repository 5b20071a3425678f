"""`python -m export eval-hotwords`: its sets and its measurements (the synthesis itself needs espeak-ng,
so these use the committed demo fixtures)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.evaluate import EvalItem
from export.hotword_eval import make_texts, score, time_segment
from pipeline.audio import load_audio
from pipeline.hotwords import parse_hotwords
from fixtures.make_hotword_fixture import BLEND_BOOST

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
FIXTURES = ROOT / "tests" / "fixtures" / "demo"


def test_biased_texts_hold_a_hotword_and_control_texts_none():
    rng = np.random.default_rng(0)
    hot = ("oh", "save")
    assert all(set(t.split()) & set(hot) for t in make_texts(rng, 50, hot, biased=True))
    assert not any(set(t.split()) & set(hot) for t in make_texts(rng, 50, hot, biased=False))


@pytest.mark.skipif(not (DEMO / "manifest.json").is_file(), reason="needs the demo model")
def test_scores_and_timing_on_the_blend():
    from pipeline.engine import Engine, EngineOptions

    engine = Engine(DEMO, EngineOptions(device="cpu", containers=(4, 30))).load()
    blend = EvalItem("blend", load_audio(FIXTURES / "save_send_blend.wav"), "save message")
    graph = engine.hotword_graph(parse_hotwords([{"text": "save", "boost": BLEND_BOOST}]))
    biased = score(engine, [blend], graph, ("save",))
    assert biased == {"wer": 0.0, "word_errors": 0, "words": 2, "recall": 1.0, "hotword_occurrences": 1}
    greedy = score(engine, [blend], None, ("save",))
    assert greedy["recall"] == (1.0 if greedy["wer"] == 0 else 0.0)
    timing = time_segment(engine, [blend] * 3, graph, repeats=1)
    assert {"model", "greedy", "top_k", "beam4", "beam8", "top_k_sensevoice_vocab"} <= set(timing)
    assert 5 < timing["audio_seconds"] < 6 and all(v > 0 for v in timing.values())


def test_help_is_instant():
    from export.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["eval-hotwords", "--help"])
    assert exit_.value.code == 0


def test_bad_arguments_fail_at_once_in_one_line(capsys):
    """Before loading the model or synthesising minutes of speech; the zero boost used to run as the default."""
    from export.__main__ import main

    for flags, message in ((["--boost", "0"], "hotword boost must be a number in (0, 10], got 0.0 for 'oh'"),
                           (["--repeats", "0"], "one timing run (--repeats)"),
                           (["--snr", "nan"], "--snr must be a finite number of dB, got nan")):
        assert main(["eval-hotwords", str(DEMO), "--utterances", "1", *flags]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
