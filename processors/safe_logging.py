"""Logging an exception without its message.

An exception's message can quote input: a JSON or pydantic error quotes the
value it choked on, a KeyError its key. The worker logs what it was doing, the
exception's type and where it was raised (the stack frames, which are code),
never `str(error)` and never `exc_info=True`.
"""

from __future__ import annotations

import logging
import traceback


def log_exception_kind(log: logging.Logger, level: int, what: str, error: BaseException,
                       where: str = "") -> None:
    """Log `what` happened, the kind of `error` and its frames; never its message."""
    frames = "".join(traceback.format_tb(error.__traceback__))
    log.log(level, "%s (%s%s)\n%s", what, type(error).__name__, where, frames)
