"""Every import in the house points down (docs/architecture.md, "Layers").

Parses each module of the top-level packages with `ast` (imports inside functions and `if TYPE_CHECKING`
blocks count too) and fails on any import of one of our packages that the importing package may not use.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Which of our packages each package may import (besides itself). Serving (pipeline, server, clients)
# never imports models or export, so it never imports torch; nothing imports bench.
MAY_IMPORT = {
    "pipeline": set(),
    "models": {"pipeline"},
    "server": {"pipeline"},
    "clients": {"pipeline", "server"},  # the wire messages (server/protocol.py, server/resume.py)
    "export": {"pipeline", "models"},
    "bench": {"pipeline", "server", "clients", "models", "export"},
}
PACKAGES = set(MAY_IMPORT) | {"tests"}


def imported_packages(path: Path, package: str, root: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in one file, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, (node.module or "").split(".")[0]))
            else:  # relative: within the package unless it climbs out of it (`from ...x` from a subpackage)
                depth = len(path.relative_to(root / package).parts) - 1
                climbs_out = node.level > depth + 1
                found.append((node.lineno, (node.module or "").split(".")[0] if climbs_out else package))
    return found


def upward_imports(package: str, root: Path = ROOT) -> list[str]:
    allowed = MAY_IMPORT[package] | {package}
    return [f"{path.relative_to(root)}:{line} imports {target}"
            for path in sorted((root / package).rglob("*.py"))
            for line, target in imported_packages(path, package, root)
            if target in PACKAGES and target not in allowed]


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_no_import_points_up(package: str) -> None:
    assert upward_imports(package) == []


def test_the_map_covers_every_package_we_ship() -> None:
    """A new top-level package must take its place in MAY_IMPORT, in the installed copy's import hook
    (unipad_asr.PACKAGES) and, unless it stays in the checkout as bench does, in pyproject's package-dir."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from unipad_asr import PACKAGES as HOOKED

    in_checkout = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"unipad_asr"}
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert in_checkout == set(MAY_IMPORT) == set(HOOKED)
    assert shipped == {f"unipad_asr.{name}": name for name in set(MAY_IMPORT) - {"bench"}}


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a server module importing the client library, directly and relatively."""
    (tmp_path / "server" / "sub").mkdir(parents=True)
    (tmp_path / "server" / "a.py").write_text("def f():\n    from clients.subtitles import to_srt\n")
    (tmp_path / "server" / "sub" / "b.py").write_text("from ..protocol import Final\nfrom ...bench import x\n")
    assert upward_imports("server", tmp_path) == ["server/a.py:2 imports clients", "server/sub/b.py:2 imports bench"]
