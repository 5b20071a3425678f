"""JSON that a client wrote: json.loads, refusing text nested past MAX_JSON_DEPTH before parsing it.

json.loads recurses once per level up to the interpreter's limit (RecursionError, an internal error to
whoever catches ValueError), and a garbage collection at that depth fails every finalizer it runs. Every
door's messages (server/), FunASR's hotword strings (pipeline/hotwords.py) and Wyoming's headers go through
loads_shallow; the numbers in them are checked with finite_number.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

MAX_JSON_DEPTH = 32  # the protocols we speak nest 4 deep at most
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def loads_shallow(text: str | bytes) -> Any:
    """json.loads for a client's text; ValueError when it is not JSON (bytes: not UTF-8) or nests past
    MAX_JSON_DEPTH."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")  # UnicodeDecodeError is a ValueError
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:  # counted in C: only such text can be too deep
        steps = (1 if b in "[{" else -1 for b in _JSON_BRACKET.findall(_JSON_STRING.sub('""', text)))
        if max(itertools.accumulate(steps), default=0) > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(text)


def finite_number(value: Any) -> bool:
    """Whether a client's JSON value is a number a float holds: not a bool, NaN or an infinity, nor an
    integer past float's range (JSON integers have any length; math.isfinite raises OverflowError on those)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
