"""Models by name: what `python -m export pull NAME` downloads, and where the server finds it afterwards.

    UNIPAD_HOME/models/NAME/       an exported, verified model directory (pipeline/modeldir.py)
    UNIPAD_HOME/downloads/NAME/    the released files while they download (resumable), deleted once exported

UNIPAD_HOME defaults to the user's cache directory (~/.cache/unipad, %LOCALAPPDATA%\\unipad,
~/Library/Caches/unipad). Importable without torch or a hub client: the server resolves names with it.

Adding a model: one `CatalogModel` in MODELS below, whose `exporter` module of export/ has
`export_checkpoint(directory, out, precisions, name, source) -> Path` (export/sensevoice.py is the
example) turning the downloaded released files into a model directory.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError
from .modeldir import MANIFEST_FILE

HOME_ENV = "UNIPAD_HOME"
MODELS_SUBDIR = "models"
DOWNLOADS_SUBDIR = "downloads"
HUBS = ("hf", "modelscope")


@dataclass(frozen=True)
class HubFile:
    """A released file. `size` (bytes) and `sha256` of the pinned release (where each came from: beside
    the entry); None: checked against what the hub reports at download time instead (its size header,
    and its LFS sha256 when it sends one)."""

    name: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class HubSource:
    hub: str  # "hf" or "modelscope"
    repo: str  # e.g. "FunAudioLLM/SenseVoiceSmall"
    revision: str  # a commit id pins the files the sizes and hashes belong to; a branch follows it


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    exporter: str  # the module of export/ with export_checkpoint(...), see the module docstring
    sources: tuple[HubSource, ...]  # in order of preference
    files: tuple[HubFile, ...]
    precisions: str = "fp32,int8"  # what `pull` exports unless told: int8 where it keeps fp32's answer (issue 40)

    def source(self, hub: str | None) -> HubSource:
        """The preferred source, or the one on `hub`."""
        for source in self.sources:
            if hub is None or source.hub == hub:
                return source
        raise ValueError(f"{self.name} has no {hub} source (has {', '.join(s.hub for s in self.sources)})")


# SenseVoiceSmall as FunAudioLLM published it on Hugging Face at commit 3847d57b. Where each pin comes from:
# - model.pt, the .bpe.model (LFS files): Hugging Face's LFS metadata for that commit (X-Linked-Size /
#   X-Linked-Etag), as quoted by several independent projects pinning the same commit.
# - am.mvn, config.yaml (plain git files: the hub's etag is a git blob id, no sha256): the sizes and sha256
#   that independent projects pin for this commit (e.g. lzjever/botified-asr's model_artifacts tests, with the
#   same model.pt and .bpe.model values as above) and for ModelScope's iic/SenseVoiceSmall (e.g.
#   mefengl/SenseVoiceSmall-coreml's manifest.json). am.mvn was also checked byte for byte: a public
#   verbatim copy of its text (FunASR's 80 CMVN means and scales, 7 times each) hashes to the pin.
# A copy with other bytes (a mirror's tampered am.mvn changes every feature) is refused and deleted.
# ModelScope's iic/SenseVoiceSmall serves the same files (the same sha256 for model.pt, am.mvn and the
# .bpe.model in those projects; config.yaml's is also the one pinned for its iic/SenseVoiceSmall-onnx).
SENSEVOICE_SMALL = CatalogModel(
    name="sensevoice-small",
    description="SenseVoiceSmall: zh, en, yue, ja, ko speech recognition with language, emotion and event tags",
    exporter="sensevoice",
    sources=(
        HubSource("hf", "FunAudioLLM/SenseVoiceSmall", "3847d57b6bdf2dd8875cb1508d2af43d80a16bf7"),
        HubSource("modelscope", "iic/SenseVoiceSmall", "master"),
    ),
    files=(
        HubFile("model.pt", 936_291_369, "833ca2dcfdf8ec91bd4f31cfac36d6124e0c459074d5e909aec9cabe6204a3ea"),
        HubFile("chn_jpn_yue_eng_ko_spectok.bpe.model", 377_341,
                "aa87f86064c3730d799ddf7af3c04659151102cba548bce325cf06ba4da4e6a8"),
        HubFile("am.mvn", 11_203, "29b3c740a2c0cfc6b308126d31d7f265fa2be74f3bb095cd2f143ea970896ae5"),
        HubFile("config.yaml", 1_855, "f71e239ba36705564b5bf2d2ffd07eece07b8e3f2bbf6d2c99d8df856339ac19"),
    ),
)

# Qwen3-ASR-0.6B as Qwen published it on Hugging Face at commit 5eb14417. Where the pins come from: no hub
# is reachable where this was written, so the sizes and sha256 (the hub's LFS values for the weights) are
# those that independent public projects pin for this commit, found with a code search on 2026-11-25: an
# OpenVINO export checker lists every file of the commit with size and sha256; model.safetensors' and
# config.json's pins recur in at least four more projects, tokenizer_config.json's and vocab.json's in five.
# merges.txt (the BPE merges, to encode a context, i.e. hotwords, for the prompt): 1,671,853 bytes, sha256
# 8831e4f1..., pinned for this commit by independent projects found with a code search on 2026-11-26 (a
# model registry listing each file's resolve URL at 5eb14417 with size and sha256, a catalogue pinning
# the commit's nine files, an MLX conversion's file list, an install script's QWEN_SHA_MERGES); the same
# pin recurs for Qwen3-ASR-1.7B and Qwen3-ForcedAligner-0.6B. Checked byte for byte too: a public copy of
# Qwen's tokenizer files (vocab.json with this catalogue's sha256) holds merges.txt with CRLF line ends;
# with LF ends it is 1,671,853 bytes with this sha256.
QWEN3_ASR_0_6B = CatalogModel(
    name="qwen3-asr-0.6b",
    description="Qwen3-ASR-0.6B: 30 languages and 22 Chinese dialects, language identification (LLM decoder)",
    exporter="qwen3_asr",
    sources=(HubSource("hf", "Qwen/Qwen3-ASR-0.6B", "5eb144179a02acc5e5ba31e748d22b0cf3e303b0"),),
    precisions="fp32",  # no int8 recipe tried keeps fp32's greedy tokens (export/qwen3_quantize.py)
    files=(
        HubFile("config.json", 6_193, "76d3ae4601ce939830b2517f4a6cadb86cc51316c3900af6b020b051c21a478c"),
        HubFile("model.safetensors", 1_876_091_704,
                "79d6cbd4c98c7bbffe9db2edac07f56cd6637d0d5944b27f6c2b8353840323ea"),
        HubFile("vocab.json", 2_776_833, "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910"),
        HubFile("merges.txt", 1_671_853, "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5"),
        HubFile("tokenizer_config.json", 12_487,
                "4942d005604266809309cabc9f4e9cb89ce855d59b14681fdc0e1cc62ea26c4c"),
    ),
)

# Qwen3-ASR-1.7B as Qwen published it on Hugging Face at commit 7278e1e7, its weights in two shards and an
# index. Found as the 0.6B pins were (a code search on 2026-11-26; no hub is reachable here): a desktop
# dictation app's downloader pins all seven files below with size and sha256 at this commit; a Python ASR
# project pins the same sizes and sha256 for every file of ModelScope's copy (Qwen/Qwen3-ASR-1.7B there);
# a build script pins the same sha256 at this commit, and at least three more projects the two shards'.
# The tokenizer files are the 0.6B's (the same sizes and sha256). merges.txt is downloaded too: the BPE
# merges that encoding text (context biasing) needs.
QWEN3_ASR_1_7B = CatalogModel(
    name="qwen3-asr-1.7b",
    description="Qwen3-ASR-1.7B: the larger, more accurate Qwen3-ASR (30 languages, 22 Chinese dialects)",
    exporter="qwen3_asr",
    sources=(HubSource("hf", "Qwen/Qwen3-ASR-1.7B", "7278e1e70fe206f11671096ffdd38061171dd6e5"),),
    precisions="fp32",  # as 0.6B's: no int8 recipe tried kept fp32's greedy tokens at 0.6B
    files=(
        HubFile("config.json", 6_194, "2e74a751548b8ad7d7526d29365ad8144c345d8b412b1152d25dc6698452712f"),
        HubFile("model.safetensors.index.json", 64_821,
                "f994739fe38e5210b9e3e8ce6c6307315e2ceac3cb630e7b7414d69dce520f60"),
        HubFile("model-00001-of-00002.safetensors", 4_220_320_824,
                "a4cd1f1a04d90b757dc7f7dd26254e69a013b19e80efe590a83c6a3bde8608d6"),
        HubFile("model-00002-of-00002.safetensors", 478_200_688,
                "6e0b9d9e09e2e0238e7ef3cc8a484ab387e91b90f1900bedf88bc92d7929ccfc"),
        HubFile("vocab.json", 2_776_833, "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910"),
        HubFile("tokenizer_config.json", 12_487,
                "4942d005604266809309cabc9f4e9cb89ce855d59b14681fdc0e1cc62ea26c4c"),
        HubFile("merges.txt", 1_671_853, "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5"),
    ),
)

# Paraformer-large (FunASR's plain Paraformer: SANMEncoder, CifPredictorV2, ParaformerSANMDecoder, 8404 tokens) as
# FunASR published it on Hugging Face as funasr/paraformer-zh at commit d7811ee3 (the plain model there; FunASR's
# ModelScope alias `paraformer-zh` names SeACo-Paraformer instead, which export/paraformer.py refuses). Found with a
# code search on 2026-11-29 (no hub is reachable where this was written). Where each pin comes from:
# - the commit: pinned for funasr/paraformer-zh by independent projects (nezqt3/smartmed-copilot's
#   services/asr/app.py, with model.pt's sha256 in services/asr/download_model.py; a download script running
#   `hf download funasr/paraformer-zh --revision d7811ee3...`; a desktop app's PARAFORMER_MODEL_REVISION; an ASR
#   evaluation harness's list of sources), and an audio-QC project's generated judge page lists every file of that
#   commit as the hub's tree metadata gives it: size, and the LFS sha256 or the git blob id.
# - model.pt (LFS): 880,502,012 bytes there, sha256 5bba782a... (that page's prefix, in full in smartmed-copilot's
#   download_model.py); the same size and sha256 are pinned by several projects for ModelScope's original below
#   (at its tag v2.0.4, and at its commit ff922d0e).
# - am.mvn, tokens.json (plain git files: no publisher sha256): each checked byte for byte. am.mvn's 11,203 bytes
#   are in FunASR's own repository (modelscope/FunASR, runtime/triton_gpu/model_repo_paraformer_large_online/
#   lfr_cmvn_pe/am.mvn) and in manyeyes/AliParaformerAsr (commit a1e3cc49, AliParaformerAsr/
#   speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch/am.mvn): git blob 681910cd1ab6458b..., the
#   blob the judge page lists; its sha256 is SenseVoiceSmall's (above), also pinned for ModelScope's SeACo and
#   contextual Paraformers. tokens.json is the 8404 tokens of that AliParaformerAsr directory's tokens.txt written
#   as FunASR writes it (json.dumps, indent=4, ensure_ascii=False, no final newline): 93,676 bytes, git blob
#   f8bc9c31ab1ba458... (the judge page's), sha256 2b20c2b1..., the value independent projects pin for the
#   tokens.json of ModelScope's Paraformer-large ONNX export and of its SeACo and contextual Paraformers.
# - config.yaml: 2,509 bytes (the judge page's size). Its sha256 could not be pinned: no project found pins it, and
#   no public copy matching its git blob (c0a9f403c8e62017...) was found (FunASR's template.yaml, in any of its
#   versions, is not it). So it is checked by size here, and by the export's strict reading (the architecture,
#   the frontend and every dimension against the checkpoint's tensors).
# seg_dict (8.3 MB, English word pieces for hotwords and training) and configuration.json are not downloaded: the
# export reads neither. ModelScope's original iic/speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch
# names its files as the HF copy does (model.pt, config.yaml, am.mvn, tokens.json), so one file list serves both
# sources; its tag v2.0.4 is the revision FunASR's own examples download, and the one the model.pt pins above were
# made at. Its other three files were not compared with the HF copy's: one that differs is refused like a tampered
# file, naming it.
PARAFORMER_LARGE = CatalogModel(
    name="paraformer-large",
    description="Paraformer-large (paraformer-zh): Mandarin speech recognition with token times, non-autoregressive",
    exporter="paraformer",
    sources=(
        HubSource("hf", "funasr/paraformer-zh", "d7811ee3ac581fbcfdeb37c98c6ba674028433dc"),
        HubSource("modelscope", "iic/speech_paraformer-large_asr_nat-zh-cn-16k-common-vocab8404-pytorch", "v2.0.4"),
    ),
    files=(
        HubFile("model.pt", 880_502_012, "5bba782a5e9196166233b9ab12ba04cadff9ef9212b4ff6153ed9290ff679025"),
        HubFile("config.yaml", 2_509),  # size only: no public sha256 (above)
        HubFile("am.mvn", 11_203, "29b3c740a2c0cfc6b308126d31d7f265fa2be74f3bb095cd2f143ea970896ae5"),
        HubFile("tokens.json", 93_676, "2b20c2b12572d682afff84ce1c8d560f67b8b32a4c1f21567411d141ed352127"),
    ),
)

# FunASR's CT-Transformer punctuation model as Hugging Face serves it: FunASR's "ct-punc" there is funasr/ct-punc
# (funasr/download/name_maps_from_hub.py), the 471,067-word zh-en model that ModelScope holds as
# iic/punc_ct-transformer_cn-en-common-vocab471067-large. Where the pins come from (a code search on 2026-11-29;
# no hub is reachable here):
# - the commit d0e55e2b: pinned for funasr/ct-punc by four independent projects (a transcript pipeline's FunASR
#   backend, two desktop apps' model tables, a provisioning script that reads the hub's file metadata at it).
# - model.pt's size, 1,125,507,622 bytes: a runtime that lists this repository's files (its tokens.json of 471,067
#   words), and the same size in two independent download manifests of ModelScope's copy (v2.0.4).
# - Not found: any file's sha256, and config.yaml's and tokens.json's sizes here (ModelScope's copies are 812 and
#   8,280,697 bytes; this repository's may differ). Left None: checked at download against what the hub reports
#   (the size, and the LFS sha256 of model.pt and tokens.json; config.yaml, a plain git file, has none, so only
#   the exporter's checks of it stand for a pin). tests/export/test_pull.py lists them as not yet pinned.
# The repository has no jieba dictionary (ModelScope's copy has one), so FunASR splits Chinese text into
# characters, as pipeline/punctuation.py does. The 272,727-word model (FunASR's "ct-punc-c") is on ModelScope only
# (iic/punc_ct-transformer_zh-cn-common-vocab272727-pytorch, revision v2.0.4 in FunASR's examples), with no
# public pins found: `python -m export ct-punc --checkpoint DIR` exports a downloaded copy.
CT_PUNC = CatalogModel(
    name="ct-punc",
    description="CT-Transformer punctuation (FunASR's ct-punc: Chinese and English, 471,067 words)",
    exporter="ct_punc",
    sources=(HubSource("hf", "funasr/ct-punc", "d0e55e2b8722a78b63705ff443d09c4f86e5d750"),),
    files=(HubFile("model.pt", 1_125_507_622), HubFile("config.yaml"), HubFile("tokens.json")),
)

MODELS: dict[str, CatalogModel] = {m.name: m for m in (SENSEVOICE_SMALL, PARAFORMER_LARGE, QWEN3_ASR_0_6B,
                                                       QWEN3_ASR_1_7B, CT_PUNC)}


def unipad_home() -> Path:
    """$UNIPAD_HOME, else the platform's per-user cache directory plus `unipad`."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "unipad"


def model_path(name: str) -> Path:
    return unipad_home() / MODELS_SUBDIR / name


def download_path(name: str) -> Path:
    return unipad_home() / DOWNLOADS_SUBDIR / name


def lookup(name: str) -> CatalogModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})")
    return MODELS[name]


def pull_command(name: str) -> str:
    return f"python -m export pull {name}"


def resolve_model(value: str | Path, flag: str = "--model") -> Path:
    """A --model (or `flag`) value to a model directory: an existing directory as given, else a catalogue name
    in the cache. Raises ModelLoadError with one line saying how to get the model."""
    path, name = Path(value).expanduser(), str(value)  # "~/x" quoted, or from a Windows shell that leaves it
    if path.is_dir() or name not in MODELS and (path.is_absolute() or len(path.parts) > 1):
        return path  # a path: read_model_directory reports what is wrong with it
    if name in MODELS:
        cached = model_path(name)
        if not (cached / MANIFEST_FILE).is_file():
            raise ModelLoadError(f"model {name} is not pulled yet (looked in {cached}): run `{pull_command(name)}`",
                                 path=str(cached))
        return cached
    raise ModelLoadError(
        f"{flag} {name}: no such directory, and not a known model name ({', '.join(sorted(MODELS))}); "
        f"get one with `{pull_command('NAME')}`", path=name)


def installed_models() -> list[Path]:
    """Model directories in the cache (names starting with a dot are unfinished work), sorted by name."""
    root = unipad_home() / MODELS_SUBDIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_FILE).is_file())
