"""The one exception tree of Unipad ASR.

    UnipadError                      root: everything we raise on purpose
    ├── AudioFormatError             unsupported or malformed audio (rate, encoding, odd byte count, NaN)
    ├── ProtocolError                a client broke the wire protocol (bad JSON, unknown or misordered message)
    ├── AuthenticationError          missing or wrong token, origin not allowed
    ├── OverloadError                no capacity: too many sessions, a full queue, audio faster than real time
    ├── ModelLoadError               a model directory that is missing, incomplete or not ours
    ├── ProviderError                an explicitly requested execution provider cannot start
    └── InferenceError               a model run failed
        └── UnwarmedShapeError       a call whose input shape no session was warmed with

Each error has a stable machine-readable `code` (sent to clients in `error` messages) and builds its
message from structured fields. Only the server's connection layer turns errors into close codes.
"""
from __future__ import annotations


QUOTED_LIMIT = 64  # characters of a client's value an error message repeats (a 100 KB value is cut)


def quoted(value: object, limit: int = QUOTED_LIMIT) -> str:
    """repr() of a client's value for an error message, cut to `limit` characters with its full length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(str(value))} characters)"


class UnipadError(Exception):
    """Root of every error Unipad ASR raises on purpose."""

    code = "internal_error"

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __str__(self) -> str:
        return self.message


class AudioFormatError(UnipadError):
    code = "unsupported_audio"


class ProtocolError(UnipadError):
    code = "protocol_error"

    def __init__(self, message: str, code: str | None = None, **fields: object) -> None:
        super().__init__(message, **fields)
        if code is not None:
            self.code = code


class AuthenticationError(UnipadError):
    code = "unauthorized"


class OverloadError(UnipadError):
    code = "overloaded"


class ModelLoadError(UnipadError):
    code = "model_load_failed"


class ProviderError(UnipadError):
    code = "provider_unavailable"


class InferenceError(UnipadError):
    code = "inference_failed"


class UnwarmedShapeError(InferenceError):
    code = "unwarmed_shape"
