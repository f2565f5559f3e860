"""Shared fixtures.

``kafka_bootstrap`` (session scope, started lazily on first use) returns a bootstrap
string for a real Kafka broker, taken from the first of:

1. ``KAFKA_BOOTSTRAP_SERVERS`` in the environment (an external broker; nothing started);
2. a testcontainers ``KafkaContainer`` (KRaft) when a Docker engine answers;
3. the local broker of ``deploy/kafka_local.py`` (Kafka from Maven Central, run with java).

``AGUI_KAFKA_BACKEND=local`` or ``=docker`` skips the detection of 2./3.
"""

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_kafka_local() -> ModuleType:
    """Import deploy/kafka_local.py by file path (deploy/ is not a package)."""
    path = REPO_ROOT / "deploy" / "kafka_local.py"
    spec = importlib.util.spec_from_file_location("agui_kafka_local", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docker_engine_answers(timeout: float = 5.0) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        subprocess.run(["docker", "info"], capture_output=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        yield external
        return
    backend = os.environ.get("AGUI_KAFKA_BACKEND", "auto")
    if backend == "docker" or (backend == "auto" and _docker_engine_answers()):
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield str(container.get_bootstrap_server())
        return
    with load_kafka_local().local_broker() as bootstrap:
        yield bootstrap


@pytest.fixture(autouse=True)
def reap_workers() -> Iterator[None]:
    """Kill every worker a test started (and its supervisor), pass or fail."""
    yield
    from tests.service_harness import Worker

    Worker.reap_all()
