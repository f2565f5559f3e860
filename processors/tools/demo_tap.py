"""The demo's last part: an unmodified AG-UI agent server behind `agui-stream tap`.

A real agent (pydantic-ai's AG-UI adapter on uvicorn, its model a function: no
network, no LLM; `processors.tools.sample_agent`) answers a client through the
tap, which forwards its stream unchanged and publishes the run to the raw topic,
with the user's question echoed on `RUN_STARTED`; the worker validates it; the
client then starts the thread's next turn from the thread view, the question
included, through the tap again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
from ag_ui.core import Message, RunAgentInput, UserMessage

from processors.config import Settings
from processors.view.client import ThreadApiError, fetch_run, fetch_thread_messages

QUESTION = "What is the weather in Paris?"
FOLLOW_UP = "And tomorrow?"
START_SECONDS = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:  # an answer all the same (the agent's POST-only 405)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _process(command: list[str], env: dict[str, str], log: Path,
             ready_url: str) -> Iterator[None]:
    """A child process, up once `ready_url` answers, stopped (SIGTERM) on exit."""
    with log.open("ab") as out:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _answers(ready_url):
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[-1]} did not start; see {log}")
            time.sleep(0.2)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)


def _post_run(tap_port: int, tenant: str, run: RunAgentInput) -> Counter[str]:
    """POST a `RunAgentInput` through the tap as a client would; the events by type."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{tap_port}/agent",
        data=run.model_dump_json(by_alias=True, exclude_none=True).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                 "X-Agui-Tenant": tenant})
    with urllib.request.urlopen(request, timeout=60) as response:
        stream = response.read()
    return Counter(orjson.loads(line[len(b"data:"):])["type"]
                   for line in stream.splitlines() if line.startswith(b"data:"))


def tap_turns(settings: Settings, tenant: str, token: str, log_dir: Path) -> str:
    """Two turns of one thread through the tap; the report's lines."""
    agent_port, tap_port, tap_health = _free_port(), _free_port(), _free_port()
    view = f"http://127.0.0.1:{settings.metrics_port}"
    tap_env = {**os.environ, "AGUI_TAP_UPSTREAM_URL": f"http://127.0.0.1:{agent_port}",
               "AGUI_TAP_PORT": str(tap_port), "AGUI_METRICS_PORT": str(tap_health),
               "AGUI_TAP_TOPIC": settings.input_topics[0]}
    thread = f"tap-thread-{int(time.time())}"
    with _process([sys.executable, "-m", "processors.tools.sample_agent", str(agent_port)],
                  dict(os.environ), log_dir / "demo-agent.log",
                  f"http://127.0.0.1:{agent_port}/agent"), \
         _process([sys.executable, "-m", "processors.tools.cli", "tap"], tap_env,
                  log_dir / "demo-tap.log", f"http://127.0.0.1:{tap_health}/readyz"):
        first = RunAgentInput(thread_id=thread, run_id=f"{thread}-run1", state={}, tools=[],
                              context=[], forwarded_props={},
                              messages=[UserMessage(id=f"{thread}-q1", role="user",
                                                    content=QUESTION)])
        streamed = _post_run(tap_port, tenant, first)
        try:
            history = fetch_thread_messages(view, token, thread, run=first.run_id)
            follow_up: list[Message] = [*history, UserMessage(
                id=f"{thread}-q2", role="user", content=FOLLOW_UP)]
            second = first.model_copy(update={"run_id": f"{thread}-run2",
                                              "messages": follow_up})
            _post_run(tap_port, tenant, second)
            after = fetch_thread_messages(view, token, thread, run=second.run_id)
            outcome = fetch_run(view, token, thread, second.run_id).run.outcome
        except ThreadApiError as error:
            return f"through the tap: the thread API refused: {error}"
    roles = ", ".join(message.role for message in history)
    questions = [m.content for m in after if m.role == "user"]
    return "\n".join([
        "an unmodified AG-UI agent server (pydantic-ai, no model) behind agui-stream tap:",
        f"  the client got {sum(streamed.values())} events ("
        + ", ".join(f"{kind} {n}" for kind, n in sorted(streamed.items())) + ")",
        f"  the view then held {thread}'s first run: {roles}",
        f"  the next turn, started from the view through the tap, ended {outcome}; the"
        f" view holds {len(after)} messages, the user's: {questions}",
        f"  logs: {log_dir / 'demo-agent.log'}, {log_dir / 'demo-tap.log'}",
    ])
