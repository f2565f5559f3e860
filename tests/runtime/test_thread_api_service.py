"""The thread API of a running worker on a real broker: what the next run of a thread
gets back (order across runs, replacement by message id, encrypted values intact),
tenant isolation, incremental and consistent reads, retention."""

from __future__ import annotations

import random
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from ag_ui.core import Message
from pydantic import TypeAdapter

from processors.view.client import ThreadNotFound, fetch_thread_messages
from processors.view.tenant_tokens import token_line
from tests.run_generator import GeneratedRun, generate_run
from tests.service_harness import Namespace, Worker, produce, wait_for

pytestmark = pytest.mark.kafka

TOKENS = {"acme": "acme-secret-token", "globex": "globex-secret-token"}
_MESSAGES = TypeAdapter(list[Message])


def _worker(bootstrap: str, tmp_path: Path, **env: str) -> tuple[Namespace, Worker]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{token_line(t, token)}\n" for t, token in TOKENS.items()))
    namespace = Namespace(bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path, AGUI_TOKENS_FILE=str(tokens), **env).start()
    return namespace, worker


def _get(worker: Worker, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{worker.port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def _send(namespace: Namespace, tenant: str, *runs: GeneratedRun) -> None:
    produce(namespace.bootstrap, namespace.events,
            [(run.key, event, [("tenant", tenant.encode())]) for run in runs
             for event in run.events])


def _reusing_answer_id(run: GeneratedRun, earlier: GeneratedRun) -> GeneratedRun:
    """`run` with its answer message under `earlier`'s answer id, on a stream (record
    key) of its own: a replacement. (Within one stream a re-streamed message would
    append to the earlier one, AG-UI 1.1 events/lifecycle.)"""
    old, new = f"{run.run_id}-a".encode(), f"{earlier.run_id}-a".encode()
    messages = [{**m, "id": f"{earlier.run_id}-a"} if m["id"] == f"{run.run_id}-a" else m
                for m in run.messages]
    return GeneratedRun(run.key + b"-own-stream", run.thread_id, run.run_id,
                        [event.replace(old, new) for event in run.events], messages)


def test_a_thread_s_next_run_gets_its_history_back(kafka_bootstrap: str,
                                                  tmp_path: Path) -> None:
    rng = random.Random(5)
    namespace, worker = _worker(kafka_bootstrap, tmp_path)
    first, second = generate_run(rng, "t1", 1), generate_run(rng, "t1", 2)
    second = _reusing_answer_id(second, first)
    other_tenant = generate_run(rng, "t1", 1)  # the same thread id, another tenant
    acme, globex = TOKENS["acme"], TOKENS["globex"]
    # Two streams (record keys) may land on two partitions: the second run goes out
    # once the first is in the view, as a thread's next run does.
    _send(namespace, "acme", first)
    wait_for(lambda: _get(worker, f"/v1/threads/t1?run={first.run_id}", acme)[0] == 200, 120,
             "the first run in the view", worker.log_tail)
    _send(namespace, "acme", second)
    _send(namespace, "globex", other_tenant)

    def has_both_runs() -> bool:
        status, body = _get(worker, "/v1/threads/t1", acme)
        return status == 200 and len(body["runs"]) == 2
    wait_for(has_both_runs, 120, "the view to hold both runs", worker.log_tail)

    # Order across runs; the second run's answer replaced the first's in place.
    status, body = _get(worker, "/v1/threads/t1/messages", acme)
    assert status == 200 and body["threadId"] == "t1"
    expected = [first.messages[0], second.messages[1], second.messages[0]]
    assert body["messages"] == expected  # encrypted values byte for byte
    assert _MESSAGES.validate_python(body["messages"])  # what RunAgentInput takes
    status, runs = _get(worker, "/v1/threads/t1", acme)
    assert [(r["runId"], r["outcome"], r["messageCount"]) for r in runs["runs"]] == [
        (first.run_id, "success", 2), (second.run_id, "success", 2)]

    # Incremental reads; the client returns the ag-ui-protocol models.
    status, later = _get(worker, f"/v1/threads/t1/messages?after={first.run_id}-r", acme)
    assert status == 200 and later["messages"] == expected[1:]
    fetched = fetch_thread_messages(f"http://127.0.0.1:{worker.port}", acme, "t1")
    assert [m.model_dump(by_alias=True, exclude_none=True) for m in fetched] == expected

    # Tenants: the token decides; another tenant's thread does not exist for you.
    # (Its run was sent after acme's second one, and may land in a later commit.)
    status, theirs = _get(worker, f"/v1/threads/t1/messages?run={other_tenant.run_id}", globex)
    assert status == 200 and theirs["messages"] == other_tenant.messages
    assert _get(worker, "/v1/threads/t1/messages", None)[0] == 401
    assert _get(worker, "/v1/threads/t1/messages", "not-a-token")[0] == 401
    only_acme = _get(worker, "/v1/threads/t1-acme-only/messages", globex)
    _send(namespace, "acme", generate_run(rng, "t1-acme-only", 1))
    wait_for(lambda: _get(worker, "/v1/threads/t1-acme-only", acme)[0] == 200, 60,
             "acme's second thread")
    assert _get(worker, "/v1/threads/t1-acme-only/messages", globex) == only_acme
    assert only_acme[0] == 404
    with pytest.raises(ThreadNotFound):
        fetch_thread_messages(f"http://127.0.0.1:{worker.port}", globex, "t1-acme-only")

    # Consistent reads: a request for an offset, or for the run an agent server has
    # just finished, the view has not read yet waits for it.
    offset = body["historyOffset"]
    assert _get(worker, f"/v1/threads/t1/messages?min_offset={offset}", acme)[0] == 200
    third = generate_run(rng, "t1", 3)
    queries = {"offset": f"min_offset={offset + 1}", "run": f"run={third.run_id}"}
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    waiting = [threading.Thread(target=lambda name=name, query=query: answers.__setitem__(
        name, _get(worker, f"/v1/threads/t1/messages?{query}", acme)))
        for name, query in queries.items()]
    for thread in waiting:
        thread.start()
    _send(namespace, "acme", third)
    for thread in waiting:
        thread.join(60)
    assert answers["offset"][0] == 200 and answers["offset"][1]["historyOffset"] > offset
    assert answers["run"][0] == 200 and answers["run"][1]["messages"][-2:] == third.messages
    worker.stop()


def test_a_thread_idle_longer_than_the_retention_is_removed(kafka_bootstrap: str,
                                                           tmp_path: Path) -> None:
    namespace, worker = _worker(kafka_bootstrap, tmp_path, AGUI_VIEW_RETENTION_SECONDS="3",
                                AGUI_IDLE_TIMEOUT_SECONDS="4")  # a tick each second
    _send(namespace, "acme", generate_run(random.Random(6), "brief", 1))
    acme = TOKENS["acme"]
    wait_for(lambda: _get(worker, "/v1/threads/brief", acme)[0] == 200, 120,
             "the thread in the view", worker.log_tail)
    wait_for(lambda: _get(worker, "/v1/threads/brief", acme)[0] == 404, 60,
             "the retention to remove the thread", worker.log_tail)
    worker.stop()


def test_any_worker_answers_for_a_thread_another_one_owns(kafka_bootstrap: str,
                                                          tmp_path: Path) -> None:
    namespace, first = _worker(kafka_bootstrap, tmp_path)
    second = Worker(namespace, tmp_path, name="second", AGUI_TOKENS_FILE=str(
        tmp_path / "tokens")).start()
    wait_for(lambda: first.input_partitions() + second.input_partitions() == 4
             and min(first.input_partitions(), second.input_partitions()) > 0, 120,
             "the two workers to share the partitions")
    rng = random.Random(7)
    runs = [generate_run(rng, f"thread{n}", 1) for n in range(8)]  # on every partition
    _send(namespace, "acme", *runs)
    acme = TOKENS["acme"]
    for run in runs:
        wait_for(lambda run=run: _get(first, f"/v1/threads/{run.thread_id}?run={run.run_id}",
                                      acme)[0] == 200, 120, f"{run.thread_id} in the view")
    for run in runs:
        path = f"/v1/threads/{run.thread_id}/messages"
        ids = [message["id"] for message in run.messages]
        assert _get(first, path, acme) == _get(second, path, acme) == (200, {
            "threadId": run.thread_id, "messages": run.messages, "hasMore": False,
            "firstId": ids[0], "lastId": ids[-1],
            "historyOffset": _get(first, path, acme)[1]["historyOffset"],
            # The generated runs do not echo their input: the view says so.
            "complete": False, "incomplete": _get(first, path, acme)[1]["incomplete"]})
    # 24 requests were sent; a request for the other worker's thread was answered
    # twice: by that worker, forwarded, and by the one it was sent to.
    answered = sum(_answered(worker, "messages") for worker in (first, second))
    assert 24 < answered < 48
    second.stop()
    first.stop()


def _answered(worker: Worker, route: str) -> int:
    prefix = f'agui_api_request_seconds_count{{route="{route}",status="200"}} '
    return sum(int(float(line[len(prefix):])) for line in worker.metrics().splitlines()
               if line.startswith(prefix))
