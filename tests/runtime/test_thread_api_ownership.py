"""The thread API through rebalances, on a real broker: while a worker joins and
then leaves under load, every answer from either worker is the owner's recovered
view (never fewer messages than one already served, never a 404 for a thread
that exists) or a 503 to retry; a client cannot make a worker answer for a
partition it does not own; the next-turn flow of an agent server whose run
failed; JSON errors on the real server."""

from __future__ import annotations

import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from processors.view.openapi import openapi_document
from processors.view.tenant_tokens import token_line
from tests.run_generator import GeneratedRun, generate_run
from tests.service_harness import Namespace, TopicReader, Worker, produce, wait_for

pytestmark = pytest.mark.kafka

TOKEN = "acme-secret-token"
THREADS = [f"thread{n}" for n in range(8)]  # on every partition


def _get(worker: Worker, path: str, method: str = "GET",
         **headers: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{worker.port}{path}", method=method,
                                     headers={"Authorization": f"Bearer {TOKEN}", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def _send(namespace: Namespace, *runs: GeneratedRun) -> None:
    produce(namespace.bootstrap, namespace.events,
            [(run.key, event, [("tenant", b"acme")]) for run in runs for event in run.events])


def _workers(bootstrap: str, tmp_path: Path) -> tuple[Namespace, Worker, Path]:
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("acme", TOKEN) + "\n")
    namespace = Namespace(bootstrap)
    namespace.create_topics()
    first = Worker(namespace, tmp_path, AGUI_TOKENS_FILE=str(tokens)).start()
    return namespace, first, tokens


class Reads:
    """Reads every thread from the given workers again and again, in a thread of its
    own, and checks each answer: 200 with at least the messages already served (in
    the same order), or 503 `not_ready`/`wait_timeout`."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.served: dict[str, list[str]] = {}
        self.answers: dict[int, int] = {}
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Reads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for worker in list(self.workers):
                for thread in THREADS:
                    self._check(worker, thread)

    def _check(self, worker: Worker, thread: str) -> None:
        try:
            status, body = _get(worker, f"/v1/threads/{thread}/messages")
        except (OSError, ValueError):
            return  # the worker is stopping
        self.answers[status] = self.answers.get(status, 0) + 1
        if status == 503 and body.get("code") in ("not_ready", "wait_timeout"):
            return
        if status != 200:
            self.problems.append(f"{thread}: {status} {body.get('code')} from"
                                 f" {worker.log_path.stem}")
            return
        ids = [message["id"] for message in body["messages"]]
        before = self.served.get(thread, [])
        if ids[:len(before)] != before:  # which worker, and what it answered (a report)
            self.problems.append(f"{thread}: {len(ids)} messages after {len(before)} served,"
                                 f" from {worker.log_path.stem} (historyOffset"
                                 f" {body.get('historyOffset')})")
        else:
            self.served[thread] = ids


def test_reads_during_a_join_and_a_leave_are_never_older_nor_missing(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    namespace, first, tokens = _workers(kafka_bootstrap, tmp_path)
    rng = random.Random(11)
    _send(namespace, *(generate_run(rng, thread, 1) for thread in THREADS))
    for thread in THREADS:
        wait_for(lambda thread=thread: _get(first, f"/v1/threads/{thread}?run={thread}-run1")[0]
                 == 200, 120, f"{thread} in the view", first.log_tail)
    second = Worker(namespace, tmp_path, name="second", AGUI_TOKENS_FILE=str(tokens))
    with Reads([first]) as reads:
        wait_for(lambda: len(reads.served) == len(THREADS), 60, "every thread served")
        run_number = 2
        second.start()
        reads.workers.append(second)
        # Runs go on during the join: the threads grow while their partitions move.
        while not (first.input_partitions() and second.input_partitions()):
            _send(namespace, *(generate_run(rng, thread, run_number) for thread in THREADS))
            run_number += 1
            time.sleep(0.5)
        for thread in THREADS:
            wait_for(lambda thread=thread: _get(
                second, f"/v1/threads/{thread}?run={thread}-run{run_number - 1}")[0] == 200,
                120, f"{thread}'s last run in the view after the join", second.log_tail)
        reads.workers.remove(second)
        second.stop()  # the leave: the first worker takes every partition back
        wait_for(lambda: first.input_partitions() == 4, 120, "the partitions back")
        for thread in THREADS:
            wait_for(lambda thread=thread: _get(first, f"/v1/threads/{thread}")[0] == 200,
                     120, f"{thread} answered after the leave", first.log_tail)
    assert not reads.problems, "\n".join([
        f"{len(reads.problems)} problems, the first:", *reads.problems[:12],
        "first worker:", first.log_tail(60), "second worker:", second.log_tail(60)])
    assert all(len(ids) == 2 * (run_number - 1) for ids in reads.served.values())
    assert reads.answers.get(200, 0) > 100
    first.stop()


def test_after_a_crash_the_view_answers_nothing_older_than_what_was_served(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The view's own changes are committed with the commit after the one that made
    the history they come from readable. A worker killed in between served threads
    its committed view does not hold; restarted, its view reads that history again,
    and answers (503 meanwhile) only once it has: never a 404, never fewer messages."""
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("acme", TOKEN) + "\n")
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    # A run's end commits at once; the next commit is 2.5 s (a quarter interval) away.
    worker = Worker(namespace, tmp_path, AGUI_TOKENS_FILE=str(tokens),
                    AGUI_COMMIT_INTERVAL_MS="10000", AGUI_SESSION_TIMEOUT_SECONDS="6").start()
    rng = random.Random(15)
    _send(namespace, *(generate_run(rng, thread, 1) for thread in THREADS))
    served = {}
    for thread in THREADS:
        wait_for(lambda thread=thread: _get(worker, f"/v1/threads/{thread}?run={thread}-run1")[0]
                 == 200, 120, f"{thread} in the view", worker.log_tail)
        served[thread] = [m["id"] for m in _get(worker, f"/v1/threads/{thread}/messages")[1][
            "messages"]]
    worker.kill()
    worker.start()
    with Reads([worker]) as reads:
        reads.served = dict(served)
        answered: dict[str, int] = {}

        def every_thread_answered_again() -> bool:
            for thread in THREADS:
                status, _ = _get(worker, f"/v1/threads/{thread}/messages")
                answered[thread] = status
            return all(status == 200 for status in answered.values())

        wait_for(every_thread_answered_again, 120, "every thread answered after the restart",
                 worker.log_tail)
    assert not reads.problems, "\n".join([
        f"{len(reads.problems)} problems, the first:", *reads.problems[:12], worker.log_tail(60)])
    assert reads.answers.get(503, 0) > 0  # it was asked while it recovered
    worker.stop()


def test_a_client_cannot_make_a_worker_answer_for_a_partition_it_does_not_own(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    namespace, first, tokens = _workers(kafka_bootstrap, tmp_path)
    second = Worker(namespace, tmp_path, name="second", AGUI_TOKENS_FILE=str(tokens)).start()
    wait_for(lambda: first.input_partitions() + second.input_partitions() == 4
             and min(first.input_partitions(), second.input_partitions()) > 0, 120,
             "the two workers to share the partitions")
    rng = random.Random(12)
    _send(namespace, *(generate_run(rng, thread, 1) for thread in THREADS))
    for thread in THREADS:
        wait_for(lambda thread=thread: _get(first, f"/v1/threads/{thread}?run={thread}-run1")[0]
                 == 200, 120, f"{thread} in the view")
    statuses: dict[int, list[int]] = {worker.port: [] for worker in (first, second)}
    for worker in (first, second):
        for thread in THREADS:
            status, body = _get(worker, f"/v1/threads/{thread}/messages",
                                **{"X-Agui-Forwarded": "1"})
            statuses[worker.port].append(status)
            assert status == 200 or body["code"] == "not_ready"
    # Each worker answered its own threads and refused the other's.
    assert [a == 200 for a in statuses[first.port]] == [
        b != 200 for b in statuses[second.port]]
    assert 0 < statuses[first.port].count(200) < len(THREADS)
    second.stop()
    first.stop()


def _failing_run(thread: str, run_id: str) -> GeneratedRun:
    events = [{"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
              {"type": "REASONING_MESSAGE_CONTENT", "messageId": "nowhere", "delta": "x"},
              {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}]
    return GeneratedRun(thread.encode(), thread, run_id, [orjson.dumps(e) for e in events], [])


def test_the_next_turn_after_a_failed_run_learns_its_code_without_waiting_out(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """An agent server produces a run and asks for the thread with it: a failed run
    is answered with its failure code as soon as its closing record is in the view,
    not with a 503 after the full wait."""
    namespace, worker, _ = _workers(kafka_bootstrap, tmp_path)
    _send(namespace, generate_run(random.Random(13), "turns", 1))
    wait_for(lambda: _get(worker, "/v1/threads/turns?run=turns-run1")[0] == 200, 120,
             "the first run in the view", worker.log_tail)
    _send(namespace, _failing_run("turns", "turns-run2"))
    started = time.monotonic()
    status, body = _get(worker, "/v1/threads/turns/messages?run=turns-run2")
    took = time.monotonic() - started
    assert status == 200 and body["run"]["outcome"] == "failed"
    assert body["run"]["failure"]["code"] == "message_not_open"
    assert len(body["messages"]) == 2  # the first run's
    print(f"failed run answered {took * 1000:.0f} ms after its producer's ack")
    assert took < 1.0  # a commit interval and the view's turn, not the 10 s wait
    started = time.monotonic()
    status, body = _get(worker, "/v1/threads/turns/runs/turns-run2")
    assert status == 200 and body["run"]["failure"]["code"] == "message_not_open"
    assert time.monotonic() - started < 1.0
    worker.stop()


def test_every_refusal_of_the_real_server_is_json_with_a_code_and_counted(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    _, worker, _ = _workers(kafka_bootstrap, tmp_path)
    assert _get(worker, "/v1/threads/t1/messages?min_offset=" + "9" * 5000) == (400, {
        "error": "min_offset: a history offset (a non-negative integer) is required",
        "code": "bad_parameter"})
    assert _get(worker, "/v1/threads/t1/messages?limit=0")[1]["code"] == "bad_parameter"
    assert _get(worker, "/v1/threads/t1/nothing-here") == (404, {"error": "Not Found",
                                                                 "code": "not_found"})
    assert _get(worker, "/v1/threads/t1/messages", method="DELETE")[0] == 405
    assert _get(worker, "/v1/threads/t1/messages", Authorization="Bearer x")[1]["code"] == (
        "unauthorized")
    assert _get(worker, "/v1/openapi.json") == (200, openapi_document())
    metrics = worker.metrics()
    assert 'agui_api_request_seconds_count{route="messages",status="400"} 2.0' in metrics
    assert 'agui_api_request_seconds_count{route="other",status="404"} 1.0' in metrics
    worker.stop()


def test_a_deleted_thread_is_erased_for_every_consumer_and_stays_erased(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    namespace, worker, _ = _workers(kafka_bootstrap, tmp_path)
    rng = random.Random(14)
    _send(namespace, generate_run(rng, "gone", 1), generate_run(rng, "kept", 1))
    for thread in ("gone", "kept"):
        wait_for(lambda thread=thread: _get(worker, f"/v1/threads/{thread}?run={thread}-run1")[0]
                 == 200, 120, f"{thread} in the view", worker.log_tail)
    status, body = _get(worker, "/v1/threads/gone", method="DELETE")
    assert (status, body["erased"]) == (200, True)
    assert _get(worker, "/v1/threads/gone/messages")[1]["code"] == "thread_not_found"
    # Downstream consumers are told: an erasure record under the thread's key.
    reader = TopicReader(kafka_bootstrap, namespace.history)
    reader.wait_until(lambda records: any(r.value.get("kind") == "erasure" for r in records),
                      60, "the erasure record")
    erasure = next(r for r in reader.records if r.value.get("kind") == "erasure")
    assert (erasure.key, erasure.offset) == (b"acme/gone", body["historyOffset"])
    assert {"schema", "tenant", "threadId", "erasedAt"} <= set(erasure.value)
    # The erasure is in the view's committed state: a restarted worker has it too.
    worker.stop()
    worker.start()
    wait_for(lambda: _get(worker, "/v1/threads/kept")[0] == 200, 120, "the view back",
             worker.log_tail)
    assert _get(worker, "/v1/threads/gone")[0] == 404
    worker.stop()
