"""The thread API's routes, without a web framework.

    GET /v1/threads/{threadId}/messages[?limit=&after=&before=&order=][&min_offset=][&run=]
    GET /v1/threads/{threadId}[?limit=&after=&before=&order=][&min_offset=][&run=]
    GET /v1/threads/{threadId}/runs/{runId}
    DELETE /v1/threads/{threadId}

`ThreadApi` turns a request (its Authorization header, the ids from the path,
the query parameters) into an `ApiResponse` (status, headers, JSON body); the
web server only routes and writes it out. The tenant comes from the bearer
token alone (`TenantTokens`): a missing or unknown token is 401, a thread the
tenant does not have is 404 whether another tenant has it or not. Every error
body is `{"error": <sentence>, "code": <stable code>}` (`ErrorCode`).

Checks come in this order, and nothing waits before the lookup: the token (401),
the parameters (400), whether this worker may answer for the thread's partition
(`ready`: it owns it and its view is recovered; otherwise 503 `not_ready`), the
thread (404; with `run=` the thread is waited for like the run, since a run's
records may be its thread's first).

Consistent reads: every answer carries `historyOffset`, the history offset of
the thread's last record the view applied (the thread's, not its partition's:
an answer tells nothing of other threads). `min_offset=n` waits until it is at
least n; `run=<runId>` waits until that run is complete in the view (its
closing record and all its content records): what an agent server that has
just finished a run asks before the thread's next one. Every run that ends
has a closing record (a failed or abandoned one too, with its failure code),
so the wait ends with the run. One wait per request, at most `max_wait`
seconds, woken only by records of its own thread (`ReadProgress`); at most
`ReadProgress.max_waiters` requests wait at once, `max_waiters_per_tenant` of
one tenant (429 beyond). A run whose closing record is not in the view after
the wait, or a `min_offset` not reached, is 503 `wait_timeout`.

Pages: `limit` entries (default and maximum `MAX_PAGE`), `after`/`before` the
ids of the entries the page lies between, `order` asc (oldest first) or desc.
The answer says `hasMore` and names its `firstId` and `lastId`, the cursors of
the pages on either side. A plain `GET …/messages` is the whole thread, in
order, for the next run's input, unless it holds more than `MAX_PAGE` messages.

Bodies name no message content; errors say what was wrong with the request,
never what the view holds. An error inside the view is logged by kind only
and answered 500.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NamedTuple, Protocol

import orjson

from processors.safe_logging import log_exception_kind
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_view import (
    Cursors,
    HistoryPartition,
    Missing,
    Page,
    RunStatus,
    thread_key,
)

log = logging.getLogger("agui_stream")

MAX_WAIT_SECONDS: Final = 10.0  # the longest a request waits, whatever it waits for
MAX_PAGE: Final = 1000  # the default and largest `limit`
MAX_WAITERS: Final = 1000
MAX_WAITERS_PER_TENANT: Final = 100
_OFFSET_DIGITS: Final = 19  # 2**63 - 1 has 19 digits
_LARGEST_OFFSET: Final = 2**63 - 1
_ID_PARAMETERS: Final = ("after", "before", "run")


class ErrorCode(enum.StrEnum):
    """The `code` of every error body: stable, for callers to branch on."""

    API_DISABLED = "api_disabled"  # 401: AGUI_TOKENS_FILE is not set
    UNAUTHORIZED = "unauthorized"  # 401
    BAD_PARAMETER = "bad_parameter"  # 400
    CURSOR_NOT_FOUND = "cursor_not_found"  # 400: `after`/`before` names no entry
    THREAD_NOT_FOUND = "thread_not_found"  # 404
    RUN_NOT_FOUND = "run_not_found"  # 404: no closing record of the run in the view
    NOT_FOUND = "not_found"  # 404: no such route
    METHOD_NOT_ALLOWED = "method_not_allowed"  # 405
    TOO_MANY_WAITERS = "too_many_waiters"  # 429
    NOT_READY = "not_ready"  # 503: the partition is moving or its view recovering
    WAIT_TIMEOUT = "wait_timeout"  # 503: `min_offset` or `run` not reached in time
    BAD_REQUEST = "bad_request"  # 400: not an HTTP request the server can read
    TOO_MANY_CONNECTIONS = "too_many_connections"  # 503
    INTERNAL = "internal"  # 500


_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})
_BEARER: Final[Mapping[str, str]] = MappingProxyType(
    {"WWW-Authenticate": 'Bearer realm="agui-stream"'})


class ApiResponse(NamedTuple):
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = _NO_HEADERS

    def json(self) -> bytes:
        return orjson.dumps(self.body)


def api_error(status: int, code: ErrorCode, message: str,
              headers: Mapping[str, str] = _NO_HEADERS, **extra: Any) -> ApiResponse:
    return ApiResponse(status, {"error": message, "code": code.value, **extra}, headers)


def retry_later(code: ErrorCode, message: str, seconds: int, **extra: Any) -> ApiResponse:
    """A 503 or 429 a caller retries after `seconds`."""
    status = 429 if code is ErrorCode.TOO_MANY_WAITERS else 503
    return api_error(status, code, message, {"Retry-After": str(seconds)}, **extra)


DISABLED: Final = api_error(401, ErrorCode.API_DISABLED,
                            "the thread API is disabled: AGUI_TOKENS_FILE is not set", _BEARER)
UNAUTHORIZED: Final = api_error(401, ErrorCode.UNAUTHORIZED,
                                "a valid bearer token is required", _BEARER)
NOT_READY: Final = retry_later(ErrorCode.NOT_READY, "the thread's partition is moving between"
                               " workers or its view is recovering; retry in a few seconds", 2)
INTERNAL: Final = api_error(500, ErrorCode.INTERNAL, "internal error")
_THREAD_NOT_FOUND: Final = api_error(404, ErrorCode.THREAD_NOT_FOUND, "no such thread")
_RUN_NOT_FOUND: Final = api_error(404, ErrorCode.RUN_NOT_FOUND,
                                  "no such run in the thread (its closing record is not in"
                                  " the view)")


class ThreadReader(Protocol):
    """What the API reads (`processors.view.thread_view.ThreadView`)."""

    def message_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing: ...

    def run_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing: ...

    def unechoed_runs(self, tenant: str, thread_id: str) -> int: ...

    def thread_offset(self, tenant: str, thread_id: str) -> int | None: ...

    def read_offset(self, partition: HistoryPartition) -> int: ...

    def partition_for(self, tenant: str, thread_id: str) -> HistoryPartition: ...

    def run_status(self, tenant: str, thread_id: str, run_id: str) -> RunStatus | None: ...


class ReadProgress:
    """Wakes the requests waiting for the view to read further, per thread (what
    `ThreadView.apply` says a record concerned: a waiter wakes only for its own
    thread's records), and caps how many wait. Used on the event loop's thread only."""

    def __init__(self, max_waiters: int = MAX_WAITERS,
                 max_waiters_per_tenant: int = MAX_WAITERS_PER_TENANT) -> None:
        self.max_waiters = max_waiters
        self.max_waiters_per_tenant = max_waiters_per_tenant
        self._advanced: dict[bytes, asyncio.Event] = {}  # only threads someone waits on
        self._waiting: Counter[str] = Counter()  # per tenant
        self._waiting_on: Counter[bytes] = Counter()  # per thread

    def advanced(self, thread: bytes) -> None:
        """The view applied a record of `thread` (its `thread_key`): its waiters check
        again."""
        event = self._advanced.pop(thread, None)
        if event is not None:
            event.set()

    @contextmanager
    def waiter(self, tenant: str) -> Iterator[bool]:
        """Whether the tenant's request may wait (the caps), held while it does."""
        if (self._waiting.total() >= self.max_waiters
                or self._waiting[tenant] >= self.max_waiters_per_tenant):
            yield False
            return
        self._waiting[tenant] += 1
        try:
            yield True
        finally:
            self._waiting[tenant] -= 1
            if not self._waiting[tenant]:
                del self._waiting[tenant]

    def waiting(self) -> int:
        return self._waiting.total()

    async def wait_until(self, thread: bytes, reached: Callable[[], bool],
                         deadline: float) -> bool:
        """Whether `reached()` became true before `deadline` (the loop's clock),
        checked at first and whenever a record of `thread` is applied. Not checked
        at the deadline (False: the caller checks what it needs then, once)."""
        self._waiting_on[thread] += 1
        try:
            while not reached():
                event = self._advanced.setdefault(thread, asyncio.Event())
                try:
                    async with asyncio.timeout_at(deadline):
                        await event.wait()
                except TimeoutError:
                    return False
            return True
        finally:
            self._waiting_on[thread] -= 1
            if not self._waiting_on[thread]:  # nobody left to wake there
                del self._waiting_on[thread]
                self._advanced.pop(thread, None)


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """A request whose token and parameters are valid (`ThreadApi.request`)."""

    tenant: str
    thread_id: str
    partition: HistoryPartition
    cursors: Cursors
    run_id: str | None
    min_offset: int | None


def _ready_always(partition: HistoryPartition) -> bool:
    return True


# Writes the erasure record of (tenant, threadId) to the history partition given, and
# returns its offset.
Eraser = Callable[[str, str, HistoryPartition], Awaitable[int]]


async def _no_eraser(tenant: str, thread_id: str, partition: HistoryPartition) -> int:
    raise RuntimeError("this API cannot erase threads")


@dataclass(frozen=True, slots=True)
class ThreadApi:
    """The routes over a view. `tokens` None: `AGUI_TOKENS_FILE` is not set and
    every request is refused. `ready(partition)`: this worker may answer for it."""

    reader: ThreadReader
    tokens: TenantTokens | None
    progress: ReadProgress = field(default_factory=ReadProgress)
    max_wait: float = MAX_WAIT_SECONDS
    ready: Callable[[HistoryPartition], bool] = _ready_always
    eraser: Eraser = _no_eraser

    def request(self, authorization: str | None, thread_id: str, query: Mapping[str, str],
                *, paged: bool) -> ApiRequest | ApiResponse:
        """The caller's tenant, its parameters and its thread's partition; or the 401
        refusing the caller, the 400 refusing its parameters (`paged`: the route takes
        pages, `run=` and `min_offset=`), the 404 of no thread id: what a worker
        checks once, before it forwards a request or answers it (`answer`)."""
        if self.tokens is None:
            return DISABLED
        tenant = self.tokens.tenant_for(authorization)
        if tenant is None:
            return UNAUTHORIZED
        parsed = _parse(query, paged)
        if isinstance(parsed, ApiResponse):
            return parsed
        if not thread_id:
            return _THREAD_NOT_FOUND
        try:
            partition = self.reader.partition_for(tenant, thread_id)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not admit a thread API request", error)
            return INTERNAL
        return ApiRequest(tenant, thread_id, partition, *parsed)

    async def answer(self, route: Callable[[ApiRequest], Awaitable[ApiResponse]],
                     request: ApiRequest | ApiResponse) -> ApiResponse:
        """The route's answer to a request, or the answer refusing it."""
        return request if isinstance(request, ApiResponse) else await route(request)

    # The routes from a request's parts, checked here (in-process callers); the web
    # server checks a request before it decides to forward it, then calls `answer_*`.
    async def messages(self, authorization: str | None, thread_id: str,
                       query: Mapping[str, str]) -> ApiResponse:
        return await self.answer(self.answer_messages, self.request(
            authorization, thread_id, query, paged=True))

    async def runs(self, authorization: str | None, thread_id: str,
                   query: Mapping[str, str]) -> ApiResponse:
        return await self.answer(self.answer_runs, self.request(
            authorization, thread_id, query, paged=True))

    async def run(self, authorization: str | None, thread_id: str, run_id: str,
                  query: Mapping[str, str]) -> ApiResponse:
        return await self.answer(functools.partial(self.answer_run, run_id=run_id),
                                 self.request(authorization, thread_id, query, paged=False))

    async def delete(self, authorization: str | None, thread_id: str,
                     query: Mapping[str, str]) -> ApiResponse:
        return await self.answer(self.answer_delete, self.request(
            authorization, thread_id, query, paged=False))

    async def answer_messages(self, checked: ApiRequest) -> ApiResponse:
        """`GET /v1/threads/{threadId}/messages`: `messages` is what the next run's
        `RunAgentInput.messages` takes."""
        request = await self._admit(checked)
        if isinstance(request, ApiResponse):
            return request
        try:
            page = self.reader.message_page(request.tenant, request.thread_id,
                                            request.cursors)
            unechoed = self.reader.unechoed_runs(request.tenant, request.thread_id)
            run = (None if request.run_id is None else
                   self.reader.run_status(request.tenant, request.thread_id, request.run_id))
            offset = self.reader.thread_offset(request.tenant, request.thread_id)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not read a thread's messages", error)
            return INTERNAL
        if isinstance(page, Missing):
            return _missing(page, "message")
        body = {"threadId": request.thread_id, "messages": page.items,
                **_page_fields(page, "id")}
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

    async def answer_runs(self, checked: ApiRequest) -> ApiResponse:
        """`GET /v1/threads/{threadId}`: the thread's runs, in the order they came."""
        request = await self._admit(checked)
        if isinstance(request, ApiResponse):
            return request
        try:
            page = self.reader.run_page(request.tenant, request.thread_id, request.cursors)
            offset = self.reader.thread_offset(request.tenant, request.thread_id)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not read a thread's runs", error)
            return INTERNAL
        if isinstance(page, Missing):
            return _missing(page, "run")
        return ApiResponse(200, {"threadId": request.thread_id, "runs": page.items,
                                 **_page_fields(page, "runId"), "historyOffset": offset})

    async def answer_run(self, checked: ApiRequest, run_id: str) -> ApiResponse:
        """`GET /v1/threads/{threadId}/runs/{runId}`: what became of the run, at once."""
        request = await self._admit(checked)
        if isinstance(request, ApiResponse):
            return request
        try:
            status = self.reader.run_status(request.tenant, request.thread_id, run_id)
            offset = self.reader.thread_offset(request.tenant, request.thread_id)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not read a run", error)
            return INTERNAL
        if status is None:
            return _RUN_NOT_FOUND
        return ApiResponse(200, {"threadId": request.thread_id, "run": status.summary,
                                 "complete": status.complete, "historyOffset": offset})

    async def answer_delete(self, checked: ApiRequest) -> ApiResponse:
        """`DELETE /v1/threads/{threadId}`: an erasure record on the history topic, which
        removes the thread from the view (every replica: the view's changelog) and tells
        every other consumer to erase it too. 200 once the view has applied it, 202 if
        not within the wait (it will)."""
        request = await self._admit(checked)
        if isinstance(request, ApiResponse):
            return request
        try:
            offset = await self.eraser(request.tenant, request.thread_id, request.partition)

            def applied_now() -> bool:
                return self.reader.read_offset(request.partition) >= offset

            applied = False
            with self.progress.waiter(request.tenant) as admitted:
                if admitted:  # else answered at once: the erasure is recorded all the same
                    deadline = asyncio.get_running_loop().time() + self.max_wait
                    applied = await self.progress.wait_until(
                        thread_key(request.tenant, request.thread_id), applied_now,
                        deadline) or applied_now()
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not erase a thread", error)
            return INTERNAL
        return ApiResponse(200 if applied else 202, {
            "threadId": request.thread_id, "erased": applied, "historyOffset": offset})

    async def _admit(self, request: ApiRequest) -> ApiRequest | ApiResponse:
        """The request, once the view has read as far as it asks; or the answer
        refusing it."""
        try:
            if not self.ready(request.partition):
                return NOT_READY
            if (self.reader.thread_offset(request.tenant, request.thread_id) is None
                    and request.run_id is None):
                return _THREAD_NOT_FOUND
            if request.run_id is not None or request.min_offset is not None:
                refused = await self._wait(request)
                if refused is not None:
                    return refused
            return request
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not admit a thread API request", error)
            return INTERNAL

    async def _wait(self, request: ApiRequest) -> ApiResponse | None:
        """One wait, until the request's offset and run are in the view (none if they
        are already: over the caps then too); the answer refusing the request if
        they are not by then."""
        with self.progress.waiter(request.tenant) as admitted:
            if admitted:
                deadline = asyncio.get_running_loop().time() + self.max_wait
                reached = await self.progress.wait_until(
                    thread_key(request.tenant, request.thread_id),
                    lambda: self._reached(request), deadline)
            else:
                reached = self._reached(request)
                if not reached:
                    return retry_later(ErrorCode.TOO_MANY_WAITERS, "too many requests are"
                                       " waiting for the view; retry in a second", 1)
        if not self.ready(request.partition):
            return NOT_READY
        if reached:
            return None
        offset = self.reader.thread_offset(request.tenant, request.thread_id)
        if offset is None:
            return _THREAD_NOT_FOUND
        if request.min_offset is not None and offset < request.min_offset:
            return retry_later(ErrorCode.WAIT_TIMEOUT, "the thread's history is not in the"
                               " view up to min_offset yet", 1, historyOffset=offset)
        if request.run_id is not None and self.reader.run_status(
                request.tenant, request.thread_id, request.run_id) is None:
            return retry_later(ErrorCode.WAIT_TIMEOUT, "the run's closing record is not in"
                               " the view yet", 1, historyOffset=offset)
        return None

    def _reached(self, request: ApiRequest) -> bool:
        """The view holds what the request asks for: the thread's history up to
        `min_offset`, the run complete."""
        if request.min_offset is not None:
            offset = self.reader.thread_offset(request.tenant, request.thread_id)
            if offset is None or offset < request.min_offset:
                return False
        if request.run_id is not None:
            status = self.reader.run_status(request.tenant, request.thread_id, request.run_id)
            return status is not None and status.complete
        return True


def _parse(query: Mapping[str, str],
           paged: bool) -> tuple[Cursors, str | None, int | None] | ApiResponse:
    """The query's cursors, run and min_offset, or the 400."""
    known = ("limit", "after", "before", "order", "min_offset", "run") if paged else ()
    unknown = sorted(set(query) - set(known))
    if unknown:
        takes = f"takes {', '.join(known)}" if known else "takes none"
        return _bad(f"unknown query parameter {unknown[0]!r}; this route {takes}")
    for name in _ID_PARAMETERS:
        if query.get(name) == "":
            return _bad(f"{name}: an id is required")
    limit = _integer(query.get("limit"), MAX_PAGE)
    if limit is None or not 1 <= limit <= MAX_PAGE:
        return _bad(f"limit: an integer from 1 to {MAX_PAGE} is required")
    order = query.get("order", "asc")
    if order not in ("asc", "desc"):
        return _bad("order: asc or desc is required")
    min_offset = _integer(query.get("min_offset"), None)
    if "min_offset" in query and min_offset is None:
        return _bad("min_offset: a history offset (a non-negative integer) is required")
    cursors = Cursors(limit, query.get("after"), query.get("before"), order == "desc")
    return cursors, query.get("run"), min_offset


def _integer(text: str | None, default: int | None) -> int | None:
    """A non-negative integer of at most 19 digits, `default` if absent, None if not
    one (checked before `int()`, which refuses more than 4,300 digits with an error)."""
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or len(text) > _OFFSET_DIGITS:
        return None
    value = int(text)
    return value if value <= _LARGEST_OFFSET else None


def _bad(message: str) -> ApiResponse:
    return api_error(400, ErrorCode.BAD_PARAMETER, message)


def _missing(missing: Missing, entry: str) -> ApiResponse:
    if missing is Missing.THREAD:
        return _THREAD_NOT_FOUND
    cursor = "after" if missing is Missing.AFTER else "before"
    return api_error(400, ErrorCode.CURSOR_NOT_FOUND,
                     f"{cursor}: the thread has no {entry} with this id")


def _page_fields(page: Page, id_field: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"hasMore": page.has_more}
    if page.items:
        fields["firstId"] = page.items[0].get(id_field)
        fields["lastId"] = page.items[-1].get(id_field)
    return fields
