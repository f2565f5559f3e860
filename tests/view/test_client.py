"""The thread API client against a local HTTP server serving a `ThreadApi`."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
from ag_ui.core import AssistantMessage, ReasoningMessage, RunAgentInput, UserMessage

from processors.view.client import (
    RunNotFound,
    RunSummary,
    ThreadApiError,
    ThreadApiUnreachable,
    ThreadNotFound,
    Unauthorized,
    delete_thread,
    fetch_run,
    fetch_thread_messages,
    fetch_thread_runs,
    read_thread_messages,
)
from processors.view.tenant_tokens import TenantTokens, token_line
from processors.view.thread_api import MAX_PAGE, ThreadApi
from processors.view.thread_view import HistoryPartition, ThreadView
from tests.view_helpers import History, assistant, feed, user
from topics.records import HistoryErasure

TOKEN = "acme-token"
THREAD = "thread 1/ä?"  # quoted into one path segment
REASONING = {"id": "m2", "role": "reasoning", "content": "step",
             "encryptedValue": "gAAAA\u00e9==/+", "encryptedValueType": "kms/\u00e9\u2028"}
TOOL_CALL = {"id": "m4", "role": "assistant", "toolCalls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"},
     "encryptedValue": "zz\U0001f600", "encryptedValueType": "t"}],
    "encryptedValue": "yy", "encryptedValueType": "u"}


def serve(api: ThreadApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            segments = url.path.split("/")  # '', v1, threads, <id>[, messages|runs, <id>]
            query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
            response = None
            if segments[1:3] == ["v1", "threads"] and len(segments) >= 4:
                authorization = self.headers.get("Authorization")
                thread_id, rest = urllib.parse.unquote(segments[3]), segments[4:]
                if rest == []:
                    response = asyncio.run(api.runs(authorization, thread_id, query))
                elif rest == ["messages"]:
                    response = asyncio.run(api.messages(authorization, thread_id, query))
                elif len(rest) == 2 and rest[0] == "runs":
                    response = asyncio.run(api.run(authorization, thread_id,
                                                   urllib.parse.unquote(rest[1]), query))
            if response is not None:
                self.send_response(response.status)
                for name, value in response.headers.items():
                    self.send_header(name, value)
                body = response.json()
            else:
                self.send_response(500)
                body = b"not json"
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self) -> None:
            thread_id = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path.split("/")[3])
            response = asyncio.run(api.delete(self.headers.get("Authorization"), thread_id, {}))
            body = response.json()
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def base_url() -> Iterator[str]:
    view = ThreadView({}, partitions=1, retention_seconds=86_400.0)
    history = History()
    feed(view, history.run(THREAD, "r1", [user("m1"), REASONING, assistant("m3")],
                           inputEchoed=True))
    feed(view, history.run(THREAD, "r2", [TOOL_CALL], pendingToolCallIds=["c1"],
                           inputEchoed=False))
    feed(view, history.run("long", "r3", [user(f"m{n}") for n in range(MAX_PAGE + 5)]))
    feed(view, history.run("long", "r4", [], outcome="failed",
                           failure={"code": "orphan_event"}))
    async def erase(tenant: str, thread_id: str, partition: HistoryPartition) -> int:
        record = history.record(f"{tenant}/{thread_id}".encode(), HistoryErasure(
            tenant=tenant, threadId=thread_id, erasedAt=1).to_bytes())
        view.apply(record)
        return record.offset

    api = ThreadApi(view, TenantTokens.parse(token_line("acme", TOKEN), "tokens"), max_wait=0.2,
                    eraser=erase)
    server = ThreadingHTTPServer(("127.0.0.1", 0), serve(api))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_messages_come_back_as_ag_ui_models(base_url: str) -> None:
    messages = fetch_thread_messages(base_url, TOKEN, THREAD)
    assert [type(m) for m in messages] == [UserMessage, ReasoningMessage, AssistantMessage,
                                           AssistantMessage]
    assert messages[1].encrypted_value == REASONING["encryptedValue"]


def test_an_encrypted_value_and_its_type_round_trip_unchanged(base_url: str) -> None:
    """ag-ui-protocol 1.0 has no `encryptedValueType` field; its models keep it as an
    extra key, and give it back as it came, on messages and tool calls."""
    messages = fetch_thread_messages(base_url, TOKEN, THREAD)
    reasoning, tool_call = messages[1], messages[3]
    assert reasoning.model_extra == {"encryptedValueType": REASONING["encryptedValueType"]}
    assert reasoning.model_dump(by_alias=True, exclude_none=True) == REASONING
    assert tool_call.model_dump(by_alias=True, exclude_none=True) == TOOL_CALL
    assert isinstance(tool_call, AssistantMessage) and tool_call.tool_calls is not None
    assert tool_call.tool_calls[0].model_extra == {"encryptedValueType": "t"}
    run_input = RunAgentInput(thread_id=THREAD, run_id="r3", state={}, tools=[], context=[],
                              forwarded_props={}, messages=[reasoning, tool_call])
    sent = orjson.loads(run_input.model_dump_json(by_alias=True, exclude_none=True))
    assert sent["messages"] == [REASONING, TOOL_CALL]


def test_the_rest_of_the_answer_is_read_too(base_url: str) -> None:
    thread = read_thread_messages(base_url, TOKEN, THREAD, run="r2")
    assert [m.id for m in thread.messages] == ["m1", "m2", "m3", "m4"]
    assert thread.complete is False and thread.incomplete is not None
    assert "RUN_STARTED.input" in thread.incomplete
    assert thread.history_offset == 5
    assert thread.run is not None and thread.run.run_id == "r2"
    assert thread.run.pending_tool_call_ids == ["c1"] and thread.run.input_echoed is False


def test_the_runs_come_back_as_summaries(base_url: str) -> None:
    runs = fetch_thread_runs(base_url, TOKEN, THREAD, run="r1")
    assert runs.history_offset == 5
    assert runs.runs == [
        RunSummary(run_id="r1", outcome="success", message_count=3, input_echoed=True,
                   first_time=runs.runs[0].first_time, last_time=runs.runs[0].last_time),
        RunSummary(run_id="r2", outcome="success", message_count=1,
                   pending_tool_call_ids=["c1"], input_echoed=False,
                   first_time=runs.runs[1].first_time, last_time=runs.runs[1].last_time)]
    with pytest.raises(ThreadNotFound):
        fetch_thread_runs(base_url, TOKEN, "other")


def test_after_run_and_min_offset_are_passed_on(base_url: str) -> None:
    messages = fetch_thread_messages(base_url + "/", TOKEN, THREAD, "m1", min_offset=3)
    assert [m.id for m in messages] == ["m2", "m3", "m4"]
    assert len(fetch_thread_messages(base_url, TOKEN, THREAD, run="r1")) == 4
    with pytest.raises(ThreadApiError) as raised:  # a run the view never gets: 503
        fetch_thread_messages(base_url, TOKEN, THREAD, run="r-unknown")
    assert (raised.value.status, raised.value.code, raised.value.retry_after) == (
        503, "wait_timeout", 1)


def test_pages_are_read_one_by_one_or_all_followed(base_url: str) -> None:
    page = read_thread_messages(base_url, TOKEN, "long", limit=2, descending=True)
    assert [m.id for m in page.messages] == [f"m{MAX_PAGE + 4}", f"m{MAX_PAGE + 3}"]
    assert page.has_more and page.last_id == f"m{MAX_PAGE + 3}"
    first = read_thread_messages(base_url, TOKEN, "long")
    assert len(first.messages) == MAX_PAGE and first.has_more
    every = fetch_thread_messages(base_url, TOKEN, "long")
    assert [m.id for m in every] == [f"m{n}" for n in range(MAX_PAGE + 5)]


def test_a_run_s_status_says_how_it_ended(base_url: str) -> None:
    status = fetch_run(base_url, TOKEN, "long", "r4")
    assert status.complete and status.run.outcome == "failed"
    assert status.run.failure == {"code": "orphan_event"}
    with pytest.raises(RunNotFound) as raised:
        fetch_run(base_url, TOKEN, "long", "r/unknown")
    assert (raised.value.status, raised.value.code) == (404, "run_not_found")


def test_an_unknown_token_is_unauthorized_and_the_error_does_not_name_it(
        base_url: str) -> None:
    with pytest.raises(Unauthorized) as raised:
        fetch_thread_messages(base_url, "not-a-token", THREAD)
    assert raised.value.status == 401 and "not-a-token" not in str(raised.value)


def test_an_unknown_thread_is_not_found(base_url: str) -> None:
    with pytest.raises(ThreadNotFound, match="404: no such thread"):
        fetch_thread_messages(base_url, TOKEN, "other")


def test_another_refusal_carries_its_status_and_reason(base_url: str) -> None:
    with pytest.raises(ThreadApiError, match="400: after:") as raised:
        fetch_thread_messages(base_url, TOKEN, THREAD, "nope")
    assert raised.value.status == 400


def test_a_server_answering_something_else_is_an_error(base_url: str) -> None:
    with pytest.raises(ThreadApiError, match="500: \\(no reason given\\)"):
        fetch_thread_messages(base_url + "/elsewhere", TOKEN, THREAD)


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ThreadApiUnreachable):
        fetch_thread_messages(f"http://127.0.0.1:{port}", TOKEN, THREAD, timeout=2.0)


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections queue up, nothing is ever read or written
        with pytest.raises(ThreadApiUnreachable, match="TimeoutError"):
            fetch_thread_messages(f"http://127.0.0.1:{silent.getsockname()[1]}", TOKEN,
                                  THREAD, timeout=0.2)


def test_only_http_urls_are_fetched() -> None:
    with pytest.raises(ValueError, match="http"):
        fetch_thread_messages("file:///etc/passwd", TOKEN, THREAD)


def test_a_deleted_thread_is_not_found_afterwards(base_url: str) -> None:
    assert delete_thread(base_url, TOKEN, "long") is True
    with pytest.raises(ThreadNotFound):
        fetch_thread_messages(base_url, TOKEN, "long")
    with pytest.raises(ThreadNotFound):
        delete_thread(base_url, TOKEN, "long")
