"""`agui-stream demo`: the service end to end on the broker at KAFKA_BOOTSTRAP_SERVERS.

Creates the topics, starts a worker, replays the bundled sample runs (valid
and broken), waits until every run has concluded, prints what came out, then
acts as an agent server starting the second turn of a thread from the thread
API (its encrypted reasoning values must come back intact), then runs a real
AG-UI agent server behind `agui-stream tap` for two turns of a new thread (the
user's question reaches the history through the tap's echo), and keeps the
worker running (metrics and the API stay up) until Ctrl-C.
`--replay-only` just produces the samples and exits (the compose demo).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import orjson
from ag_ui.core import RunAgentInput, UserMessage

from processors.config import Settings
from processors.runtime.topic_admin import create_topics
from processors.runtime.topic_io import produce, read_committed
from processors.runtime.worker import load_settings
from processors.tools.samples import Sample, next_turn, sample_runs
from processors.view.client import ThreadApiError, fetch_run, fetch_thread_messages
from processors.view.tenant_tokens import token_line


async def replay(settings: Settings, samples: list[Sample]) -> int:
    """Produce the samples' events to the first input topic, keyed by run, with the
    tenant header; the number of events."""
    await produce(settings, settings.input_topics[0], (
        (sample.key.encode(), value, [(settings.tenant_header, sample.tenant.encode())])
        for sample in samples for value in sample.values))
    return sum(len(s.values) for s in samples)


async def read_all(settings: Settings, topic: str) -> list[tuple[dict[str, object], int]]:
    """Every committed record of `topic` (value, and its partition)."""
    return [(orjson.loads(value or b"{}"), partition)
            for value, partition in await read_committed(settings, topic)]


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def counter(text: str, name: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for label, value in re.findall(rf'^{name}_total\{{\w+="([^"]+)"\}} (\S+)$', text, re.M):
        found[label] = int(float(value))
    return found


def summarize(settings: Settings, samples: list[Sample]) -> tuple[bool, str]:
    history = asyncio.run(read_all(settings, settings.history_topic))
    dead = asyncio.run(read_all(settings, settings.deadletter_topic))
    closing = [v for v, _ in history if v.get("kind") == "run"]
    endings = Counter(str(v.get("outcome")) for v in closing if not v.get("late"))
    late = sum(1 for v in closing if v.get("late"))
    content = Counter(str(v.get("kind")) for v, _ in history if v.get("kind") != "run")
    failures = Counter(str(v["code"]) for v, _ in dead if v.get("kind") == "failure")
    warnings = Counter(str(v["code"]) for v, _ in dead if v.get("kind") == "warning")
    metrics = scrape(settings.metrics_port)
    lost = counter(metrics, "agui_encrypted_content_lost")
    lines = [
        f"runs replayed:           {len(samples)} ({sum(len(s.values) for s in samples)} events)",
        "runs ended:              " + ", ".join(
            f"{outcome} {endings[outcome]}" for outcome in
            ("success", "interrupt", "cancelled", "error", "failed") if endings[outcome])
        + (f" ({late} of them failed after they finished)" if late else ""),
        f"history records:         {sum(content.values())} ("
        + ", ".join(f"{kind} {n}" for kind, n in sorted(content.items()))
        + f") + {len(closing)} closing records",
        f"dead letters:            {sum(failures.values()) + sum(warnings.values())}",
        *(f"  failure  {code:32} {n}" for code, n in sorted(failures.items())),
        *(f"  warning  {code:32} {n}" for code, n in sorted(warnings.items())),
        f"encrypted values lost:   {sum(lost.values())}",
        *(f"  {reason:41} {n}" for reason, n in sorted(lost.items()) if n),
        f"metrics:                 http://127.0.0.1:{settings.metrics_port}/metrics",
    ]
    # Every sample is one run, and every run that ends gets a closing record.
    return len(closing) >= sum(s.closing_records for s in samples), "\n".join(lines)


def second_turn(settings: Settings, first: Sample, token: str) -> str:
    """What an agent server does before a thread's next run: fetch the thread from the
    view (waiting for the run it just finished), check that the encrypted reasoning
    values it sent came back byte for byte, start the next run with them, and see it
    reach the view too. Returns the report's lines."""
    base = f"http://127.0.0.1:{settings.metrics_port}"
    thread, run = first.thread_id, first.run_id
    try:
        history = fetch_thread_messages(base, token, thread, run=run)
    except ThreadApiError as error:
        return f"next turn: the thread API refused: {error}"
    sent = first.encrypted_values()
    returned = [m.encrypted_value for m in history
                if m.role == "reasoning" and m.encrypted_value is not None]
    intact = "identical to" if returned == sent else "DIFFERENT from"
    run_id = f"{run}-turn2"
    start = RunAgentInput(thread_id=thread, run_id=run_id, state={}, tools=[], context=[],
                          forwarded_props={}, messages=[*history, UserMessage(
                              id=f"{run_id}-question", role="user",
                              content="And the next step?")])
    turn = next_turn(first, [m.model_dump(by_alias=True, exclude_none=True)
                             for m in start.messages])
    asyncio.run(replay(settings, [turn]))
    try:
        after = fetch_thread_messages(base, token, thread, run=turn.run_id)
        outcome = fetch_run(base, token, thread, turn.run_id).run.outcome
    except ThreadApiError as error:
        return f"next turn: the thread API refused: {error}"
    return "\n".join([
        f"next turn, started from the thread view (as an agent server would; token {token}):",
        f"  {thread} ({first.tenant}): {len(history)} messages after {run},"
        f" {len(returned)} encrypted reasoning value(s) {intact} what {run} sent",
        f"  {turn.run_id} started with those {len(start.messages)} messages"
        f" (RunAgentInput, echoed on RUN_STARTED); once it finished, the view holds"
        f" {len(after)}, {sum(m.role == 'user' for m in after)} of them the user's;"
        f" its outcome: {outcome}",
        f"  curl -H 'Authorization: Bearer {token}' {base}/v1/threads/{thread}/messages",
        f"  curl -H 'Authorization: Bearer {token}' {base}/v1/threads/{thread}/runs/{turn.run_id}",
        f"  curl {base}/v1/openapi.json   # the API's OpenAPI 3.1 contract",
    ])


def worker_environment(path: str) -> dict[str, str]:
    """The settings a `--worker-env` file gives the demo's worker: `KEY=VALUE` lines,
    `export` and shell quoting allowed (what `kafka_local.py secure-env` prints)."""
    settings = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            words = words[1:]
        if not words:
            continue
        name, equals, value = words[0].partition("=")
        if len(words) != 1 or not equals or not name:
            raise ValueError(f"{path}:{number}: not a KEY=VALUE line")
        settings[name] = value
    return settings


def through_the_tap(settings: Settings, tenant: str, token: str, log_dir: Path) -> str:
    """The tap part of the demo, when the sample agent's framework is installed (the
    dev extras; `pip install -e ".[dev]"`)."""
    try:
        from processors.tools.demo_tap import tap_turns
    except ImportError as error:
        return f"through the tap: skipped ({error.name} is not installed: pip install -e '.[dev]')"
    try:
        return tap_turns(settings, tenant, token, log_dir)
    except (OSError, RuntimeError) as error:
        return f"through the tap: {error}"


def run_demo(replay_only: bool, worker_env: str | None = None) -> int:
    settings = load_settings()
    if settings is None:
        return 2
    try:
        worker_settings = {} if worker_env is None else worker_environment(worker_env)
    except (OSError, ValueError) as error:
        print(f"agui-stream demo: --worker-env: {error}", file=sys.stderr)
        return 2
    # Leader elections right after topic creation make aiokafka log retries.
    logging.basicConfig(level=logging.ERROR)
    samples = sample_runs()
    print(f"broker {','.join(settings.bootstrap_servers)}: creating topics", flush=True)
    asyncio.run(create_topics(settings, include_inputs=True))
    if replay_only:
        produced = asyncio.run(replay(settings, samples))
        print(f"replayed {len(samples)} runs ({produced} events) to {settings.input_topics[0]}")
        return 0
    data_dir = Path(os.environ.get("AGUI_DATA_DIR", "var/demo-state"))
    token = secrets.token_urlsafe(24)  # the demo's own tenant token, for this run only
    tokens = data_dir.parent / "demo-tokens"
    tokens.parent.mkdir(parents=True, exist_ok=True)
    tokens.write_text(f"{token_line(samples[0].tenant, token)}\n")
    env = {**os.environ, **worker_settings, "AGUI_DATA_DIR": str(data_dir),
           "AGUI_TOKENS_FILE": str(tokens)}
    log_path = data_dir.parent / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        worker = subprocess.Popen([sys.executable, "-m", "processors.tools.cli", "worker"], env=env,
                                  stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    print(f"worker started (pid {worker.pid}, log {log_path})", flush=True)
    try:
        produced = asyncio.run(replay(settings, samples))
        print(f"replayed {len(samples)} sample runs ({produced} events); processing...",
              flush=True)
        deadline = time.monotonic() + 180
        done, report = False, ""
        while not done and time.monotonic() < deadline:
            if worker.poll() is not None:
                print(f"the worker exited ({worker.returncode}); see {log_path}",
                      file=sys.stderr)
                return 1
            done, report = summarize(settings, samples)
            if not done:
                time.sleep(1)
        print("\n" + report + "\n", flush=True)
        if not done:
            print(f"not every run concluded within 180 s; see {log_path}", file=sys.stderr)
            return 1
        print(second_turn(settings, samples[0], token) + "\n", flush=True)
        print(through_the_tap(settings, samples[0].tenant, token, log_path.parent) + "\n",
              flush=True)
        print("The worker keeps running; press Ctrl-C to stop everything.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        worker.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):  # the output may be a closed pipe by now
            print("worker stopped", flush=True)
