"""The punctuation model the server runs beside its speech model (--punc, --no-punc, the default), checked at start.

    --punc NAME_OR_DIR   a catalogue name pulled into the cache (pipeline/catalog.py), or a model directory
    --no-punc            none, whatever the default would be
    neither              DEFAULT_PUNCTUATION when the speech model is a Paraformer that recognises Chinese and
                         that model is pulled (FunASR serves its Paraformer-large with ct-punc); else none
`chosen_punctuation` decides (server/cli.py, before the port is bound) and `read_punctuation_model` checks the
directory against the speech model (again in Server(config)): every refusal is one line naming the fix. The
worker runs the model (server/worker.py, pipeline/punctuation.py); each door asks for what its protocol has a
field for (docs/models.md, "Serving punctuation").
"""
from __future__ import annotations

from pathlib import Path

from pipeline.catalog import model_path, pull_command, resolve_model
from pipeline.errors import ModelLoadError
from pipeline.families import FAMILIES, PARAFORMER, TEXT_MODELS
from pipeline.modeldir import MANIFEST_FILE, ModelDirectory, read_model_directory
from pipeline.punctuation import punctuation_languages

from .model_info import spoken_languages

DEFAULT_PUNCTUATION = "ct-punc"  # pipeline/catalog.py's name of FunASR's ct-punc
DEFAULT_LANGUAGE = "zh"  # a Paraformer that recognises it gets the default punctuation
FIX = (f"pull it again (`{pull_command(DEFAULT_PUNCTUATION)} --force`) or export it again (`python -m export "
       "ct-punc`), or serve without punctuation (--no-punc)")


def chosen_punctuation(punc: str | Path | None, no_punc: bool, model: ModelDirectory) -> Path | None:
    """The punctuation model directory to serve beside `model` (None: none); ValueError for both flags,
    ModelLoadError for a name that is not pulled (how to pull it)."""
    if punc is not None and no_punc:
        raise ValueError("--punc and --no-punc contradict each other: give one of them")
    if no_punc:
        return None
    if punc is not None:
        return resolve_model(punc, flag="--punc")
    is_chinese_paraformer = (model.manifest.architecture == PARAFORMER.architecture
                             and DEFAULT_LANGUAGE in model.manifest.languages)
    default = model_path(DEFAULT_PUNCTUATION)
    return default if is_chinese_paraformer and (default / MANIFEST_FILE).is_file() else None


def read_punctuation_model(path: Path, model: ModelDirectory) -> ModelDirectory:
    """The punctuation model directory at `path`, checked to punctuate `model`'s text: ModelLoadError, one line
    naming the fix, for a directory with a file missing or unreadable, a speech model, another kind of model, or
    a vocabulary that reads none of the languages `model` recognises (pipeline/punctuation.py
    punctuation_languages)."""
    try:
        directory = read_model_directory(path)
    except ModelLoadError as exc:
        raise ModelLoadError(f"--punc {path}: {exc}: {FIX}", path=str(path)) from None
    architecture, name = directory.manifest.architecture, directory.manifest.name
    if architecture in FAMILIES:
        raise ModelLoadError(f"--punc {path}: {name!r} is a speech model ({architecture}), not a punctuation model: "
                             f"serve it as --model, and give --punc a punctuation model ({DEFAULT_PUNCTUATION}: "
                             f"`{pull_command(DEFAULT_PUNCTUATION)}`)", path=str(path))
    if architecture not in TEXT_MODELS:
        raise ModelLoadError(f"--punc {path}: {name!r} has architecture {architecture!r}, not a punctuation model "
                             f"({', '.join(TEXT_MODELS)}): {FIX}", path=str(path))
    reads, spoken = punctuation_languages(directory.tokens), spoken_languages(model)
    if spoken and not set(reads) & set(spoken):
        raise ModelLoadError(
            f"--punc {path}: {name!r} punctuates {', '.join(reads) or 'no language we know'}, but the model "
            f"{model.manifest.name!r} recognises {', '.join(spoken)}: serve it without --punc (--no-punc), or with a "
            f"punctuation model for its language", path=str(path))
    return directory


def punctuation_precision(directory: ModelDirectory) -> str:
    """fp32 where it was exported (FunASR's own classes; int8 would cost a third less: docs/benchmarks.md,
    "Punctuation"), else the precision there is."""
    files = directory.manifest.files
    return "fp32" if "fp32" in files else next(iter(files))
