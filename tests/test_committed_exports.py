"""The exports committed in tests/fixtures/exports are what the exporter writes today: every file they were
made from is unchanged (tests/fixtures/make_exports.py). A change to the exporter, the models or the files
they read makes the suite export in the run instead (slower, still right) and fails here until the script
is run again."""
from __future__ import annotations

from fixtures.make_exports import EXPORTS, OUT, SOURCES, changed_sources


def test_committed_exports_are_made_from_todays_sources():
    changed = changed_sources()
    assert not changed, (f"tests/fixtures/exports was made from other versions of {', '.join(changed[:10])}: "
                         "run `python tests/fixtures/make_exports.py` and commit tests/fixtures/exports")


def test_every_export_is_committed_with_what_it_was_made_from():
    assert sorted(p.name for p in OUT.iterdir() if p.is_dir()) == sorted(EXPORTS)
    assert all((OUT / name / "manifest.json").is_file() for name in EXPORTS)
    text = SOURCES.read_text(encoding="utf-8")
    for needed in ("models/sensevoice.py", "models/paraformer.py", "models/qwen3_asr.py", "export/onnx_export.py",
                   "tests/fixtures/paraformer/model.pt", "tests/fixtures/qwen3/model.pt",
                   "tests/fixtures/make_exports.py"):
        assert f'"{needed}"' in text, f"SOURCES.json does not record {needed}"
