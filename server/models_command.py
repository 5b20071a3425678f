"""`unipad models`: the models in the cache (pulled with `python -m export pull NAME`) and the catalogue
names not pulled yet."""
from __future__ import annotations

import argparse

from pipeline.catalog import MODELS, installed_models, pull_command, unipad_home
from pipeline.errors import ModelLoadError
from pipeline.modeldir import read_model_directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="unipad models", description=main.__doc__ or __doc__)
    parser.parse_args(argv)
    root = unipad_home()
    installed = installed_models()
    print(f"models in {root} ($UNIPAD_HOME moves it):")
    if not installed:
        print("  (none)")
    for path in installed:
        try:
            model = read_model_directory(path)
        except ModelLoadError as exc:
            repair = f" (repair: {pull_command(path.name)} --force)" if path.name in MODELS else ""
            print(f"  {path.name:<20} unreadable: {exc}{repair}")
            continue
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        source = model.manifest.source
        origin = f"{source.get('hub')}:{source.get('repo')}@{str(source.get('commit') or source.get('revision'))[:12]}" \
            if source.get("kind") == "hub" else source.get("kind", "?")
        print(f"  {path.name:<20} {','.join(sorted(model.manifest.files)):<16} {size / 1e6:8.1f} MB  {origin}")
    missing = [name for name in sorted(MODELS) if name not in {p.name for p in installed}]
    for name in missing:
        print(f"  {name:<20} not pulled: {pull_command(name)}")
    return 0
