"""The model families' table (pipeline/families): every row is served by a runtime that keeps the contract, the
architecture names are written nowhere else in serving code, and a manifest of another family is refused."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.engine import Engine
from pipeline.errors import ModelLoadError
from pipeline.families import FAMILIES, TEXT_MODELS, Runtime

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("pipeline", "server", "clients")
TABLE = ROOT / "pipeline" / "families" / "__init__.py"
# Lines that write such a name as something else: the catalogue's exporter is a module of export/ (sensevoice.py).
OTHER_MEANINGS = {"pipeline/catalog.py": "exporter="}


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_each_family_has_a_runtime_with_the_whole_contract(architecture: str) -> None:
    family = FAMILIES[architecture]
    runtime = family.runtime_class()(None)  # made before any build: it holds its engine and nothing yet
    members = [name for name in dir(Runtime) if not name.startswith("_")] + list(Runtime.__annotations__)
    assert len(members) == 12 and [name for name in members if not hasattr(runtime, name)] == []
    assert not runtime.ready and runtime.grid == ()
    assert family.signatures and all(family.signature(graph)[0] for graph in family.signatures)
    assert (ROOT / "pipeline" / "families" / family.runtime.split(".")[0]).is_dir()  # one folder per family


def test_the_architecture_names_are_written_only_in_the_table() -> None:
    names = re.compile("|".join(re.escape(f'"{name}"') for name in [*FAMILIES, *TEXT_MODELS]))
    found = [f"{path.relative_to(ROOT)}:{number}"
             for package in SERVING for path in sorted((ROOT / package).rglob("*.py")) if path != TABLE
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if names.search(line.split("#", 1)[0])
             and OTHER_MEANINGS.get(str(path.relative_to(ROOT)), "\0") not in line]
    assert found == []


def test_a_manifest_of_another_family_is_refused_by_name(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "model"
    shutil.copytree(tiny_model_dir, directory)
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    manifest["architecture"] = "whisper"
    (directory / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ModelLoadError, match="architecture 'whisper', which this server cannot serve "
                                             r"\(it serves sensevoice, paraformer, qwen3-asr\)"):
        Engine(directory)
