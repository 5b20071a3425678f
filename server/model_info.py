"""What the server tells people about the model it serves, taken from the model directory alone:

    GET /v1/model        JSON {"name", "languages", "notice", "card", "punctuation"} (the page shows it above the
                         controls)
    GET /v1/model/card   the directory's README.md (its model card) as plain text; 404 when it has none
    the startup log      one line: the name, and the notice or the languages

`notice` is the manifest's one line for users (pipeline/modeldir.py), e.g. what a demo model recognises
and how to serve a real one; a model without one (every real model) is described by its name and the
languages of its prompt rows.
"""
from __future__ import annotations

from typing import Any

from pipeline.modeldir import ModelDirectory

MODEL_PATH = "/v1/model"
MODEL_CARD_PATH = "/v1/model/card"
CARD_FILE = "README.md"
NOT_LANGUAGES = ("auto", "nospeech")  # prompt rows of the language table that name no language


def spoken_languages(model: ModelDirectory) -> list[str]:
    """The languages a client may ask for, in the manifest's order (["zh", "en", "yue", "ja", "ko"])."""
    return [name for name in model.manifest.languages if name not in NOT_LANGUAGES]


def has_card(model: ModelDirectory) -> bool:
    return (model.path / CARD_FILE).is_file()


def model_info(model: ModelDirectory, punctuation: str | None = None) -> dict[str, Any]:
    """The body of GET /v1/model; `card` is the card's path on this server, or None; `punctuation` the name of the
    punctuation model that punctuates finals (--punc), or None."""
    return {"name": model.manifest.name, "languages": spoken_languages(model), "notice": model.manifest.notice,
            "card": MODEL_CARD_PATH if has_card(model) else None, "punctuation": punctuation}


def notice_line(model: ModelDirectory) -> str:
    """The startup log's description of the model: its name, then its notice (and card) or its languages."""
    if model.manifest.notice:
        card = f" (model card: {model.path / CARD_FILE})" if has_card(model) else ""
        return f"model {model.manifest.name}: {model.manifest.notice}{card}"
    return f"model {model.manifest.name}, languages {', '.join(spoken_languages(model)) or 'none listed'}"


def model_card(model: ModelDirectory) -> bytes | None:
    """The model card (Markdown, UTF-8), or None when the directory has none."""
    return (model.path / CARD_FILE).read_bytes() if has_card(model) else None
