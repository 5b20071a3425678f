"""Unipad ASR installed: the whole project under one import name, `unipad_asr`.

The repository keeps its top-level packages (pipeline, server, models, export, clients; bench in a checkout
only), and its modules import one another by those names (`from pipeline.audio import SAMPLE_RATE`).
Installed side by side in site-packages, names as common as `server` and `models` would collide with other
projects' modules: ours would shadow theirs, or theirs ours (a user's own server.py in the folder they start
`unipad` from, say).

So an installed copy holds them as `unipad_asr.pipeline`, `unipad_asr.server`, ..., and site-packages gains
this one name. Importing this package adds an import hook for those names alone: it loads each of our
modules from its source with every absolute import of a sibling package prefixed (`from pipeline.audio` is
compiled as `from unipad_asr.pipeline.audio`). An installed copy therefore never asks sys.path for `server`
or `pipeline` and never registers them in sys.modules: whatever else the process imports under those names
stays its own. The commands (`unipad`, `unipad-export`, `unipad-file`, `unipad-mic`) and the library
(`from unipad_asr.clients import connect`) all go through it, from a wheel and from an editable install
alike; a checkout also runs on the plain names (`python -m server` in its root).

Module names held in strings are written relative to their package (`importlib.import_module(".pull",
__package__)`), so they resolve under either name.
"""
from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

# The project's top-level packages, as its modules import them.
PACKAGES = ("pipeline", "server", "models", "export", "clients", "bench")

_HERE = Path(__file__).resolve().parent
# A wheel carries the packages inside this folder; a checkout (an editable install) has them beside it.
SOURCE_ROOT = _HERE if (_HERE / "server" / "__init__.py").is_file() else _HERE.parent


class _PrefixImports(ast.NodeTransformer):
    """`from pipeline.x import y` -> `from unipad_asr.pipeline.x import y`; `import pipeline.x as p` likewise.
    Relative imports (`from .x import y`) stay as they are: they already follow the module's own name."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level == 0 and node.module and node.module.partition(".")[0] in PACKAGES:
            node.module = f"{__name__}.{node.module}"
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            if alias.name.partition(".")[0] not in PACKAGES:
                continue
            if alias.asname is None and "." in alias.name:  # binds the top-level name, which no longer exists
                raise ImportError(f"{self.filename}:{node.lineno}: write `import {alias.name} as NAME` or "
                                  f"`from ... import`: a bare dotted import of a project package cannot be "
                                  f"renamed under {__name__}")
            alias.asname = alias.asname or alias.name
            alias.name = f"{__name__}.{alias.name}"
        return node


class _PrefixedSourceLoader(importlib.machinery.SourceFileLoader):
    """Loads one of our modules from its source with its imports prefixed (_PrefixImports)."""

    def source_to_code(self, data, path, *, _optimize=-1):  # type: ignore[override]
        tree = _PrefixImports(str(path)).visit(ast.parse(data, filename=str(path)))
        return compile(tree, path, "exec", dont_inherit=True, optimize=_optimize)

    def get_code(self, fullname: str):
        # Never the __pycache__ bytecode: in a checkout it is the plain names' code of the same file.
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class _ProjectFinder(importlib.abc.MetaPathFinder):
    """Finds `unipad_asr.<package>[.<module>...]` under SOURCE_ROOT; leaves every other name alone."""

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 (the finder protocol's types)
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name.partition(".")[0] not in PACKAGES:
            return None
        base = SOURCE_ROOT.joinpath(*name.split("."))
        if (base / "__init__.py").is_file():
            origin, locations = base / "__init__.py", [str(base)]
        elif base.with_suffix(".py").is_file():
            origin, locations = base.with_suffix(".py"), None
        else:
            return None
        return importlib.util.spec_from_file_location(fullname, origin, submodule_search_locations=locations,
                                                      loader=_PrefixedSourceLoader(fullname, str(origin)))


if not any(isinstance(finder, _ProjectFinder) for finder in sys.meta_path):
    # First: ahead of the path finder, which would load these files without the prefixes.
    sys.meta_path.insert(0, _ProjectFinder())
