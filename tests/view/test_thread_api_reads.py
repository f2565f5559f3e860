"""The thread API's reads for a platform: pages, a run's status, waits that come
after the lookup and are bounded, capped and woken by their own partition only,
the thread's own history offset, and answers only where the view is ready."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from processors.view.tenant_tokens import TenantTokens, token_line
from processors.view.thread_api import (
    MAX_PAGE,
    ApiResponse,
    Eraser,
    ReadProgress,
    ThreadApi,
)
from processors.view.thread_view import HistoryPartition, ThreadView, thread_key
from tests.view_helpers import HISTORY, History, assistant, feed, removed, user
from topics.records import HistoryErasure

ACME = "Bearer acme-token"
GLOBEX = "Bearer globex-token"
TOKENS = TenantTokens.parse(
    f"{token_line('acme', 'acme-token')}\n{token_line('globex', 'globex-token')}", "tokens")


def view_of(*runs: tuple[str, str, list[Any]], **closing: Any) -> tuple[ThreadView, History]:
    history = History()
    view = ThreadView({}, partitions=1, retention_seconds=86_400.0)
    for thread, run_id, content in runs:
        feed(view, history.run(thread, run_id, content, **closing))
    return view, history


def ten_messages() -> ThreadView:
    """t1: m0..m9, m4 removed by the last run."""
    view, _ = view_of(("t1", "r1", [user(f"m{n}") for n in range(10)]),
                      ("t1", "r2", [removed("m4")]))
    return view


def ask(api: ThreadApi, route: str = "messages", authorization: str | None = ACME,
        thread: str = "t1", **query: str) -> ApiResponse:
    answer = api.messages if route == "messages" else api.runs
    return asyncio.run(answer(authorization, thread, query))


def ids(response: ApiResponse, entries: str = "messages", field: str = "id") -> list[str]:
    assert response.status == 200, response.body
    return [entry[field] for entry in response.body[entries]]


# --- pages ----------------------------------------------------------------------------


def test_a_plain_read_is_the_whole_thread_in_order_with_no_more() -> None:
    response = ask(ThreadApi(ten_messages(), TOKENS))
    assert ids(response) == ["m0", "m1", "m2", "m3", "m5", "m6", "m7", "m8", "m9"]
    assert response.body["hasMore"] is False
    assert (response.body["firstId"], response.body["lastId"]) == ("m0", "m9")


@pytest.mark.parametrize(("query", "expected", "more"), [
    ({"limit": "3"}, ["m0", "m1", "m2"], True),
    ({"limit": "3", "after": "m2"}, ["m3", "m5", "m6"], True),  # the hole is skipped
    ({"limit": "3", "after": "m7"}, ["m8", "m9"], False),
    ({"limit": "3", "before": "m6"}, ["m2", "m3", "m5"], True),  # the nearest to it
    ({"limit": "3", "before": "m2"}, ["m0", "m1"], False),
    ({"after": "m1", "before": "m6"}, ["m2", "m3", "m5"], False),
    ({"limit": "3", "order": "desc"}, ["m9", "m8", "m7"], True),
    ({"limit": "3", "order": "desc", "after": "m7"}, ["m6", "m5", "m3"], True),
    ({"limit": "3", "order": "desc", "before": "m2"}, ["m6", "m5", "m3"], True),
    ({"limit": "2", "order": "desc", "after": "m1"}, ["m0"], False),
])
def test_pages_between_cursors_in_either_order(query: dict[str, str], expected: list[str],
                                               more: bool) -> None:
    response = ask(ThreadApi(ten_messages(), TOKENS), **query)
    assert ids(response) == expected and response.body["hasMore"] is more


def test_following_last_ids_reads_every_message_once() -> None:
    api, seen, query = ThreadApi(ten_messages(), TOKENS), [], {"limit": "2"}
    while True:
        response = ask(api, **query)
        seen += ids(response)
        if not response.body["hasMore"]:
            break
        query = {"limit": "2", "after": response.body["lastId"]}
    assert seen == ids(ask(api))


def test_a_thread_longer_than_the_maximum_says_so_with_a_cursor() -> None:
    view, _ = view_of(("t1", "r1", [user(f"m{n}") for n in range(MAX_PAGE + 1)]))
    response = ask(ThreadApi(view, TOKENS))
    assert len(response.body["messages"]) == MAX_PAGE and response.body["hasMore"] is True
    rest = ask(ThreadApi(view, TOKENS), after=response.body["lastId"])
    assert ids(rest) == [f"m{MAX_PAGE}"] and rest.body["hasMore"] is False


def test_a_cursor_naming_nothing_is_400() -> None:
    for query in ({"after": "nope"}, {"before": "nope"}):
        response = ask(ThreadApi(ten_messages(), TOKENS), **query)
        assert (response.status, response.body["code"]) == (400, "cursor_not_found")
    response = ask(ThreadApi(ten_messages(), TOKENS), before="m4")  # removed
    assert response.body["code"] == "cursor_not_found"


def test_runs_are_paged_by_run_id() -> None:
    view, _ = view_of(*[("t1", f"r{n}", [user(f"m{n}")]) for n in range(5)])
    api = ThreadApi(view, TOKENS)
    response = ask(api, "runs", limit="2", after="r1")
    assert ids(response, "runs", "runId") == ["r2", "r3"]
    assert response.body["hasMore"] is True and response.body["lastId"] == "r3"
    assert ids(ask(api, "runs", order="desc", limit="2"), "runs", "runId") == ["r4", "r3"]


# --- a run's status -------------------------------------------------------------------


def run_status(api: ThreadApi, run_id: str, authorization: str = ACME, thread: str = "t1",
               **query: str) -> ApiResponse:
    return asyncio.run(api.run(authorization, thread, run_id, query))


def test_a_run_s_status_says_how_it_ended_with_its_failure_code() -> None:
    view, history = view_of(("t1", "r1", [user("m1"), assistant("m2")]))
    feed(view, history.run("t1", "r2", [], outcome="failed",
                           failure={"code": "orphan_event"}))
    api = ThreadApi(view, TOKENS)
    response = run_status(api, "r2")
    assert response.status == 200 and response.body["complete"] is True
    run = response.body["run"]
    assert (run["runId"], run["outcome"], run["failure"]) == ("r2", "failed",
                                                              {"code": "orphan_event"})
    assert run_status(api, "r1").body["run"]["messageCount"] == 2
    assert run_status(api, "r1").body["historyOffset"] == view.thread_offset("acme", "t1")


def test_a_run_s_status_is_404_for_an_unknown_run_thread_or_tenant() -> None:
    view, _ = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS)
    assert run_status(api, "r9").body["code"] == "run_not_found"
    assert run_status(api, "r1", thread="t9").body["code"] == "thread_not_found"
    assert run_status(api, "r1", GLOBEX).body["code"] == "thread_not_found"
    assert run_status(api, "r1", limit="1").status == 400  # takes no parameters


# --- waits ----------------------------------------------------------------------------


def timed(api: ThreadApi, **query: str) -> tuple[ApiResponse, float]:
    started = time.monotonic()
    response = ask(api, **query)
    return response, time.monotonic() - started


def test_a_thread_nobody_has_is_404_at_once_whatever_it_would_wait_for() -> None:
    view, _ = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, max_wait=30.0)
    for authorization, thread in ((ACME, "t9"), (GLOBEX, "t1")):
        response, took = timed(api, authorization=authorization, thread=thread,
                               min_offset="99")
        assert response.body["code"] == "thread_not_found" and took < 1.0


def test_a_run_of_a_thread_not_in_the_view_ends_404_after_the_wait_not_503() -> None:
    """A run's records may be its thread's first, so `run=` waits for the thread too;
    after the wait it is 404 whether another tenant has the thread or nobody does."""
    view, _ = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, max_wait=0.05)
    ours, theirs = ask(api, thread="t9", run="r1"), ask(api, "messages", GLOBEX,
                                                        run="r1")
    assert ours.status == theirs.status == 404 and ours.body == theirs.body


def test_a_first_run_s_thread_is_waited_for() -> None:
    view, history = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, max_wait=30.0)

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(api.messages(ACME, "t2", {"run": "r5"}))
        await asyncio.sleep(0.01)
        assert not request.done()
        feed(view, history.run("t2", "r5", [user("m5")]))
        api.progress.advanced(thread_key("acme", "t2"))
        return await asyncio.wait_for(request, 1.0)

    assert ids(asyncio.run(scenario())) == ["m5"]


def test_run_and_min_offset_share_one_wait() -> None:
    view, _ = view_of(("t1", "r1", [user("m1")]))
    response, took = timed(ThreadApi(view, TOKENS, max_wait=0.3), run="r9",
                           min_offset="99")
    assert response.status == 503 and response.headers["Retry-After"] == "1"
    assert 0.3 <= took < 0.55


def test_history_offset_is_the_thread_s_own() -> None:
    """Another thread's record on the same partition neither moves a thread's
    `historyOffset` nor ends a wait for its `min_offset`."""
    view, history = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, max_wait=0.1)
    before = ask(api).body["historyOffset"]
    feed(view, history.run("t2", "r2", [user("m2")], tenant="globex"))
    assert view.read_offset((HISTORY, 0)) > before
    assert ask(api).body["historyOffset"] == before
    waited = ask(api, min_offset=str(before + 1))
    assert (waited.status, waited.body["historyOffset"]) == (503, before)
    assert ask(api, min_offset=str(before)).status == 200


def test_waiters_past_the_caps_are_429_and_the_others_go_on() -> None:
    view, history = view_of(("t1", "r1", [user("m1")]))
    feed(view, history.run("t1", "r1", [user("m1")], tenant="globex"))
    api = ThreadApi(view, TOKENS, ReadProgress(max_waiters=3, max_waiters_per_tenant=2),
                    max_wait=30.0)

    async def scenario() -> list[int]:
        def waiting(authorization: str) -> asyncio.Task[ApiResponse]:
            return asyncio.create_task(api.messages(authorization, "t1", {"run": "r9"}))

        held = [waiting(ACME), waiting(ACME)]
        await asyncio.sleep(0.01)
        third = await waiting(ACME)  # the tenant's cap
        held.append(waiting(GLOBEX))
        await asyncio.sleep(0.01)
        fourth = await waiting(GLOBEX)  # the total cap
        at_once = await api.messages(ACME, "t1", {})  # a read that need not wait
        assert api.progress.waiting() == 3
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert api.progress.waiting() == 0
        assert third.headers["Retry-After"] == "1"
        return [third.status, fourth.status, at_once.status]

    assert asyncio.run(scenario()) == [429, 429, 200]


# --- readiness ------------------------------------------------------------------------


def test_a_partition_not_ready_here_is_503_with_retry_after_before_any_read() -> None:
    view, _ = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, ready=lambda partition: False)
    for route in ("messages", "runs"):
        response = ask(api, route)
        assert (response.status, response.body["code"]) == (503, "not_ready")
        assert response.headers["Retry-After"] == "2"
    assert ask(api, thread="t9").status == 503  # not 404: this worker cannot know


def test_a_partition_that_moves_during_a_wait_is_503_not_an_answer() -> None:
    view, history = view_of(("t1", "r1", [user("m1")]))
    ready = [True]
    api = ThreadApi(view, TOKENS, max_wait=30.0, ready=lambda partition: ready[0])

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(api.messages(ACME, "t1", {"run": "r2"}))
        await asyncio.sleep(0.01)
        ready[0] = False  # revoked: the view was forgotten
        feed(view, history.run("t1", "r2", [user("m2")]))
        api.progress.advanced(thread_key("acme", "t1"))
        return await asyncio.wait_for(request, 1.0)

    assert asyncio.run(scenario()).body["code"] == "not_ready"


# --- deleting a thread ----------------------------------------------------------------


def eraser(view: ThreadView, history: History, applied: bool = True) -> Eraser:
    """Writes the erasure record; the view applies it at once, or never."""
    async def erase(tenant: str, thread_id: str, partition: HistoryPartition) -> int:
        record = history.record(f"{tenant}/{thread_id}".encode(), HistoryErasure(
            tenant=tenant, threadId=thread_id, erasedAt=1).to_bytes())
        if applied:
            view.apply(record)
        return record.offset

    return erase


def delete(api: ThreadApi, authorization: str = ACME, thread: str = "t1",
           **query: str) -> ApiResponse:
    return asyncio.run(api.delete(authorization, thread, query))


def test_a_deleted_thread_is_gone_once_the_view_applies_its_erasure() -> None:
    view, history = view_of(("t1", "r1", [user("m1")]), ("t2", "r2", [user("m2")]))
    api = ThreadApi(view, TOKENS, eraser=eraser(view, history))
    response = delete(api)
    assert response.status == 200 and response.body["erased"] is True
    assert response.body["historyOffset"] == view.read_offset((HISTORY, 0))
    assert ask(api).body["code"] == "thread_not_found"
    assert ids(ask(api, thread="t2")) == ["m2"]  # the tenant's other thread stays
    assert delete(api).body["code"] == "thread_not_found"  # gone: nothing to erase


def test_an_erasure_not_applied_within_the_wait_is_accepted_202() -> None:
    view, history = view_of(("t1", "r1", [user("m1")]))
    api = ThreadApi(view, TOKENS, max_wait=0.05, eraser=eraser(view, history, False))
    response = delete(api)
    assert response.status == 202 and response.body["erased"] is False


def test_only_the_tenant_s_own_thread_can_be_deleted() -> None:
    view, _ = view_of(("t1", "r1", [user("m1")]))
    erased: list[str] = []

    async def erase(tenant: str, thread_id: str, partition: HistoryPartition) -> int:
        erased.append(tenant)
        return 0

    api = ThreadApi(view, TOKENS, eraser=erase)
    assert delete(api, GLOBEX).body["code"] == "thread_not_found"
    assert delete(api, "Bearer nope").status == 401
    assert delete(api, limit="1").status == 400
    assert erased == [] and ids(ask(api)) == ["m1"]
