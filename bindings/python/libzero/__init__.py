"""libzero: a ZeRO training engine (sharded optimizer state, gradients and parameters) behind a stable C ABI.

    import libzero
    with libzero.Engine({"train_batch_size": 8, "zero_optimization": {"stage": 2},
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}) as engine:
        w = engine.add_param("w", (4, 3), init=np.ones((4, 3), np.float32))
        engine.finalize()
        with engine.gathered(0):
            engine.grad(w)[...] += 0.5      # your backward adds the gradient here
            engine.grad_ready(w)
        engine.backward_end()
        engine.step()

See docs/python.md for the whole API and libzero.torch for PyTorch models.
"""

from __future__ import annotations

import logging as _logging

from . import _native
from ._dtypes import HAVE_ML_DTYPES
from .comm import Comm, Transport
from .engine import Engine, StepResult, config_check
from . import errors
from .errors import *  # noqa: F401,F403 - the exception classes, listed in errors.__all__
from .views import View

__version__ = "0.4.0"

_LEVELS = {"off": 0, "error": 1, "warning": 2, "info": 3, "debug": 4}
_TO_LOGGING = {1: _logging.ERROR, 2: _logging.WARNING, 3: _logging.INFO, 4: _logging.DEBUG}


def library_version() -> str:
    """The version of the libzero.so this package runs on."""
    return str(_native.version())


def log_to_python(level: str = "warning") -> None:
    """Sends libzero's log messages up to ``level`` ("off", "error", "warning", "info", "debug") to the logging
    module's "libzero" logger instead of stderr."""
    if level not in _LEVELS:
        raise ValueError(f"level must be one of {', '.join(_LEVELS)}")
    logger = _logging.getLogger("libzero")

    def sink(lvl: int, rank: int, message: str) -> None:
        logger.log(_TO_LOGGING.get(lvl, _logging.INFO), "[rank %d] %s", rank, message)

    _native.set_log_callback(sink, _LEVELS[level])


__all__ = [
    "Comm",
    "Transport",
    "Engine",
    "StepResult",
    "View",
    "config_check",
    "library_version",
    "log_to_python",
    "HAVE_ML_DTYPES",
    *errors.__all__,
]
