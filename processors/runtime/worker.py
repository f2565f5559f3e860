"""`agui-stream worker` and `agui-stream create-topics`."""

from __future__ import annotations

import asyncio
import logging
import logging.config
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from processors.config import ConfigError, Settings
from processors.runtime.collector import tune_collector
from processors.runtime.kafka_access import startup_facts
from processors.runtime.topic_admin import TopicsNotCreated, create_topics
from processors.safe_logging import JsonFormatter, TextFormatter

log = logging.getLogger("agui_stream")
EXIT_NOT_STOPPED = 75  # EX_TEMPFAIL: stopping took longer than AGUI_SHUTDOWN_TIMEOUT_SECONDS


def load_settings() -> Settings | None:
    try:
        return Settings.from_env()
    except ConfigError as error:
        sys.stderr.write(f"agui-stream: configuration error: {error}\n")
        return None


def run_create_topics(tenants: list[str] | None = None) -> int:
    """The service's topics, or (`tenants`) only those tenants' own."""
    settings = load_settings()
    if settings is None:
        return 2
    try:
        created = asyncio.run(create_topics(settings, include_inputs=True, tenants=tenants))
    except TopicsNotCreated as error:
        sys.stderr.write(f"agui-stream: {error}\n")
        return 2
    print(f"created: {', '.join(created) if created else 'nothing (all topics exist)'}")
    return 0


def _worker_class(base: type[Any], shutdown_timeout: float) -> type[Any]:
    """Faust's worker with signal handlers that cannot leak reasoning or hang.

    mode's worker answers SIGUSR1 by writing every thread's stack with each
    frame's local variables (record values, reasoning text) and SIGUSR2 by
    starting pdb on a terminal-less process. Here SIGUSR1 logs where each task
    waits (code locations only) and SIGUSR2 is ignored. A stop that has not
    finished `shutdown_timeout` seconds after SIGTERM or SIGINT (a broker gone:
    the consumer thread waits on it for ever) ends the process without a
    commit, which is what a kill does and is safe.
    """
    from processors.runtime.diagnostics import log_partition_state, log_task_stacks

    class SignalSafeWorker(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Faust's progress spinner writes terminal escapes into every log line
            # (ESC[?25l...): a worker's log is read by collectors, not a terminal.
            self.spinner = None

        def _on_sigterm(self) -> None:
            _exit_unless_stopped_within(shutdown_timeout)
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            _exit_unless_stopped_within(shutdown_timeout)
            super()._on_sigint()

        def _on_sigusr1(self) -> None:
            log_task_stacks(self.app)
            log_partition_state(self.app)

        def _on_sigusr2(self) -> None:
            log.warning("SIGUSR2 ignored: it would start a debugger")

    return SignalSafeWorker


def worker_logging(settings: Settings) -> dict[str, Any]:
    """The worker's logging (`logging.config.dictConfig`; Faust's worker applies it
    again as it starts): to stderr, a plain line or a JSON object per record
    (AGUI_LOG_FORMAT), exceptions by kind only. Client libraries log at the
    worker's level but never below INFO: their debug records cost several log
    records per event."""
    level = settings.log_level.upper()
    libraries = logging.getLevelName(max(logging.INFO, logging.getLevelName(level)))
    formatter = JsonFormatter if settings.log_format == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"agui": {"()": formatter}},
        "handlers": {"agui": {"class": "logging.StreamHandler", "formatter": "agui",
                              "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["agui"]},
        "loggers": {name: {"level": libraries} for name in ("aiokafka", "faust", "mode")},
    }


def _exit_unless_stopped_within(seconds: float) -> None:
    """Arm a watchdog thread (it runs even when the event loop is stuck)."""

    def exit_now() -> None:
        log.error("the worker did not stop within %.0f s of the signal; exiting without"
                  " a commit (what was not committed is processed again)", seconds)
        logging.shutdown()
        os._exit(EXIT_NOT_STOPPED)

    watchdog = threading.Timer(seconds, exit_now)
    watchdog.daemon = True
    watchdog.start()


def run_worker() -> int:
    """Run one worker until SIGINT/SIGTERM."""
    settings = load_settings()
    if settings is None:
        return 2
    import faust  # Faust is imported only by the commands that run it.

    from processors.metrics import Metrics
    from processors.runtime.app import create_app
    from processors.runtime.faust_adaptations import UncheckedVersion, check_versions, use_uvloop
    from processors.view.tenant_tokens import TenantTokens

    try:
        check_versions()
        tokens = (None if settings.tokens_file is None
                  else TenantTokens.load(settings.tokens_file))
    except UncheckedVersion as error:
        sys.stderr.write(f"agui-stream: {error}\n")
        return 2
    except ConfigError as error:
        sys.stderr.write(f"agui-stream: configuration error: {error}\n")
        return 2

    use_uvloop()
    logging_config = worker_logging(settings)
    logging.config.dictConfig(logging_config)
    facts = asyncio.run(startup_facts(settings))
    if facts.problems:  # no access, or topics that would break the guarantees: refuse, say why
        for problem in facts.problems:
            sys.stderr.write(f"agui-stream: configuration error: {problem}\n")
        return 2
    app = create_app(settings, Metrics(), tokens, facts.limits, facts.inputs)
    running = Path(settings.data_dir) / f".{settings.app_id}-running"
    if settings.store == "rocksdb://" and running.exists():
        # Killed last time: RocksDB may hold writes of transactions that were
        # aborted. Start from the changelogs (committed state only) instead.
        log.warning("the last worker did not stop cleanly; rebuilding local state %s"
                    " from the changelog topics", app.conf.tabledir)
        shutil.rmtree(app.conf.tabledir, ignore_errors=True)
    running.parent.mkdir(parents=True, exist_ok=True)
    running.touch()
    worker = _worker_class(faust.Worker, settings.shutdown_timeout_seconds)(
        app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False,
        logging_config=logging_config)
    tune_collector()
    try:
        worker.execute_from_commandline()
    except SystemExit as exit_:
        if exit_.code in (0, None):
            running.unlink(missing_ok=True)
        raise
    return 0  # pragma: no cover - execute_from_commandline always exits
