"""`bash deploy/demo.sh | tee demo.log`, then Ctrl-C: the broker it started is stopped,
even though the Ctrl-C also ended the reader of its output (a closed pipe)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE = REPO_ROOT / "var" / "demo" / "kafka"

pytestmark = pytest.mark.kafka


def broker_running() -> bool:
    status = subprocess.run([sys.executable, "deploy/kafka_local.py", "status", "--state-dir",
                             str(STATE)], cwd=REPO_ROOT, capture_output=True, timeout=60)
    return status.returncode == 0


def test_ctrl_c_with_a_closed_output_still_stops_the_demo_broker() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    demo = subprocess.Popen(["bash", "deploy/demo.sh"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    assert demo.stdout is not None
    try:
        seen = b""
        for line in demo.stdout:  # until the demo has started its broker
            seen += line
            if line.startswith(b"==> broker at"):
                break
        else:
            pytest.fail(f"the demo never started its broker:\n{seen.decode(errors='replace')}")
        assert broker_running()
        demo.stdout.close()  # the reader is gone (as `tee` after Ctrl-C) ...
        os.killpg(demo.pid, signal.SIGINT)  # ... and the terminal's Ctrl-C reaches the demo
        demo.wait(120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        left_running = broker_running()
        if left_running:  # never outlive the test, even when it fails
            subprocess.run([sys.executable, "deploy/kafka_local.py", "stop", "--state-dir",
                            str(STATE)], cwd=REPO_ROOT, capture_output=True, timeout=120)
    assert not left_running, "the demo's broker was left running"
