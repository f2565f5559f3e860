"""Logging that never quotes content.

An exception's message can quote input: a JSON or pydantic error quotes the
value it choked on, a KeyError its key. The worker logs what it was doing, the
exception's type and where it was raised (the stack frames, which are code),
never `str(error)` and never `exc_info=True`.

Libraries (Faust, aiokafka) log exceptions their own way, so the worker's log
formatters below drop an exception's message whoever logged it, keeping its
type and frames. `TextFormatter` writes one plain line per record (no terminal
escapes: a log collector reads it), `JsonFormatter` one JSON object per line.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Final

import orjson

# The `extra` key under which a log call passes where it was (topic, partition,
# offset, tenant, run key): fields of a JSON line, a suffix of a text line.
CONTEXT: Final = "agui"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_exception_kind(log: logging.Logger, level: int, what: str, error: BaseException,
                       where: str = "", context: dict[str, Any] | None = None) -> None:
    """Log `what` happened, the kind of `error` and its frames; never its message."""
    frames = "".join(traceback.format_tb(error.__traceback__))
    log.log(level, "%s (%s%s)\n%s", what, type(error).__name__, where, frames,
            extra=None if context is None else {CONTEXT: context})


def _exception_kind(exc_info: Any) -> str:
    """An exception as its type and frames, without its message."""
    kind, _error, trace = exc_info
    name = "exception" if kind is None else kind.__name__
    return f"{name} (message withheld)\n" + "".join(traceback.format_tb(trace))


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, one line per record, and an exception's kind."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatException(self, ei: Any) -> str:
        return _exception_kind(ei).rstrip("\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, where it was."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = getattr(record, CONTEXT, None)
        if isinstance(context, dict):
            line.update(context)
        if record.exc_info:
            line["exception"] = _exception_kind(record.exc_info)
        return orjson.dumps(line, default=str).decode()
