"""`python -m export pull paraformer-large` against the loopback Hugging Face hub (hub_mirror.py), then
`python -m server --model paraformer-large`.

The real catalogue entry keeps its repository (funasr/paraformer-zh) and pinned commit; only its file list is
swapped for FunASR's own tiny Paraformer in the released layout (tests/fixtures/paraformer: model.pt in LFS,
config.yaml, am.mvn and tokens.json plain), with the tiny files' sizes, and their sha256 where the real entry pins
one. One pull downloads, exports and verifies it; the server then finds it by name and transcribes a recording.
The download's faults and resuming are the same code for every model: test_pull.py tests them with SenseVoice.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hub_mirror import COMMIT, HubMirror, MirrorFile
from pull_testkit import assert_failed_cleanly, run_pull, staged, transcribe_by_name

from pipeline import catalog
from pipeline.catalog import PARAFORMER_LARGE, HubFile
from server.cli import main as unipad_main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paraformer"
NAME = PARAFORMER_LARGE.name
SOURCE = PARAFORMER_LARGE.source("hf")
LFS = ("model.pt",)  # as funasr/paraformer-zh stores them: the checkpoint in LFS, the rest plain git files


def released_files() -> dict[str, MirrorFile]:
    return {f.name: MirrorFile((FIXTURE / f.name).read_bytes(), lfs=f.name in LFS) for f in PARAFORMER_LARGE.files}


@pytest.fixture
def hub(home: Path, monkeypatch: pytest.MonkeyPatch):
    files = released_files()
    pins = tuple(HubFile(f.name, len(files[f.name].data), files[f.name].sha256 if f.sha256 else None)
                 for f in PARAFORMER_LARGE.files)  # config.yaml by size only, as in the real entry
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(PARAFORMER_LARGE, files=pins))
    with HubMirror({SOURCE.repo: files}, revisions=(SOURCE.revision,)) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        yield mirror
    assert mirror.errors == [], mirror.errors[0]  # a fault of the loopback hub, not of the product


async def test_pull_then_serve_by_name(hub: HubMirror, home: Path, capsys, speech, serve_test_server) -> None:
    # fp32 alone: the pull is what is tested here (Paraformer's int8 export: tests/export/test_paraformer_export.py),
    # and the second precision's export and verify would double the test's time
    code, out, err = run_pull(capsys, NAME, "--precision", "fp32")
    assert code == 0, err[-3000:]  # 0 only once `verify` passed on the export (export/pull.py)
    assert out.strip().splitlines()[-1] == f"serve it: python -m server --model {NAME}"
    model_dir = home / "models" / NAME
    assert sorted(p.name for p in (home / "models").iterdir()) == [NAME] and not (home / "downloads").exists()
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["architecture"] == "paraformer" and set(manifest["files"]) == {"fp32"}
    source = manifest["source"]
    assert (source["repo"], source["revision"], source["commit"]) == (SOURCE.repo, SOURCE.revision, COMMIT)
    assert source["sha256"] == {name: f.sha256 for name, f in released_files().items()}

    served, finals = await transcribe_by_name(NAME, speech, serve_test_server)
    assert served == model_dir
    assert all(final.text for final in finals)  # the tiny model's words are noise, but there are words

    capsys.readouterr()
    assert unipad_main(["models"]) == 0
    listing = capsys.readouterr().out
    assert f"  {NAME} " in listing and "fp32" in listing and f"hf:{SOURCE.repo}@" in listing


def test_file_not_matching_its_pin_is_refused(hub: HubMirror, home: Path, capsys) -> None:
    """tokens.json with other bytes of the same size (a mirror's tampered copy; the hub's ETag is still the
    honest git blob id): refused before the export, deleted, nothing in the model cache."""
    hub.faults["tokens.json"] = "corrupt"
    code, _, err = run_pull(capsys, NAME)
    assert_failed_cleanly(code, err, home, "tokens.json", "sha256", "expected", "deleted")
    assert not any(name.startswith("tokens.json") for name in staged(home))
