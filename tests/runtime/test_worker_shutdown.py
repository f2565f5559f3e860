"""A worker stops on SIGTERM within its shutdown timeout, even with its broker gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from processors.runtime.worker import EXIT_NOT_STOPPED
from tests.conftest import load_kafka_local
from tests.service_harness import Namespace, Worker, wait_for

pytestmark = pytest.mark.kafka


@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="needs a broker of its own to stop (the local KRaft broker);"
                    " KAFKA_BOOTSTRAP_SERVERS points at a shared one")
def test_sigterm_with_the_broker_gone_exits_within_the_shutdown_timeout(
    tmp_path: Path,
) -> None:
    with load_kafka_local().local_broker() as bootstrap:
        namespace = Namespace(bootstrap)
        namespace.create_topics()
        worker = Worker(namespace, tmp_path, AGUI_SHUTDOWN_TIMEOUT_SECONDS="5",
                        AGUI_LOG_LEVEL="info").start()
        wait_for(lambda: worker.input_partitions() > 0, 90,
                 "the worker to own its partitions", worker.log_tail)
    # The broker is stopped: the worker's consumer and producers wait on it for ever.
    assert worker.process is not None
    started = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    try:
        code = worker.process.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker did not exit within 30 s of SIGTERM\n" + worker.log_tail())
    took = time.monotonic() - started
    assert code in (0, EXIT_NOT_STOPPED), worker.log_tail()
    assert took < 5 + 5, f"took {took:.1f} s"
