"""`python -m export pull` against a loopback Hugging Face hub (hub_mirror.py) serving the tests' tiny
SenseVoice as released files, and `python -m server --model NAME` / `unipad models` finding the result.

The catalogue entry keeps its real repository and pinned revision; only its file list is swapped for the
tiny files' (sizes and sha256 recorded for the files the real entry pins: all four). Every fault case ends
in one `error:` line, a non-zero exit and an empty model cache; the resumable ones then succeed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hub_mirror import COMMIT, HubMirror, MirrorFile
from pull_testkit import assert_failed_cleanly, run_pull, staged, transcribe_by_name

from export.__main__ import main
from export.pull import LOCK_FILE
from export.verify import DEFAULT_LENGTHS, verify
from pipeline import catalog
from pipeline.catalog import SENSEVOICE_SMALL, HubFile
from server.cli import main as unipad_main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NAME = SENSEVOICE_SMALL.name
REPO = SENSEVOICE_SMALL.source("hf").repo
REVISION = SENSEVOICE_SMALL.source("hf").revision
BPE = "chn_jpn_yue_eng_ko_spectok.bpe.model"
LFS = ("model.pt", BPE)


def released_files() -> dict[str, MirrorFile]:
    """The tiny model as FunAudioLLM lays out SenseVoiceSmall: model.pt and the .bpe.model in LFS."""
    paths = {"model.pt": FIXTURES / "parity" / "model.pt", "am.mvn": FIXTURES / "parity" / "am.mvn",
             "config.yaml": FIXTURES / "hub" / "config.yaml", BPE: FIXTURES / "hub" / BPE}
    return {name: MirrorFile(path.read_bytes(), lfs=name in LFS) for name, path in paths.items()}


def catalogue_files(files: dict[str, MirrorFile], unknown: tuple[str, ...] = ()) -> tuple[HubFile, ...]:
    """The entry's file list for these files: size and sha256 for those the real entry pins, none for the rest."""
    pinned = {f.name for f in SENSEVOICE_SMALL.files if f.sha256} - set(unknown)
    return tuple(HubFile(name, len(f.data), f.sha256) if name in pinned else HubFile(name) for name, f in files.items())


@pytest.fixture
def hub(home: Path, monkeypatch: pytest.MonkeyPatch):
    files = released_files()
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(SENSEVOICE_SMALL, files=catalogue_files(files)))
    with HubMirror({REPO: files}, revisions=(REVISION,)) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        yield mirror
    assert mirror.errors == [], mirror.errors[0]  # a fault of the loopback hub, not of the product


def pull(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    return run_pull(capsys, NAME, *args)


def assert_staged_intact(home: Path, files: dict[str, MirrorFile] | None = None) -> None:
    """Every released file staged whole (byte for byte), no partial file left."""
    files = files or released_files()
    assert staged(home) == sorted(files)
    for name, file in files.items():
        assert next((home / "downloads").rglob(name)).read_bytes() == file.data, name


# ---- success: pull, verify, serve by name, list ---------------------------------------------------------

async def test_pull_then_serve_by_name(hub: HubMirror, home: Path, capsys, speech, serve_test_server) -> None:
    code, out, err = pull(capsys)
    assert code == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == f"serve it: python -m server --model {NAME}"
    model_dir = home / "models" / NAME
    assert sorted(p.name for p in (home / "models").iterdir()) == [NAME]  # no temporary sibling left
    assert not (home / "downloads").exists()  # staging removed once exported
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["name"] == NAME and set(manifest["files"]) == {"fp32", "int8"}
    assert manifest["source"]["kind"] == "hub" and manifest["source"]["repo"] == REPO
    assert manifest["source"]["commit"] == COMMIT  # the X-Repo-Commit the hub answered with
    assert manifest["source"]["sha256"] == {name: f.sha256 for name, f in released_files().items()}
    assert verify(model_dir, None, None, DEFAULT_LENGTHS)["passed"]
    # the LFS files came from the "CDN" origin, the plain ones straight from the hub
    gets = [path for method, path, _ in hub.requests if method == "GET"]
    assert sum(p.startswith("/cdn/") for p in gets) == 2 and sum("/resolve/" in p for p in gets) == 2

    # a second pull finds it and downloads nothing
    before = len(hub.requests)
    code, out, _ = pull(capsys)
    assert code == 0 and "already" in out and len(hub.requests) == before

    # the server resolves the name to the cache and serves a recording with it
    served, _ = await transcribe_by_name(NAME, speech, serve_test_server)
    assert served == model_dir

    capsys.readouterr()
    assert unipad_main(["models"]) == 0
    listing = capsys.readouterr().out
    assert f"  {NAME} " in listing and "fp32,int8" in listing and f"hf:{REPO}@" in listing


def test_server_names_the_pull_command(home: Path, capsys) -> None:
    for value, words in ((NAME, ("not pulled yet", f"python -m export pull {NAME}")),
                         ("no-such-model", ("not a known model name", "python -m export pull"))):
        capsys.readouterr()
        assert unipad_main(["--model", value]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(w in err[0] for w in words), err


def test_damaged_cached_model_is_not_reported_as_ready(home: Path, capsys) -> None:
    # A graph deleted from the cache since the pull: pull used to answer "already in ... serve it".
    model_dir = home / "models" / NAME
    shutil.copytree(ROOT / "models" / "demo", model_dir)
    (model_dir / "model.int8.onnx").unlink()
    code, out, err = pull(capsys)
    assert code == 1 and "serve it" not in out
    assert err.strip().splitlines() == [err.strip()] and "is damaged" in err and "--force" in err
    assert unipad_main(["models"]) == 0
    assert f"repair: python -m export pull {NAME} --force" in capsys.readouterr().out


# ---- faults -----------------------------------------------------------------------------------------------

def test_unknown_name(home: Path, capsys) -> None:
    code = main(["pull", "no-such-model"])
    assert_failed_cleanly(code, capsys.readouterr().err, home, "unknown model", NAME)


def test_offline(home: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(SENSEVOICE_SMALL, files=catalogue_files(released_files())))
    with HubMirror({}) as closed:
        endpoint = closed.endpoint  # a port that refuses connections once the mirror is gone
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "cannot reach", endpoint, "HF_ENDPOINT")


def test_missing_file_404(hub: HubMirror, home: Path, capsys) -> None:
    del hub.repos[REPO]["am.mvn"]
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "no file am.mvn", "404")


def test_server_error_500_then_resumes(hub: HubMirror, home: Path, capsys) -> None:
    hub.faults["config.yaml"] = "500"
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "500", "try again")
    assert staged(home) == ["am.mvn", "model.pt"]  # what had finished is kept for the next run
    hub.faults.clear()
    hub.requests.clear()
    code, _, err = pull(capsys, "--download-only")
    assert code == 0, err[-3000:]
    fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if method == "GET"}
    files = hub.repos[REPO]
    assert fetched == {"config.yaml", files[BPE].sha256}  # the failed file and the one after it, no others
    assert_staged_intact(home)


def test_truncated_body_then_resumes_with_range(hub: HubMirror, home: Path, capsys) -> None:
    hub.faults["model.pt"] = "short"
    size = len(hub.repos[REPO]["model.pt"].data)
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "stopped at", f"of {size} bytes", "resume")
    hub.faults.clear()
    code, _, err = pull(capsys, "--download-only")
    assert code == 0, err[-3000:]
    assert_staged_intact(home)
    assert ("GET", f"/cdn/{hub.repos[REPO]['model.pt'].sha256}", f"bytes={size * 3 // 4}-") in hub.requests


def test_hash_mismatch_deletes_the_file(hub: HubMirror, home: Path, capsys) -> None:
    hub.faults[BPE] = "corrupt"
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, BPE, "sha256", "deleted")
    assert not any(name.startswith(BPE) for name in staged(home))


# Pins no public evidence gave yet (pipeline/catalog.py says where the search ended): these are checked at download
# against what the hub reports instead (size, LFS sha256), and by the exporter. Any other file without a size and a
# sha256 fails.
NOT_YET_PINNED = {"paraformer-large": {"config.yaml": ("sha256",)},
                  "ct-punc": {"model.pt": ("sha256",), "config.yaml": ("size", "sha256"),
                              "tokens.json": ("size", "sha256")}}


@pytest.mark.parametrize("name", sorted(catalog.MODELS))
def test_real_catalogue_pins_every_released_file(name: str) -> None:
    """Size and sha256 for every file (SenseVoice's am.mvn and config.yaml were unpinned: a mirror's tampered
    copies were exported and cached as verified). Where each value comes from: pipeline/catalog.py."""
    entry = catalog.MODELS[name]
    unpinned = {f.name: tuple(pin for pin in ("size", "sha256") if not getattr(f, pin)) for f in entry.files}
    assert {f: pins for f, pins in unpinned.items() if pins} == NOT_YET_PINNED.get(name, {})
    assert len(entry.source("hf").revision) == 40  # a commit, which the pins belong to, not a branch


@pytest.mark.parametrize("name", ["am.mvn", "config.yaml"])
def test_tampered_plain_file_is_refused(hub: HubMirror, home: Path, capsys, name: str) -> None:
    """A mirror serving other bytes (same size, the honest git blob id in its ETag) for a plain git file."""
    hub.faults[name] = "corrupt"
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, name, "sha256", "expected", "deleted")
    assert name not in staged(home)


def test_tampered_file_kept_from_an_earlier_run_is_refused(hub: HubMirror, home: Path, capsys) -> None:
    """A file an older version staged (and checked against its catalogue, which pinned less) is checked
    against this one's pins before it is exported; once deleted, the next run downloads it afresh."""
    staging = home / "downloads" / NAME / f"hf-{REVISION}"
    staging.mkdir(parents=True)
    honest = hub.repos[REPO]["am.mvn"].data
    digit = honest.index(b"[ -") + 3  # the first mean's first digit: same size, another CMVN shift
    (staging / "am.mvn").write_bytes(honest[:digit] + (b"2" if honest[digit:digit + 1] == b"1" else b"1") + honest[digit + 1:])
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "am.mvn", "sha256", "deleted")
    assert not (staging / "am.mvn").exists()
    code, _, err = pull(capsys, "--download-only")
    assert code == 0, err[-3000:]
    assert_staged_intact(home)


def test_cached_export_of_other_files_is_not_ready(home: Path, capsys) -> None:
    """A model directory an older version exported from a tampered am.mvn: its manifest records the
    sha256 it was made from, which is not the pin. pull says so instead of "already there, serve it"."""
    model_dir = home / "models" / NAME
    shutil.copytree(ROOT / "models" / "demo", model_dir)
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    pins = {f.name: f.sha256 for f in SENSEVOICE_SMALL.files}
    manifest["source"] = {"kind": "hub", "hub": "hf", "repo": REPO, "sha256": dict(pins, **{"am.mvn": "0" * 64})}
    (model_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    code, out, err = pull(capsys)
    assert code == 1 and "serve it" not in out
    assert err.strip().splitlines() == [err.strip()], err
    assert "not the release this version pins" in err and "am.mvn sha256 " + "0" * 64 in err and "--force" in err
    manifest["source"]["sha256"] = pins  # the pinned release: ready
    (model_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    code, out, _ = pull(capsys)
    assert code == 0 and "already in" in out


def test_real_catalogue_rejects_another_file(home: Path, monkeypatch, capsys) -> None:
    """The shipped entry's recorded size (the publisher's) against a mirror serving other bytes."""
    with HubMirror({REPO: released_files()}, revisions=(REVISION,)) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        code, _, err = pull(capsys)
        assert not [r for r in mirror.requests if r[1].startswith("/cdn/")]  # stopped before downloading
    assert_failed_cleanly(code, err, home, "model.pt", f"catalogue {SENSEVOICE_SMALL.files[0].size}")


def test_wrong_architecture_checkpoint(home: Path, monkeypatch, capsys, tmp_path: Path) -> None:
    """A checkpoint of another model, with no catalogued hash to stop it: the strict load does."""
    files = released_files()
    torch.save({"encoder.layers.0.linear.weight": torch.zeros(4, 4)}, tmp_path / "other.pt")
    files["model.pt"] = MirrorFile((tmp_path / "other.pt").read_bytes(), lfs=True)
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(
        SENSEVOICE_SMALL, files=catalogue_files(files, unknown=("model.pt",))))
    with HubMirror({REPO: files}, revisions=(REVISION,)) as mirror:
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)
        code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "do not load as", "checkpoint does not match", "deleted")
    assert staged(home) == []


def test_not_enough_disk_space(hub: HubMirror, home: Path, monkeypatch, capsys) -> None:
    """The hub announces a file larger than this disk's real free space: refused before downloading.
    (A disk filling up mid-download, ENOSPC, is not tested: no small filesystem can be mounted here.)"""
    entry = catalog.MODELS[NAME]
    unknown_size = tuple(HubFile(f.name) if f.name == "model.pt" else f for f in entry.files)
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(entry, files=unknown_size))
    hub.announced_sizes["model.pt"] = 1 << 60
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "not enough disk space", "UNIPAD_HOME")
    assert not [r for r in hub.requests if r[1].startswith("/cdn/")]


def test_without_torch_names_the_install(hub: HubMirror, home: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "needs PyTorch", "pip install")
    assert hub.requests == [] and staged(home) == []


def test_ctrl_c_during_download_then_resume(hub: HubMirror, home: Path, monkeypatch, capsys) -> None:
    """A real SIGINT to a real `pull` stalled mid-file; the next run continues from the bytes it kept.
    model.pt is a 24 MB blob here (content is not checked by --download-only beyond its sha256): the hub
    client writes in 10 MB chunks, so the stall at half leaves whole chunks on disk."""
    blob = MirrorFile(np.random.default_rng(0).bytes(24 << 20), lfs=True)
    hub.repos[REPO]["model.pt"] = blob
    monkeypatch.setitem(catalog.MODELS, NAME, dataclasses.replace(
        catalog.MODELS[NAME], files=catalogue_files(hub.repos[REPO])))
    hub.faults["model.pt"] = "stall"
    files = [dataclasses.asdict(f) for f in catalog.MODELS[NAME].files]
    script = ("import dataclasses, json, sys\nfrom pipeline import catalog\n"
              "files = tuple(catalog.HubFile(**f) for f in json.loads(sys.argv[1]))\n"
              "catalog.MODELS[sys.argv[2]] = dataclasses.replace(catalog.MODELS[sys.argv[2]], files=files)\n"
              "from export.__main__ import main\nsys.exit(main(['pull', sys.argv[2], '--download-only']))\n")
    # A suite started in the background by a shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: give the child the default disposition, as a terminal's Ctrl-C finds it.
    process = subprocess.Popen([sys.executable, "-c", script, json.dumps(files), NAME], cwd=ROOT, env=os.environ.copy(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert hub.stalled.wait(60), "the download never started"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert_failed_cleanly(process.returncode, err, home, "interrupted", "run the same command again to resume")
    parts = [name for name in staged(home) if name.startswith("model.pt.") and name.endswith(".part")]
    assert len(parts) == 1
    kept = next((home / "downloads").rglob(parts[0])).stat().st_size
    assert 0 < kept < len(hub.repos[REPO]["model.pt"].data)
    hub.faults.clear()
    hub.release.set()
    code, _, err = pull(capsys, "--download-only")
    assert code == 0, err[-3000:]
    assert_staged_intact(home, hub.repos[REPO])
    assert any(method == "GET" and rng == f"bytes={kept}-" for method, _, rng in hub.requests)


def test_second_pull_at_once_is_refused(hub: HubMirror, home: Path, capsys) -> None:
    from filelock import FileLock

    lock = home / "downloads" / NAME / LOCK_FILE
    lock.parent.mkdir(parents=True)
    with FileLock(lock):
        code, _, err = pull(capsys)
    assert_failed_cleanly(code, err, home, "another pull of", "is running")
    assert hub.requests == []


def test_modelscope_source(hub: HubMirror, home: Path, monkeypatch, capsys) -> None:
    """--source modelscope through ModelScope's own client, against the same loopback server."""
    pytest.importorskip("modelscope")
    ms_repo = SENSEVOICE_SMALL.source("modelscope")
    hub.repos[ms_repo.repo] = dict(hub.repos[REPO])
    del hub.repos[ms_repo.repo]["config.yaml"]
    hub.revisions.add(ms_repo.revision)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.endpoint)
    code, _, err = pull(capsys, "--source", "modelscope", "--download-only")
    assert_failed_cleanly(code, err, home, "ModelScope", "config.yaml", "404")
    hub.repos[ms_repo.repo]["config.yaml"] = hub.repos[REPO]["config.yaml"]
    code, out, err = pull(capsys, "--source", "modelscope", "--download-only")
    assert code == 0, err[-3000:]
    assert_staged_intact(home)
    assert not any("/resolve/" in path for _, path, _ in hub.requests)  # not a byte from the HF layout
