"""A client of the thread API: a thread's messages as `ag-ui-protocol` models,
ready to be a run's `RunAgentInput.messages`, and its runs.

    from processors.view.client import fetch_thread_messages, read_thread_messages
    messages = fetch_thread_messages("http://agui-stream:6066", token, "thread-1")
    thread = read_thread_messages("http://agui-stream:6066", token, "thread-1", run="r1")
    thread.messages, thread.complete, thread.incomplete, thread.run  # run: RunSummary
    thread.has_more, thread.last_id  # one page; fetch_thread_messages reads them all
    status = fetch_run("http://agui-stream:6066", token, "thread-1", "r1")
    delete_thread("http://agui-stream:6066", token, "thread-1")  # the user's erasure

Standard library HTTP (urllib) only. Errors name the status and the API's
reason, never the token and never message content.

`encryptedValueType` (AG-UI 1.1, next to every `encryptedValue`) is not a field of
the ag-ui-protocol 1.0 models, but they keep unknown keys (`extra="allow"`): on a
parsed message or tool call it is `model.model_extra["encryptedValueType"]`, under
that exact key (not snake_case), and `model.model_dump(by_alias=True,
exclude_none=True)` (or `model_dump_json`, or a `RunAgentInput` holding the
models) gives the message back with it, the encrypted value and its type
unchanged. tests/view/test_client.py holds this to the installed models.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Final

import orjson
from ag_ui.core import Message
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

_MESSAGES: Final[TypeAdapter[list[Any]]] = TypeAdapter(list[Message])


class RunSummary(BaseModel):
    """A run of the thread, as its closing records left it (docs/thread-view.md)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="allow", frozen=True)

    run_id: str
    # success, interrupt, cancelled, error (a late error too), failed, abandoned
    outcome: str
    message_count: int | None = None  # content records the run published
    pending_tool_call_ids: list[str] | None = None
    interrupts: list[dict[str, Any]] | None = None
    usage: list[dict[str, Any]] | None = None
    error: dict[str, Any] | None = None  # {message, code?}
    failure: dict[str, Any] | None = None  # {code}: failed / abandoned
    input_echoed: bool | None = None  # False: its RUN_STARTED carried no input
    late: bool | None = None  # True: a RUN_ERROR after the run had finished
    first_time: int
    last_time: int


_RUNS: Final[TypeAdapter[list[RunSummary]]] = TypeAdapter(list[RunSummary])


@dataclass(frozen=True, slots=True)
class ThreadMessages:
    """The messages answer of the thread API."""

    messages: list[Message]
    # False: the thread may lack messages, `incomplete` says why (a run that did not
    # echo RUN_STARTED.input; the run asked for not wholly in the view). A server
    # that does not say (before AG-UI 1.1) is taken as True.
    complete: bool
    incomplete: str | None
    history_offset: int
    run: RunSummary | None  # the run asked for with `run`
    has_more: bool = False  # more messages beyond this page: ask `after=last_id`
    first_id: str | None = None
    last_id: str | None = None


@dataclass(frozen=True, slots=True)
class RunStatus:
    """What became of one run (`GET /v1/threads/{threadId}/runs/{runId}`)."""

    run: RunSummary
    complete: bool  # all the content records its closing record counts are in the view
    history_offset: int


@dataclass(frozen=True, slots=True)
class ThreadRuns:
    """The thread answer of the thread API: its runs, in order."""

    runs: list[RunSummary]
    history_offset: int


class ThreadApiError(Exception):
    """The thread API did not answer with the thread's messages. `code`: the API's
    error code (docs/thread-view.md, *Answers*); `retry_after`: the seconds it asked
    the caller to wait before retrying (503, 429)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Unauthorized(ThreadApiError):
    """401: the token is unknown, or the API is disabled on the server."""


class ThreadNotFound(ThreadApiError):
    """404: the token's tenant has no such thread (the view may not have read it yet)."""


class RunNotFound(ThreadApiError):
    """404: the thread has no such run (its closing record is not in the view)."""


class ThreadApiUnreachable(ThreadApiError):
    """No answer: the connection failed or timed out."""


def fetch_thread_messages(base_url: str, token: str, thread_id: str,
                          after: str | None = None, *, run: str | None = None,
                          min_offset: int | None = None,
                          timeout: float = 15.0) -> list[Message]:
    """The thread's messages (only those after the message `after`, if given), every
    page of them. `run`: first let the view take in that run (the one the caller just
    finished); `min_offset`: first let the view read the thread's history up to this
    offset. Each later page is read at least as far as the first."""
    page = read_thread_messages(base_url, token, thread_id, after, run=run,
                                min_offset=min_offset, timeout=timeout)
    messages = list(page.messages)
    while page.has_more and page.last_id is not None:
        page = read_thread_messages(base_url, token, thread_id, page.last_id,
                                    min_offset=page.history_offset, timeout=timeout)
        messages += page.messages
    return messages


def read_thread_messages(base_url: str, token: str, thread_id: str,
                         after: str | None = None, *, run: str | None = None,
                         min_offset: int | None = None, limit: int | None = None,
                         before: str | None = None, descending: bool = False,
                         timeout: float = 15.0) -> ThreadMessages:
    """One page of `fetch_thread_messages`, with the rest of the answer: whether the
    thread is complete, the summary of the run given as `run`, and the cursors."""
    body = _get(base_url, token, thread_id, "/messages", (
        ("after", after), ("before", before), ("limit", limit),
        ("order", "desc" if descending else None), ("run", run), ("min_offset", min_offset),
    ), timeout)
    try:
        messages = _MESSAGES.validate_python(body["messages"])
        complete, incomplete = body.get("complete", True), body.get("incomplete")
        has_more = body.get("hasMore", False)
        first_id, last_id = body.get("firstId"), body.get("lastId")
        if (not isinstance(complete, bool) or not isinstance(incomplete, str | None)
                or not isinstance(has_more, bool) or not isinstance(first_id, str | None)
                or not isinstance(last_id, str | None)):
            raise TypeError
        run_summary = None if body.get("run") is None else RunSummary.model_validate(
            body["run"])
        return ThreadMessages(messages, complete, incomplete, _history_offset(body),
                              run_summary, has_more, first_id, last_id)
    except (KeyError, TypeError, ValidationError):
        raise ThreadApiError("the answer is not a thread's messages", 200) from None


def fetch_run(base_url: str, token: str, thread_id: str, run_id: str, *,
              timeout: float = 15.0) -> RunStatus:
    """What became of the run, at once (no wait): `RunNotFound` while its closing
    record is not in the view."""
    body = _get(base_url, token, thread_id, f"/runs/{urllib.parse.quote(run_id, safe='')}",
                (), timeout)
    try:
        complete = body["complete"]
        if not isinstance(complete, bool):
            raise TypeError
        return RunStatus(RunSummary.model_validate(body["run"]), complete,
                         _history_offset(body))
    except (KeyError, TypeError, ValidationError):
        raise ThreadApiError("the answer is not a run's status", 200) from None


def fetch_thread_runs(base_url: str, token: str, thread_id: str, *, run: str | None = None,
                      min_offset: int | None = None, timeout: float = 15.0) -> ThreadRuns:
    """The thread's runs (`GET /v1/threads/{threadId}`), every page of them; `run` and
    `min_offset` as for `fetch_thread_messages`."""
    runs: list[RunSummary] = []
    after: str | None = None
    while True:
        body = _get(base_url, token, thread_id, "",
                    (("after", after), ("run", run), ("min_offset", min_offset)), timeout)
        try:
            runs += _RUNS.validate_python(body["runs"])
            offset, after = _history_offset(body), body.get("lastId")
            if not body.get("hasMore") or not isinstance(after, str):
                return ThreadRuns(runs, offset)
        except (KeyError, TypeError, ValidationError):
            raise ThreadApiError("the answer is not a thread's runs", 200) from None
        run, min_offset = None, offset


def delete_thread(base_url: str, token: str, thread_id: str, *,
                  timeout: float = 15.0) -> bool:
    """Erase the thread (`DELETE /v1/threads/{threadId}`): True once the view has
    dropped it, False if the erasure is written but not applied yet (202)."""
    body = _get(base_url, token, thread_id, "", (), timeout, method="DELETE")
    erased = body.get("erased")
    if not isinstance(erased, bool):
        raise ThreadApiError("the answer is not an erasure's", 200)
    return erased


def _history_offset(body: dict[str, Any]) -> int:
    offset = body["historyOffset"]
    if type(offset) is not int:
        raise TypeError
    return offset


def _get(base_url: str, token: str, thread_id: str, route: str,
         parameters: tuple[tuple[str, object], ...], timeout: float,
         method: str = "GET") -> dict[str, Any]:
    """The JSON object the API answered 2xx with; else the error for its answer."""
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError("base_url must be an http:// or https:// URL")
    query = {name: str(value) for name, value in parameters if value is not None}
    url = (f"{base_url.rstrip('/')}/v1/threads/{urllib.parse.quote(thread_id, safe='')}"
           f"{route}{'?' + urllib.parse.urlencode(query) if query else ''}")
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise _refusal(error.code, error.read(), error.headers.get("Retry-After")) from None
    except (OSError, http.client.HTTPException) as error:  # URLError, timeouts, resets
        reason = getattr(error, "reason", error)
        raise ThreadApiUnreachable(f"the thread API at {base_url} did not answer"
                                   f" ({type(reason).__name__})") from None
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise ThreadApiError("the answer is not a JSON object", 200)
    return answer


def _refusal(status: int, body: bytes, retry_after: str | None) -> ThreadApiError:
    reason, code = _reason(body)
    kind = {401: Unauthorized, 404: RunNotFound if code == "run_not_found"
            else ThreadNotFound}.get(status, ThreadApiError)
    seconds = int(retry_after) if retry_after is not None and retry_after.isdigit() \
        and len(retry_after) < 5 else None
    return kind(f"the thread API answered {status}: {reason}", status, code, seconds)


def _reason(body: bytes) -> tuple[str, str | None]:
    """The API's `error` text (it names no content), or a placeholder; its `code`."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "(no reason given)", None
    if not isinstance(answer, dict):
        return "(no reason given)", None
    reason, code = answer.get("error"), answer.get("code")
    return (reason[:200] if isinstance(reason, str) else "(no reason given)",
            code[:100] if isinstance(code, str) else None)
