"""A client of the thread API: a thread's messages as `ag-ui-protocol` models,
ready to be a run's `RunAgentInput.messages`, and its runs.

    from processors.view.client import fetch_thread_messages, read_thread_messages
    messages = fetch_thread_messages("http://agui-stream:6066", token, "thread-1")
    thread = read_thread_messages("http://agui-stream:6066", token, "thread-1", run="r1")
    thread.messages, thread.complete, thread.incomplete, thread.run  # run: RunSummary

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


@dataclass(frozen=True, slots=True)
class ThreadRuns:
    """The thread answer of the thread API: its runs, in order."""

    runs: list[RunSummary]
    history_offset: int


class ThreadApiError(Exception):
    """The thread API did not answer with the thread's messages."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unauthorized(ThreadApiError):
    """401: the token is unknown, or the API is disabled on the server."""


class ThreadNotFound(ThreadApiError):
    """404: the token's tenant has no such thread (the view may not have read it yet)."""


class ThreadApiUnreachable(ThreadApiError):
    """No answer: the connection failed or timed out."""


def fetch_thread_messages(base_url: str, token: str, thread_id: str,
                          after: str | None = None, *, run: str | None = None,
                          min_offset: int | None = None,
                          timeout: float = 15.0) -> list[Message]:
    """The thread's messages (only those after the message `after`, if given).
    `run`: first let the view take in that run (the one the caller just finished);
    `min_offset`: first let the view read the history up to this offset."""
    return read_thread_messages(base_url, token, thread_id, after, run=run,
                                min_offset=min_offset, timeout=timeout).messages


def read_thread_messages(base_url: str, token: str, thread_id: str,
                         after: str | None = None, *, run: str | None = None,
                         min_offset: int | None = None,
                         timeout: float = 15.0) -> ThreadMessages:
    """As `fetch_thread_messages`, with the rest of the answer: whether the thread is
    complete, and the summary of the run given as `run`."""
    body = _get(base_url, token, thread_id, "/messages",
                (("after", after), ("run", run), ("min_offset", min_offset)), timeout)
    try:
        messages = _MESSAGES.validate_python(body["messages"])
        complete, incomplete = body.get("complete", True), body.get("incomplete")
        if not isinstance(complete, bool) or not isinstance(incomplete, str | None):
            raise TypeError
        run_summary = None if body.get("run") is None else RunSummary.model_validate(
            body["run"])
        return ThreadMessages(messages, complete, incomplete, _history_offset(body),
                              run_summary)
    except (KeyError, TypeError, ValidationError):
        raise ThreadApiError("the answer is not a thread's messages", 200) from None


def fetch_thread_runs(base_url: str, token: str, thread_id: str, *, run: str | None = None,
                      min_offset: int | None = None, timeout: float = 15.0) -> ThreadRuns:
    """The thread's runs (`GET /v1/threads/{threadId}`); `run` and `min_offset` as for
    `fetch_thread_messages`."""
    body = _get(base_url, token, thread_id, "",
                (("run", run), ("min_offset", min_offset)), timeout)
    try:
        return ThreadRuns(_RUNS.validate_python(body["runs"]), _history_offset(body))
    except (KeyError, TypeError, ValidationError):
        raise ThreadApiError("the answer is not a thread's runs", 200) from None


def _history_offset(body: dict[str, Any]) -> int:
    offset = body["historyOffset"]
    if type(offset) is not int:
        raise TypeError
    return offset


def _get(base_url: str, token: str, thread_id: str, route: str,
         parameters: tuple[tuple[str, object], ...], timeout: float) -> dict[str, Any]:
    """The JSON object the API answered 200 with; else the error for its answer."""
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError("base_url must be an http:// or https:// URL")
    query = {name: str(value) for name, value in parameters if value is not None}
    url = (f"{base_url.rstrip('/')}/v1/threads/{urllib.parse.quote(thread_id, safe='')}"
           f"{route}{'?' + urllib.parse.urlencode(query) if query else ''}")
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise _refusal(error.code, error.read()) from None
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


def _refusal(status: int, body: bytes) -> ThreadApiError:
    kind = {401: Unauthorized, 404: ThreadNotFound}.get(status, ThreadApiError)
    return kind(f"the thread API answered {status}: {_reason(body)}", status)


def _reason(body: bytes) -> str:
    """The API's `error` text (it names no content), or a placeholder."""
    try:
        reason = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return "(no reason given)"
    return reason[:200] if isinstance(reason, str) else "(no reason given)"
