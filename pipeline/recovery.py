"""What the engine does when the device fails in the middle of a run (pipeline/engine.py infer_session):
rebuild every session on the same device, else on the CPU, then retry the call once."""
from __future__ import annotations

import logging

import numpy as np

from .errors import InferenceError
from .providers import SessionRunner

log = logging.getLogger(__name__)


def recover(engine, failed: SessionRunner, feed: dict[str, np.ndarray], names: tuple[str, ...],
            exc: Exception) -> list[np.ndarray]:
    """Rebuild `engine` (an Engine whose run on `failed` raised `exc`) and retry that run once on the rebuilt
    runner of the same place (the family's Runtime.key_of / runner_at). A rebuilt engine without this shape
    (e.g. int8 on CPU after a GPU loss) fails the call, and the worker then retries clip by clip; an open
    shape (pipeline/shapes.py) gets its runner again."""
    log.error("%s failed (%s); rebuilding", engine.provider, exc)
    key = engine.runtime.key_of(failed)
    try:
        engine.rebuild()
    except Exception as again:  # noqa: BLE001 - any failure here means the device is gone
        log.error("rebuilding on %s failed (%s); continuing on CPU", engine.device, again)
        engine.rebuild("cpu")
    session = engine.runtime.runner_at(key) if key is not None else None
    if session is None:
        raise InferenceError(f"inference failed and the rebuilt engine has no {failed.batch} x {failed.size} "
                             f"session") from exc
    return engine.infer_session(session, feed, names, recover=False)
