"""The thread API's two routes, without a web framework.

    GET /v1/threads/{threadId}/messages[?after=<messageId>][&min_offset=<n>][&run=<runId>]
    GET /v1/threads/{threadId}[?min_offset=<n>][&run=<runId>]

`ThreadApi` turns a request (its Authorization header, the thread id from the
path, the query parameters) into an `ApiResponse` (status, headers, JSON body);
the web server only routes and writes it out. The tenant comes from the bearer
token alone (`TenantTokens`): a missing or unknown token is 401, a thread the
tenant does not have is 404 whether another tenant has it or not.

Consistent reads: every answer carries `historyOffset`, the last history offset
the view has applied on the thread's partition. `min_offset=n` first waits
(at most `max_wait` seconds) until that offset is at least n, woken by
`ReadProgress.advanced()`, which the view's agent calls after applying records;
if the view has not read that far by then the answer is 503. `run=<runId>`
waits the same way until that run is complete in the view (its closing record
and all its content records): what an agent server that has just finished a run
asks before starting the thread's next one (it knows the run, not the history
offset of its closing record). Every run that ends has a closing record (a failed
one too), so the wait ends with the run; only a run whose closing record is not
in the view after the wait is a 503. The messages answer then carries the run's
summary as `run`.

`complete` on the messages answer: false, with `incomplete` saying why, when a run
of the thread did not echo RUN_STARTED.input (the thread may lack user messages),
or when the run asked for has its closing record in the view but not all of its
content records after the wait.

Bodies name no message content; errors say what was wrong with the request,
never what the view holds. An error inside the view is logged by kind only
and answered 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NamedTuple, Protocol

import orjson

from processors.safe_logging import log_exception_kind
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_view import Missing, RunStatus

log = logging.getLogger("agui_stream")

MAX_WAIT_SECONDS: Final = 10.0  # the longest a request waits for `min_offset`
_LARGEST_OFFSET: Final = 2**63 - 1


_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})


class ApiResponse(NamedTuple):
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = _NO_HEADERS

    def json(self) -> bytes:
        return orjson.dumps(self.body)


class ThreadReader(Protocol):
    """What the API reads (`processors.view.thread_view.ThreadView`)."""

    def messages(self, tenant: str, thread_id: str,
                 after: str | None = None) -> list[dict[str, Any]] | Missing: ...

    def runs(self, tenant: str, thread_id: str) -> list[dict[str, Any]] | Missing: ...

    def unechoed_runs(self, tenant: str, thread_id: str) -> int: ...

    def read_offset(self, partition: int) -> int: ...

    def partition_for(self, tenant: str, thread_id: str) -> int: ...

    def run_status(self, tenant: str, thread_id: str, run_id: str) -> RunStatus | None: ...


class ReadProgress:
    """Wakes the requests waiting for the view to read further. Used on the event
    loop's thread only."""

    def __init__(self) -> None:
        self._advanced = asyncio.Event()
        self._waiting = 0

    def advanced(self) -> None:
        """The view applied records: waiting requests check their offset again."""
        if self._waiting:  # a fresh Event per record only while someone waits
            event, self._advanced = self._advanced, asyncio.Event()
            event.set()

    async def wait_until(self, reached: Callable[[], bool], timeout: float) -> bool:
        """Whether `reached()` became true within `timeout` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        self._waiting += 1
        try:
            while not reached():
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._advanced.wait()
                except TimeoutError:
                    return reached()
            return True
        finally:
            self._waiting -= 1


@dataclass(frozen=True, slots=True)
class _Request:
    tenant: str
    thread_id: str
    partition: int
    after: str | None
    run_id: str | None


def _error(status: int, message: str, **extra: Any) -> ApiResponse:
    return ApiResponse(status, {"error": message, **extra})


_DISABLED: Final = ApiResponse(
    401, {"error": "the thread API is disabled: AGUI_TOKENS_FILE is not set"},
    {"WWW-Authenticate": 'Bearer realm="agui-stream"'})
_UNAUTHORIZED: Final = ApiResponse(
    401, {"error": "a valid bearer token is required"},
    {"WWW-Authenticate": 'Bearer realm="agui-stream"'})
_NOT_FOUND: Final = _error(404, "no such thread")
_INTERNAL: Final = _error(500, "internal error")


@dataclass(frozen=True, slots=True)
class ThreadApi:
    """The routes over a view. `tokens` None: `AGUI_TOKENS_FILE` is not set and
    every request is refused."""

    reader: ThreadReader
    tokens: TenantTokens | None
    progress: ReadProgress = field(default_factory=ReadProgress)
    max_wait: float = MAX_WAIT_SECONDS

    async def messages(self, authorization: str | None, thread_id: str,
                       query: Mapping[str, str]) -> ApiResponse:
        """`GET /v1/threads/{threadId}/messages`: `messages` is what the next run's
        `RunAgentInput.messages` takes."""
        request = await self._admit(authorization, thread_id, query,
                                    ("after", "min_offset", "run"))
        if isinstance(request, ApiResponse):
            return request
        try:
            messages = self.reader.messages(request.tenant, request.thread_id, request.after)
            offset = self.reader.read_offset(request.partition)
            unechoed = self.reader.unechoed_runs(request.tenant, request.thread_id)
            run = (None if request.run_id is None else
                   self.reader.run_status(request.tenant, request.thread_id, request.run_id))
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not read a thread's messages", error)
            return _INTERNAL
        if messages is Missing.THREAD:
            return _NOT_FOUND
        if messages is Missing.AFTER:
            return _error(400, "after: the thread has no message with this id")
        body: dict[str, Any] = {"threadId": request.thread_id, "messages": messages}
        reasons = []
        if unechoed:
            reasons.append(f"{unechoed} run(s) of this thread did not echo RUN_STARTED.input,"
                           " so user messages may be missing: producers should send the"
                           " run's input in RUN_STARTED")
        if run is not None and not run.complete:
            reasons.append("the run's content records are not all in the view yet")
        body["complete"] = not reasons
        if reasons:
            body["incomplete"] = "; ".join(reasons)
        if run is not None:
            body["run"] = run.summary
        body["historyOffset"] = offset
        return ApiResponse(200, body)

    async def runs(self, authorization: str | None, thread_id: str,
                   query: Mapping[str, str]) -> ApiResponse:
        """`GET /v1/threads/{threadId}`: the thread's runs, in the order they came."""
        request = await self._admit(authorization, thread_id, query, ("min_offset", "run"))
        if isinstance(request, ApiResponse):
            return request
        try:
            runs = self.reader.runs(request.tenant, request.thread_id)
            offset = self.reader.read_offset(request.partition)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not read a thread's runs", error)
            return _INTERNAL
        if isinstance(runs, Missing):
            return _NOT_FOUND
        return ApiResponse(200, {"threadId": request.thread_id, "runs": runs,
                                 "historyOffset": offset})

    async def _admit(self, authorization: str | None, thread_id: str,
                     query: Mapping[str, str], known: tuple[str, ...]) -> _Request | ApiResponse:
        """The request's tenant and parameters, once the view has read as far as it
        asks; or the answer refusing it."""
        if self.tokens is None:
            return _DISABLED
        tenant = self.tokens.tenant_for(authorization)
        if tenant is None:
            return _UNAUTHORIZED
        unknown = sorted(set(query) - set(known))
        if unknown:
            return _error(400, f"unknown query parameter {unknown[0]!r}; this route takes"
                          f" {', '.join(known)}")
        after = query.get("after")
        if after == "":
            return _error(400, "after: a message id is required")
        min_offset = _offset(query.get("min_offset"))
        if isinstance(min_offset, ApiResponse):
            return min_offset
        run_id = query.get("run")
        if run_id == "":
            return _error(400, "run: a run id is required")
        if not thread_id:
            return _NOT_FOUND
        try:
            partition = self.reader.partition_for(tenant, thread_id)
            if min_offset is not None and not await self.progress.wait_until(
                    lambda: self.reader.read_offset(partition) >= min_offset, self.max_wait):
                return _error(503, "the view has not read the history up to min_offset yet",
                              historyOffset=self.reader.read_offset(partition))
            if run_id is not None and not await self.progress.wait_until(
                    lambda: self._complete(tenant, thread_id, run_id), self.max_wait) \
                    and self.reader.run_status(tenant, thread_id, run_id) is None:
                return _error(503, "the run's closing record is not in the view yet",
                              historyOffset=self.reader.read_offset(partition))
            return _Request(tenant, thread_id, partition, after, run_id)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not admit a thread API request", error)
            return _INTERNAL


    def _complete(self, tenant: str, thread_id: str, run_id: str) -> bool:
        status = self.reader.run_status(tenant, thread_id, run_id)
        return status is not None and status.complete


def _offset(text: str | None) -> int | ApiResponse | None:
    if text is None:
        return None
    if not text.isascii() or not text.isdigit() or int(text) > _LARGEST_OFFSET:
        return _error(400, "min_offset: a history offset (a non-negative integer) is required")
    return int(text)
