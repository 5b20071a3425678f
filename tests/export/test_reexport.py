"""`python -m export reexport`: a SenseVoice directory exported again from the weights in its own fp32 graph
(how the shipped demo model, which has no checkpoint, lost its Range: issue 60). The same numbers in, so the
same answers out, bit for bit, in both precisions, alone and in the container."""
from __future__ import annotations

import collections
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from export.__main__ import main
from export.verify import make_session, run_session
from export.verify import test_clips as verify_clips

ROOT = Path(__file__).resolve().parents[2]


def weights(path: Path) -> collections.Counter:
    """The graph's constants as a multiset of (dtype, shape, digest): what they hold, whatever they are named."""
    found = collections.Counter()
    for tensor in onnx.load(str(path)).graph.initializer:
        value = numpy_helper.to_array(tensor)
        found[(value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())] += 1
    return found


def test_reexport_writes_the_same_model_again(tiny_model_dir: Path, tmp_path: Path) -> None:
    source, out = tmp_path / "model", tmp_path / "again"
    shutil.copytree(tiny_model_dir, source)
    (source / "README.md").write_text("the card\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "export", "reexport", str(source), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "answers verify's 7 clips with equal tokens (max scaled error 0 " in done.stdout
    assert (out / "README.md").read_text(encoding="utf-8") == "the card\n"
    assert (out / "manifest.json").read_bytes() == (tiny_model_dir / "manifest.json").read_bytes()
    for graph in ("model.onnx", "model.int8.onnx"):
        assert weights(out / graph) == weights(tiny_model_dir / graph)
        container = 10 * 16000
        for samples in (None, container):
            old, new = (make_session(d / graph, samples) for d in (tiny_model_dir, out))
            for clip in verify_clips((0.3, 1.0, 5.0)).values():
                audio = clip if samples is None else np.pad(clip, (0, samples - len(clip)))
                assert np.array_equal(run_session(old, audio, len(clip))[0], run_session(new, audio, len(clip))[0])


def test_reexport_refuses_another_family(paraformer_model_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["reexport", str(paraformer_model_dir), "--out", str(tmp_path / "out")]) == 1
    assert "reexport reads a SenseVoice directory's fp32 graph; this one is paraformer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
