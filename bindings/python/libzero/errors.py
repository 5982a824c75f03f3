"""Exceptions: one class per libzero status code, each carrying the engine's message.

Every class derives from :class:`ZeroError`; where a Python built-in means the same thing the class derives from it
too, so ``except ValueError`` catches a bad argument or config and ``except TimeoutError`` a collective that timed
out.
"""

from __future__ import annotations

import builtins


class ZeroError(Exception):
    """A libzero call failed. ``status`` is the C status code, ``message`` the engine's explanation."""

    status: int = 8

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgumentError(ZeroError, ValueError):
    """A bad argument: an unknown id, a shape that does not fit, a missing value (ZERO_ERR_INVALID_ARGUMENT)."""

    status = 1


class InvalidStateError(ZeroError, RuntimeError):
    """A call in the wrong order, e.g. step() before finalize() (ZERO_ERR_INVALID_STATE)."""

    status = 2


class StaleViewError(InvalidStateError):
    """A view of engine memory used after its unit was released (or its gradient declared ready)."""


class ConfigError(ZeroError, ValueError):
    """The config is malformed, has an unknown key or a value of the wrong type (ZERO_ERR_CONFIG)."""

    status = 3


class UnsupportedError(ZeroError, NotImplementedError):
    """A valid request this version does not support (ZERO_ERR_UNSUPPORTED)."""

    status = 4


class MismatchError(ZeroError):
    """Ranks disagree: registration, config, or which collective they call (ZERO_ERR_MISMATCH)."""

    status = 5


class CommError(ZeroError):
    """The communication backend failed (ZERO_ERR_COMM); the base of the errors that involve other ranks."""

    status = 6


class OutOfMemoryError(ZeroError, MemoryError):
    """An allocation failed (ZERO_ERR_OUT_OF_MEMORY)."""

    status = 7


class InternalError(ZeroError):
    """A bug in libzero; please report it with the message (ZERO_ERR_INTERNAL)."""

    status = 8


class CheckpointCorruptError(ZeroError):
    """A checkpoint file is missing, truncated or fails its checksum (ZERO_ERR_CHECKPOINT_CORRUPT)."""

    status = 9


class FileSystemError(ZeroError, OSError):
    """The file system refused: no space, permissions (ZERO_ERR_IO)."""

    status = 10

    def __init__(self, message: str, status: int | None = None) -> None:
        # OSError's constructor reads (errno, strerror) from two arguments; give it the message alone.
        ZeroError.__init__(self, message, status)


class RemoteError(CommError):
    """Another rank failed; the message names the rank and its error (ZERO_ERR_REMOTE)."""

    status = 11


class TimeoutError(CommError, builtins.TimeoutError):  # noqa: A001 - libzero.errors.TimeoutError on purpose
    """A collective did not complete within the timeout; the message says who is missing (ZERO_ERR_TIMEOUT)."""

    status = 12


class AbortedError(CommError):
    """The engine (or another on its communicator) was aborted (ZERO_ERR_ABORTED)."""

    status = 13


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        InvalidStateError,
        ConfigError,
        UnsupportedError,
        MismatchError,
        CommError,
        OutOfMemoryError,
        InternalError,
        CheckpointCorruptError,
        FileSystemError,
        RemoteError,
        TimeoutError,
        AbortedError,
    )
}


def _from_status(status: int, message: str) -> ZeroError:
    """The exception for a status code (used by the native module)."""
    cls = _BY_STATUS.get(status, ZeroError)
    return cls(message, status)


__all__ = [
    "ZeroError",
    "InvalidArgumentError",
    "InvalidStateError",
    "StaleViewError",
    "ConfigError",
    "UnsupportedError",
    "MismatchError",
    "CommError",
    "OutOfMemoryError",
    "InternalError",
    "CheckpointCorruptError",
    "FileSystemError",
    "RemoteError",
    "TimeoutError",
    "AbortedError",
]
