"""What the engine does when the device fails in the middle of a run (pipeline/engine.py _infer): rebuild
every session on the same device, else on the CPU, then retry the call once."""
from __future__ import annotations

import logging

import numpy as np

from .errors import InferenceError
from .providers import SessionRunner
from .sessions import open_runner

log = logging.getLogger(__name__)


def recover(engine, failed: SessionRunner, feed: dict[str, np.ndarray], names: tuple[str, ...],
            exc: Exception) -> list[np.ndarray]:
    """Rebuild `engine` (an Engine whose run on `failed` raised `exc`) and retry that run once. A rebuilt grid
    without this shape (e.g. int8 on CPU after a GPU loss) fails the call, and the worker then retries clip
    by clip; an open shape (pipeline/shapes.py) gets its runner again."""
    log.error("%s failed (%s); rebuilding", engine.provider, exc)
    decoder = engine._decoder
    decoder_key = decoder.key_of(failed) if decoder is not None else None
    try:
        engine.rebuild()
    except Exception as again:  # noqa: BLE001 - any failure here means the device is gone
        log.error("rebuilding on %s failed (%s); continuing on CPU", engine.device, again)
        engine.rebuild("cpu")
    decoder, key = engine._decoder, (failed.batch, failed.size)
    runners = decoder.sessions if decoder_key is not None and decoder is not None else engine._sessions
    key = decoder_key if runners is not engine._sessions else key
    session = runners.get(key)
    if session is None and engine.policy is not None and engine.policy.step:
        session = open_runner(runners, key, failed.batch, failed.size, engine.stats)
    if session is None:
        raise InferenceError(f"inference failed and the rebuilt engine has no {failed.batch} x {failed.size} "
                             f"session") from exc
    return engine._infer(session, feed, names, recover=False)
