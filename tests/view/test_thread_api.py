"""The thread API without a web server: authentication, tenant isolation,
parameters, consistent reads, and messages the next run can take as they are."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from ag_ui.core import RunAgentInput

from processors.view.tenant_tokens import TenantTokens, token_line
from processors.view.thread_api import ApiResponse, ReadProgress, ThreadApi
from processors.view.thread_view import (
    Cursors,
    HistoryPartition,
    Missing,
    Page,
    RunStatus,
    ThreadView,
    thread_key,
)
from tests.view_helpers import HISTORY, History, assistant, continued, feed, user
from topics.records import HistoryMessage, HistoryRun

ACME = "Bearer acme-token"
GLOBEX = "Bearer globex-token"
TOKENS = TenantTokens.parse(
    f"{token_line('acme', 'acme-token')}\n{token_line('globex', 'globex-token')}", "tokens")

REASONING = {"id": "m2", "role": "reasoning", "content": "step by step",
             "encryptedValue": "gAAAA\u00e9==/+", "encryptedValueType": "kms/v1\u2028"}
TOOL_CALL = {"id": "m3", "role": "assistant", "toolCalls": [
    {"id": "c1", "type": "function",
     "function": {"name": "search", "arguments": "{\"q\": 1}"}, "encryptedValue": "zz"}]}
T1 = thread_key("acme", "t1")
TOOL_RESULT = {"id": "m4", "role": "tool", "toolCallId": "c1", "content": "found"}


def fed_view() -> tuple[ThreadView, History]:
    history = History()
    view = ThreadView({}, partitions=1, retention_seconds=86_400.0)
    feed(view, history.run("t1", "r1", [user("m1"), REASONING, TOOL_CALL, TOOL_RESULT]))
    feed(view, history.run("t1", "r2", [user("m5"), assistant("m6")], outcome="error"))
    return view, history


def api(tokens: TenantTokens | None = TOKENS, max_wait: float = 1.0) -> ThreadApi:
    return ThreadApi(fed_view()[0], tokens, max_wait=max_wait)


def messages(api: ThreadApi, authorization: str | None = ACME, thread: str = "t1",
             **query: str) -> ApiResponse:
    return asyncio.run(api.messages(authorization, thread, query))


def runs(api: ThreadApi, authorization: str | None = ACME, thread: str = "t1",
         **query: str) -> ApiResponse:
    return asyncio.run(api.runs(authorization, thread, query))


def run(api: ThreadApi, run_id: str, authorization: str | None = ACME, thread: str = "t1",
        **query: str) -> ApiResponse:
    return asyncio.run(api.run(authorization, thread, run_id, query))


def test_messages_are_what_the_next_run_takes() -> None:
    response = messages(api())
    assert response.status == 200
    body = response.body
    assert body["threadId"] == "t1" and body["historyOffset"] == 7
    assert body["messages"] == [user("m1"), REASONING, TOOL_CALL, TOOL_RESULT, user("m5"),
                                assistant("m6")]
    run_input = RunAgentInput.model_validate({
        "threadId": "t1", "runId": "r3", "state": {}, "tools": [], "context": [],
        "forwardedProps": {}, "messages": body["messages"]})
    assert [message.id for message in run_input.messages] == ["m1", "m2", "m3", "m4", "m5",
                                                              "m6"]


def test_encrypted_values_come_back_byte_for_byte_in_the_response() -> None:
    body = messages(api()).json()
    assert b'"encryptedValue":"gAAAA\xc3\xa9==/+","encryptedValueType":"kms/v1\xe2\x80\xa8"' \
        in body


def test_a_thread_whose_runs_echoed_their_input_is_complete() -> None:
    body = messages(api()).body
    assert body["complete"] is True and "incomplete" not in body


def test_a_run_that_did_not_echo_its_input_makes_the_thread_incomplete() -> None:
    view, history = fed_view()
    feed(view, history.run("t1", "r3", [assistant("m7")], inputEchoed=False))
    body = messages(ThreadApi(view, TOKENS)).body
    assert body["complete"] is False
    assert "RUN_STARTED.input" in body["incomplete"] and len(body["incomplete"]) < 200
    assert [m["id"] for m in body["messages"]][-1] == "m7"  # the messages all the same


def test_after_reads_incrementally() -> None:
    response = messages(api(), after="m4")
    assert [m["id"] for m in response.body["messages"]] == ["m5", "m6"]
    assert messages(api(), after="m6").body["messages"] == []


@pytest.mark.parametrize("after", ["nope", ""])
def test_an_after_naming_no_message_is_a_bad_request(after: str) -> None:
    response = messages(api(), after=after)
    assert response.status == 400 and response.body["error"].startswith("after:")


def test_runs_lists_each_run_with_its_outcome_and_count() -> None:
    response = runs(api())
    assert response.status == 200
    assert [(run["runId"], run["outcome"], run["messageCount"])
            for run in response.body["runs"]] == [("r1", "success", 4), ("r2", "error", 2)]
    assert response.body["historyOffset"] == 7


def test_runs_carry_the_closing_records_fields_and_a_late_error() -> None:
    view, history = fed_view()
    feed(view, history.run("t1", "r3", [assistant("m7")], outcome="interrupt",
                           interrupts=[{"id": "i1"}], inputEchoed=True))
    feed(view, [history.late_error("t1", "r1")])
    body = runs(ThreadApi(view, TOKENS)).body
    by_id = {run["runId"]: run for run in body["runs"]}
    assert by_id["r1"]["outcome"] == "error" and by_id["r1"]["late"] is True
    assert by_id["r1"]["messageCount"] == 4
    assert by_id["r3"]["interrupts"] == [{"id": "i1"}] and by_id["r3"]["inputEchoed"] is True
    # The late error kept the run's messages.
    assert [m["id"] for m in messages(ThreadApi(view, TOKENS)).body["messages"]][:4] == [
        "m1", "m2", "m3", "m4"]


@pytest.mark.parametrize("route", [messages, runs])
@pytest.mark.parametrize("authorization", [None, "", "Bearer wrong", "Basic acme-token",
                                           "acme-token"])
def test_without_a_valid_token_the_answer_is_401(route: Any, authorization: str | None) -> None:
    response = route(api(), authorization)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "t1" not in response.json().decode()


def test_without_a_tokens_file_every_request_is_401_and_says_why() -> None:
    response = messages(api(tokens=None))
    assert response.status == 401 and "AGUI_TOKENS_FILE" in response.body["error"]


@pytest.mark.parametrize("route", [messages, runs])
def test_another_tenants_thread_is_not_found_like_a_thread_nobody_has(route: Any) -> None:
    others = route(api(), GLOBEX, "t1")
    nobody = route(api(), ACME, "t9")
    assert others.status == 404
    assert (others.status, others.body, others.headers) == (
        nobody.status, nobody.body, nobody.headers)
    assert route(api(), ACME, "").status == 404


@pytest.mark.parametrize("query", [
    {"min_offset": "-1"}, {"min_offset": "x"}, {"min_offset": "\uff11"},
    {"min_offset": str(2**63)}, {"min_offset": ""}, {"min_offset": "9" * 5000},
    {"limit": "0"}, {"limit": "1001"}, {"limit": "1" * 5000}, {"order": "up"},
    {"after": ""}, {"before": ""}, {"run": ""}, {"wait": "1"}])
def test_bad_parameters_are_400_with_a_code(query: dict[str, str]) -> None:
    for response in (messages(api(), **query), runs(api(), **query)):
        assert response.status == 400 and response.body["code"] == "bad_parameter"


def test_every_error_names_a_stable_code() -> None:
    assert messages(api(), None).body["code"] == "unauthorized"
    assert messages(api(None)).body["code"] == "api_disabled"
    assert messages(api(), thread="t9").body["code"] == "thread_not_found"
    assert messages(api(), after="nope").body["code"] == "cursor_not_found"
    assert messages(api(max_wait=0.0), run="r9").body["code"] == "wait_timeout"
    assert run(api(), "r9").body["code"] == "run_not_found"


def test_a_min_offset_already_read_answers_at_once() -> None:
    response = messages(api(max_wait=0.0), min_offset="7")
    assert response.status == 200


def test_a_min_offset_not_read_in_time_is_503_with_the_offset_read() -> None:
    response = messages(api(max_wait=0.05), min_offset="8")
    assert response.status == 503 and response.body["historyOffset"] == 7


def test_a_request_waits_until_the_view_reads_its_min_offset() -> None:
    view, history = fed_view()
    thread_api = ThreadApi(view, TOKENS, max_wait=30.0)

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(thread_api.messages(ACME, "t1", {"min_offset": "9"}))
        await asyncio.sleep(0.01)
        assert not request.done()
        records = history.run("t1", "r3", [user("m7")])
        for record in records:  # one wake per record, as the agent would
            feed(view, [record])
            thread_api.progress.advanced(T1)
            await asyncio.sleep(0)
        return await asyncio.wait_for(request, 1.0)  # woken, not timed out

    response = asyncio.run(scenario())
    assert response.status == 200 and response.body["historyOffset"] == 9
    assert response.body["messages"][-1]["id"] == "m7"


def test_a_request_for_a_run_waits_for_its_closing_record() -> None:
    """What an agent server asks before a thread's next run: it knows the run it has
    just finished, not the offset of its closing record."""
    view, history = fed_view()
    thread_api = ThreadApi(view, TOKENS, max_wait=30.0)

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(thread_api.runs(ACME, "t1", {"run": "r3"}))
        records = history.run("t1", "r3", [user("m7"), assistant("m8")])
        for record in records:
            await asyncio.sleep(0)
            assert not request.done()  # not before the closing record
            feed(view, [record])
            thread_api.progress.advanced(T1)
        return await asyncio.wait_for(request, 1.0)

    response = asyncio.run(scenario())
    assert response.status == 200 and response.body["runs"][-1]["runId"] == "r3"


def test_the_messages_for_a_run_carry_its_summary() -> None:
    response = messages(api(max_wait=0.0), run="r2")
    assert response.status == 200 and response.body["complete"] is True
    assert response.body["run"]["runId"] == "r2" and response.body["run"]["outcome"] == "error"
    assert "run" not in messages(api()).body


def test_a_failed_run_ends_the_wait_at_its_closing_record() -> None:
    """A failed run publishes its closing record (no content): the wait for it ends
    there, with the messages held and the run's outcome, not with a 503 at the end."""
    view, history = fed_view()
    thread_api = ThreadApi(view, TOKENS, max_wait=30.0)

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(thread_api.messages(ACME, "t1", {"run": "r3"}))
        await asyncio.sleep(0.01)
        assert not request.done()
        feed(view, history.run("t1", "r3", [], outcome="failed",
                               failure={"code": "orphan_event"}))
        thread_api.progress.advanced(T1)
        return await asyncio.wait_for(request, 1.0)

    response = asyncio.run(scenario())
    assert response.status == 200
    assert response.body["run"]["outcome"] == "failed"
    assert response.body["run"]["failure"] == {"code": "orphan_event"}
    assert len(response.body["messages"]) == 6 and response.body["complete"] is True


def test_a_run_waits_for_the_content_records_its_closing_record_counts() -> None:
    view, history = fed_view()
    thread_api = ThreadApi(view, TOKENS, max_wait=30.0)
    key = b"acme/t1"
    first = history.record(key, HistoryMessage.encode("acme", "t1", "r3", 0, user("m7")))
    closing = history.record(key, HistoryRun(tenant="acme", threadId="t1", runId="r3",
                                             outcome="success", messageCount=2).to_bytes())
    last = history.record(key, HistoryMessage.encode("acme", "t1", "r3", 1, user("m8")))

    async def scenario() -> ApiResponse:
        request = asyncio.create_task(thread_api.messages(ACME, "t1", {"run": "r3"}))
        for record in (first, closing):
            feed(view, [record])
            thread_api.progress.advanced(T1)
            await asyncio.sleep(0)
            assert not request.done()
        feed(view, [last])
        thread_api.progress.advanced(T1)
        return await asyncio.wait_for(request, 1.0)

    response = asyncio.run(scenario())
    assert response.status == 200 and response.body["complete"] is True
    assert [m["id"] for m in response.body["messages"]][-2:] == ["m7", "m8"]


def test_a_closed_run_missing_content_records_after_the_wait_is_200_and_incomplete() -> None:
    view, history = fed_view()
    feed(view, [history.record(b"acme/t1", HistoryRun(
        tenant="acme", threadId="t1", runId="r3", outcome="success",
        messageCount=1).to_bytes())])
    feed(view, history.run("t1", "r4", [continued(user("m1", "!"))])[:1])  # r4 still open
    response = messages(ThreadApi(view, TOKENS, max_wait=0.05), run="r3")
    assert response.status == 200 and response.body["complete"] is False
    assert response.body["incomplete"] == "the run's content records are not all in the view yet"
    assert response.body["run"]["runId"] == "r3"
    assert runs(ThreadApi(view, TOKENS, max_wait=0.05), run="r3").status == 200
    assert messages(ThreadApi(view, TOKENS, max_wait=0.05), run="r4").status == 503


def test_a_run_not_in_the_view_in_time_is_503_and_an_empty_run_400() -> None:
    assert messages(api(max_wait=0.05), run="r9").status == 503
    assert messages(api(max_wait=0.0), run="r1").status == 200
    assert runs(api(), run="").status == 400


def test_read_progress_wakes_every_waiter_and_only_when_reached() -> None:
    async def scenario() -> list[bool]:
        progress, offset = ReadProgress(), [0]
        deadline = asyncio.get_running_loop().time() + 30.0
        waiters = [asyncio.create_task(
            progress.wait_until(T1, lambda n=n: offset[0] >= n, deadline)) for n in (1, 2)]
        await asyncio.sleep(0)
        offset[0] = 1
        progress.advanced(T1)
        await asyncio.sleep(0)
        assert waiters[0].done() and not waiters[1].done()
        offset[0] = 2
        progress.advanced(T1)
        return list(await asyncio.wait_for(asyncio.gather(*waiters), 1.0))

    assert asyncio.run(scenario()) == [True, True]


def test_a_waiter_is_woken_only_by_its_own_thread_s_records() -> None:
    async def scenario() -> int:
        progress, checks = ReadProgress(), [0]

        def reached() -> bool:
            checks[0] += 1
            return False

        deadline = asyncio.get_running_loop().time() + 30.0
        waiter = asyncio.create_task(progress.wait_until(T1, reached, deadline))
        await asyncio.sleep(0)
        for _ in range(100):  # another thread's records, on the same partition or not
            progress.advanced(thread_key("acme", "t2"))
            await asyncio.sleep(0)
        progress.advanced(T1)
        await asyncio.sleep(0)
        waiter.cancel()
        return checks[0]

    assert asyncio.run(scenario()) == 2  # once at first, once for its thread


class BrokenReader:
    def message_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing:
        raise ValueError(REASONING["content"])  # as a JSON error could

    def run_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing:
        raise ValueError(REASONING["content"])  # as a JSON error could

    def unechoed_runs(self, tenant: str, thread_id: str) -> int:
        return 0

    def thread_offset(self, tenant: str, thread_id: str) -> int | None:
        return 0

    def partition_for(self, tenant: str, thread_id: str) -> HistoryPartition:
        return HISTORY, 0

    def run_status(self, tenant: str, thread_id: str, run_id: str) -> RunStatus | None:
        return RunStatus({"runId": run_id, "outcome": "success"}, True)


@pytest.mark.parametrize("route", [messages, runs])
def test_an_error_in_the_view_is_500_and_logged_without_its_message(
        route: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="agui_stream"):
        response = route(ThreadApi(BrokenReader(), TOKENS))
    secret = REASONING["content"]
    assert response.status == 500 and secret not in response.json().decode()
    assert "ValueError" in caplog.text and secret not in caplog.text
