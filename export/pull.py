"""`python -m export pull NAME`: download a catalogued model's released files (pipeline/catalog.py), check
them, export them to a model directory in the cache, verify it, and print the command that serves it.

Nothing half-made is ever in UNIPAD_HOME/models: files download into UNIPAD_HOME/downloads/NAME (kept
across runs, so a second run resumes), the export goes to a hidden sibling of the target, and only a
directory that `verify` passed is renamed into place. The download staging is deleted afterwards.
Only the export step needs PyTorch; without it the command stops before downloading, saying what to install.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from pipeline.catalog import HUBS, MODELS, download_path, lookup, model_path, pull_command
from pipeline.errors import ModelLoadError
from pipeline.families import TEXT_MODELS
from pipeline.modeldir import MANIFEST_FILE, read_model_directory

from .hub import HubError, fetch_files, hf_endpoint
from .sensevoice import parse_precisions, user_path

INSTALL_EXPORT = ("pip install -e '.[export]' (without an NVIDIA GPU, first: "
                  "pip install torch --index-url https://download.pytorch.org/whl/cpu)")
EXIT_INTERRUPTED = 130
LOCK_FILE = ".lock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"catalogue name: {', '.join(sorted(MODELS))}")
    parser.add_argument("--source", choices=HUBS, help="hub to download from (default: Hugging Face; "
                        "HF_ENDPOINT selects a mirror)")
    parser.add_argument("--precision", help="graphs to export (default: the catalogue's, fp32,int8; fp32 for "
                        "qwen3-asr-0.6b, whose int8 does not keep fp32's answer)")
    parser.add_argument("--out", type=user_path, help="model directory to create (default: the cache, where "
                        "`python -m server --model NAME` finds it; $UNIPAD_HOME moves the cache)")
    parser.add_argument("--force", action="store_true", help="export again over an existing model directory")
    parser.add_argument("--download-only", action="store_true", help="download and check the released files, "
                        "then stop (no PyTorch needed; a later pull exports them without downloading again)")


def run(args: argparse.Namespace) -> int:
    entry = lookup(args.name)
    source = entry.source(args.source)
    precisions = parse_precisions(args.precision or entry.precisions)
    out = args.out or model_path(entry.name)
    serve = f"python -m server --model {entry.name if args.out is None else out}"
    if (out / MANIFEST_FILE).is_file() and not args.force:
        try:
            cached = read_model_directory(out)
        except ModelLoadError as exc:  # a file deleted or damaged since: "already there, serve it" would mislead
            raise ModelLoadError(f"{out} is damaged ({exc}); --force exports it again") from None
        if mismatched := unpinned_files(entry, cached.manifest.source):  # e.g. pulled by an older version
            raise ModelLoadError(f"{out} was exported from files that are not the release this version pins: "
                                 f"{'; '.join(mismatched)}; --force pulls it again")
        print(f"{entry.name} is already in {out} (--force exports it again)\n{next_step(cached, serve)}")
        return 0
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} already exists and is not a model directory (remove it, or choose another --out)")
    if not args.download_only:
        require_export_tools()
    staging = download_path(entry.name) / f"{source.hub}-{source.revision}"
    where = f"{hf_endpoint()}/{source.repo}" if source.hub == "hf" else f"ModelScope {source.repo}"
    staging.parent.mkdir(parents=True, exist_ok=True)
    with _only_pull(entry.name, staging.parent / LOCK_FILE):
        print(f"downloading {entry.name} from {where} (revision {source.revision}) into {staging}", flush=True)
        try:
            provenance = fetch_files(source, entry.files, staging)
        except KeyboardInterrupt:
            print(f"error: interrupted; what was downloaded is kept in {staging}: run the same command again to "
                  "resume", file=sys.stderr)
            return EXIT_INTERRUPTED
        if args.download_only:
            print(f"downloaded and checked {entry.name} in {staging}; `{pull_command(entry.name)}` exports it")
            return 0
        print(f"exporting {entry.name} ({', '.join(precisions)})", flush=True)
        export_and_verify(entry, staging, out, precisions, provenance)
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(staging.parent, ignore_errors=True)  # only the lock file is left
    _remove_if_empty(staging.parent.parent)
    print(f"{entry.name} verified and ready in {out}\n{next_step(read_model_directory(out), serve)}")
    return 0


def next_step(directory, serve: str) -> str:
    """What to do with a pulled model: serve it, or (a punctuation model, which the server does not serve yet)
    where it is read."""
    if directory.manifest.architecture in TEXT_MODELS:
        return "a punctuation model: pipeline.punctuation.load_punctuator(DIR) runs it (not served yet)"
    return f"serve it: {serve}"


def unpinned_files(entry, source: dict) -> list[str]:
    """The released files whose sha256, as a model directory's manifest records them, differ from the
    catalogue's pins (an export of a tampered or other release)."""
    recorded = (source.get("sha256") or {}) if source.get("kind") == "hub" else {}
    return [f"{f.name} sha256 {recorded[f.name]}, expected {f.sha256}" for f in entry.files
            if f.sha256 and recorded.get(f.name, f.sha256) != f.sha256]


@contextlib.contextmanager
def _only_pull(name: str, lock: Path) -> Iterator[None]:
    """One pull of a model at a time: two would append to the same partial files."""
    from filelock import FileLock, Timeout  # a dependency of huggingface_hub

    try:
        with FileLock(lock, timeout=0):
            yield
    except Timeout:
        raise HubError(f"another pull of {name} is running (lock {lock})") from None


def require_export_tools() -> None:
    """One line naming the install command when the export's packages are missing (before any download)."""
    for module in ("torch", "onnx", "sentencepiece", "yaml", "huggingface_hub"):
        try:
            importlib.import_module(module)
        except ImportError:
            what = "PyTorch" if module == "torch" else module
            raise HubError(f"the export step needs {what}, which is not installed: {INSTALL_EXPORT}") from None


def export_and_verify(entry, staging: Path, out: Path, precisions: tuple[str, ...], provenance: dict) -> None:
    """Export into a hidden sibling of `out`, run `verify` on it, and only then rename it to `out`."""
    from .verify import DEFAULT_LENGTHS, verify

    exporter = importlib.import_module(f".{entry.exporter}", __package__)
    unverified = out.parent / f".{out.name}.unverified"
    # left by a killed run (this pull holds the lock): our directory, and write_model_dir's temporary sibling of it
    for stale in [unverified, *out.parent.glob(f".{unverified.name}.*")]:
        shutil.rmtree(stale, ignore_errors=True)
    try:
        try:
            exporter.export_checkpoint(staging, unverified, precisions, entry.name, provenance)
        except ValueError as exc:  # the files are not this architecture's checkpoint: useless, so not kept
            shutil.rmtree(staging, ignore_errors=True)
            raise HubError(f"the downloaded {entry.name} files do not load as {entry.name} ({exc}); "
                           "they were deleted") from None
        report = verify(unverified, None, None, DEFAULT_LENGTHS)
        if not report["passed"]:
            raise HubError(f"the exported {entry.name} failed `verify` (max_abs_err {report['max_abs_err']:.3g}, "
                           f"tokens equal {report['tokens_equal']}, forbidden ops {report['forbidden_ops'] or 'none'}); "
                           "nothing was installed")
        if out.exists():  # --force
            shutil.rmtree(out)
        os.replace(unverified, out)
    except BaseException:
        shutil.rmtree(unverified, ignore_errors=True)
        raise


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass
