"""Command-line options the file and mic clients share."""
from __future__ import annotations

import argparse
from typing import Any

from pipeline.errors import ProtocolError
from pipeline.hotwords import make_hotword


def add_hotword_option(parser: argparse.ArgumentParser) -> None:
    """The clients' --hotword option: args.hotword is a list for connect(hotwords=...)."""
    parser.add_argument("--hotword", action="append", default=[], type=hotword_argument, metavar="PHRASE[:BOOST]",
                        help="favour this word or phrase (repeatable), optionally with a boost: 'turn on:2.5'")


def hotword_argument(value: str) -> dict[str, Any]:
    """"turn on:2.5" -> {"text": "turn on", "boost": 2.5}; "save" gets the default boost."""
    text, _, boost = value.rpartition(":")
    try:
        number = float(boost)
    except ValueError:  # a colon that does not precede a number belongs to the phrase
        text = ""
    try:
        word = make_hotword(text, number) if text else make_hotword(value)
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return {"text": word.text, "boost": word.boost}
