"""How a worker stops at once, without a commit, when going on would break its
guarantees: what a kill -9 does, which the recovery tests prove safe."""

from __future__ import annotations

import logging
import os
from typing import NoReturn

from processors.safe_logging import log_exception_kind

log = logging.getLogger("agui_stream")

EXIT_UNSENT = 70  # EX_SOFTWARE: outputs could not be sent (see stop_without_commit)
EXIT_CONFIGURATION = 2  # a configuration that would break the guarantees


def stop_without_commit(what: str, error: BaseException) -> NoReturn:
    """Exit at once: `what` could not be sent, so the records behind it must not commit.

    Faust would go on without them (and, on a graceful stop, commit past
    them). Exiting without a commit is what a kill -9 does, which the recovery
    test proves safe: the open transactions abort and the restarted worker
    processes the records again from the last commit. Only a producer that
    cannot send leads here, never a record's content.
    """
    # The exception's type and frames only: its message could quote content.
    log_exception_kind(log, logging.CRITICAL, f"could not send {what}; exiting without a"
                       " commit so that they are processed again after a restart", error)
    logging.shutdown()
    os._exit(EXIT_UNSENT)


def stop_for_configuration(problem: str) -> NoReturn:
    """Exit at once, without a commit, on a configuration found wrong while running
    (what a kill does: safe); the same exit code as a wrong configuration at start."""
    log.critical("configuration error: %s; stopping", problem)
    logging.shutdown()
    os._exit(EXIT_CONFIGURATION)
