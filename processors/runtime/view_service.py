"""The thread view inside the worker: the agent that applies the history topic (or,
with per-tenant topics, the tenants' history topics that existed when the worker
started) to it, and the thread API's web routes.

Per-tenant topics: Faust subscribes to a topic's names only (its aiokafka driver
drops a pattern), so the view reads the tenants' topics it was started with; a
tenant provisioned later is published at once, and its view answers after the
workers' next restart (docs/operations.md, *Per-tenant topics*).

The view (`processors.view.thread_view`) is maintained like the run state: write-behind,
its changes sent with the next commit of their history partition and applied to
the local table once committed. The history topic has the raw topics' partition
count (`create-topics`, as has each tenant's), so Faust puts it in their
co-partitioned group: partition n of the raw topics, of the history topics and of
every table is owned by one worker, and one transaction per partition number
carries the outputs, the state, the view's changes and the offsets of all of them.

A request goes to the worker that owns the thread's history partition; any worker
answers it, forwarding it there when it is not that worker.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import aiohttp
import aiohttp.web
import orjson
from yarl import URL

from processors.config import Settings
from processors.metrics import Metrics
from processors.processing.outputs import incoming_record
from processors.runtime.faust_adaptations import AdaptedApp, WholeRecordConsumer, apply_each
from processors.runtime.view_catch_up import ViewCatchUp
from processors.runtime.web_server import HardenedWeb
from processors.safe_logging import log_exception_kind
from processors.view.openapi import openapi_document
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_api import (
    INTERNAL,
    MAX_WAIT_SECONDS,
    NOT_READY,
    ApiRequest,
    ApiResponse,
    ErrorCode,
    ReadProgress,
    ThreadApi,
    api_error,
)
from processors.view.thread_view import HistoryPartition, ThreadView
from topics.declarations import VIEW_TABLE
from topics.records import HistoryErasure

log = logging.getLogger("agui_stream")

# The owner's own wait, and time to answer (the client waits 15 s).
_FORWARD_TIMEOUT: Final = MAX_WAIT_SECONDS + 3.0

# Marks a request one worker forwarded to another: it is never forwarded again
# (two workers that disagree on the owner during a rebalance cannot bounce it). It
# grants nothing: a worker answers only for the partitions it owns, whoever asks.
_FORWARDED: Final = "X-Agui-Forwarded"
_JSON: Final = "application/json"
_REFUSAL_CODES: Final = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
_PASSED_BACK: Final = ("WWW-Authenticate", "Retry-After")  # the owner's headers kept

Route = Callable[[ApiRequest], Awaitable[ApiResponse]]


def is_history(settings: Settings, topic: str) -> bool:
    """A history topic: the shared one, or (per-tenant topics) a tenant's."""
    templates = settings.tenant_templates
    if templates is None:
        return topic == settings.history_topic
    return bool(re.match(templates.history.pattern, topic))


def serve_thread_view(app: AdaptedApp, settings: Settings, metrics: Metrics,
                      view: ThreadView, tokens: TenantTokens | None,
                      tenant_topics: list[str]) -> ThreadApi:
    """Add the history agent and the API's routes to `app`; the API they serve.
    `tenant_topics`: the tenants' history topics to read (per-tenant topics)."""
    owned: set[HistoryPartition] = set()  # the history partitions of the assignment
    catch_up = ViewCatchUp(lambda: cast(WholeRecordConsumer, app.consumer), view.read_offset,
                           lambda: bool(app.tables.actives_ready))

    async def partitions_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        owned.clear()
        catch_up.revoked()

    async def partitions_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        history = [tp for tp in assigned if is_history(settings, tp.topic)]
        owned.clear()
        owned.update((tp.topic, tp.partition) for tp in history)
        catch_up.assigned(history)

    app.on_partitions_revoked.connect(partitions_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(partitions_assigned)  # type: ignore[arg-type]

    def ready(partition: HistoryPartition) -> bool:
        """This worker owns the partition, its view is recovered and has applied what
        the partition held at the assignment (`processors.runtime.view_catch_up`)."""
        return (partition in owned and bool(app.tables.actives_ready)
                and catch_up.caught_up(partition))

    async def erase(tenant: str, thread_id: str, partition: HistoryPartition) -> int:
        """The erasure record, sent outside any transaction (like the idle ticks) to
        the thread's history partition (its tenant's topic): the view applies it as
        it reads the partition; its offset."""
        value = HistoryErasure(tenant=tenant, threadId=thread_id,
                               erasedAt=int(time.time() * 1000)).to_bytes()
        topic, number = partition
        delivery = await app.producer.send(topic, f"{tenant}/{thread_id}".encode(),
                                           value, number, None, None)
        return int((await delivery).offset)

    api = ThreadApi(view, tokens, ReadProgress(settings.api_max_waiters,
                                               settings.api_max_waiters_per_tenant),
                    ready=ready, eraser=erase)
    names = [settings.history_topic] if settings.tenant_templates is None else tenant_topics

    async def view_recovered() -> None:
        # What was read while the table recovered (a partition's offset, the expiry
        # index) was read from a table not recovered yet: read it again.
        view.forget()

    app.tables[VIEW_TABLE].on_recover(view_recovered)

    def apply(event: Any) -> None:
        thread = view.apply(incoming_record(event.message))
        event.ack()
        if thread is not None:
            api.progress.advanced(thread)

    async def maintain_thread_view(stream: Any) -> None:
        await apply_each(stream, app, apply)

    if names:  # (no tenant's topic yet: nothing to read, every thread unknown)
        app.agent(app.raw_topic(*names), name="thread-view")(maintain_thread_view)

    async def answer(request: aiohttp.web.Request, name: str, route: Route,
                     paged: bool = True) -> aiohttp.web.Response:
        started = time.perf_counter()
        response = INTERNAL
        try:
            response = await _answer_or_forward(app, api, owned, request,
                                                request.match_info["thread_id"], route, paged)
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not answer a thread API request",
                               error)
        finally:
            metrics.api_request_seconds.labels(name, str(response.status)).observe(
                time.perf_counter() - started)
        return aiohttp.web.Response(body=response.json(), status=response.status,
                                    content_type=_JSON, headers=response.headers)

    @aiohttp.web.middleware
    async def json_errors(request: Any, handler: Any) -> Any:
        """aiohttp's own refusals (no such route, method) as the API's JSON errors,
        counted like every answer."""
        started = time.perf_counter()
        try:
            return await handler(request)
        except aiohttp.web.HTTPException as refusal:
            if refusal.status < 400:
                raise
            response = api_error(refusal.status, _REFUSAL_CODES.get(
                refusal.status, ErrorCode.BAD_REQUEST), refusal.reason)
            metrics.api_request_seconds.labels("other", str(response.status)).observe(
                time.perf_counter() - started)
            return aiohttp.web.Response(body=response.json(), status=response.status,
                                        content_type=_JSON)

    # Plain aiohttp routes, not Faust pages: a Faust View costs about 80 µs more per
    # request (docs/performance.md, *The thread API*).
    web_app = cast(HardenedWeb, app.web).web_app
    web_app.middlewares.append(json_errors)
    contract = orjson.dumps(openapi_document())

    async def thread_api_contract(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=contract, content_type=_JSON)

    async def thread_messages(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await answer(request, "messages", api.answer_messages)

    async def thread_runs(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await answer(request, "runs", api.answer_runs)

    async def delete_thread(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await answer(request, "delete", api.answer_delete, paged=False)

    async def thread_run(request: aiohttp.web.Request) -> aiohttp.web.Response:
        route = functools.partial(api.answer_run, run_id=request.match_info["run_id"])
        return await answer(request, "run", route, paged=False)

    web_app.router.add_get("/v1/openapi.json", thread_api_contract, allow_head=False)
    web_app.router.add_get("/v1/threads/{thread_id}/messages", thread_messages,
                           allow_head=False)
    web_app.router.add_get("/v1/threads/{thread_id}", thread_runs, allow_head=False)
    web_app.router.add_delete("/v1/threads/{thread_id}", delete_thread)
    web_app.router.add_get("/v1/threads/{thread_id}/runs/{run_id}", thread_run,
                           allow_head=False)
    return api


async def _answer_or_forward(app: AdaptedApp, api: ThreadApi,
                             owned: set[HistoryPartition], request: Any, thread_id: str,
                             route: Route, paged: bool) -> ApiResponse:
    """The answer of the worker that owns the thread's partition: this one's, or the
    owner's when another one owns it (a request not admitted is answered here). The
    request is checked once, here: the route answers it as checked."""
    authorization = request.headers.get("Authorization")
    checked = api.request(authorization, thread_id, request.query, paged=paged)
    if isinstance(checked, ApiResponse):
        return checked
    if checked.partition not in owned and request.headers.get(_FORWARDED) is None:
        owner = _owner(app, checked.partition[1])
        if owner is None:  # no assignment known yet
            return NOT_READY
        here = app.conf.canonical_url
        if (owner.host, owner.port) != (here.host, here.port):
            return await _forward(app, request, owner, authorization)
    return await route(checked)


async def _forward(app: AdaptedApp, request: Any, owner: URL,
                   authorization: str | None) -> ApiResponse:
    url = request.url.with_scheme(owner.scheme).with_host(owner.host or "").with_port(
        owner.port)
    try:
        async with app.http_client.request(
                request.method, url,
                headers={"Authorization": authorization or "", _FORWARDED: "1"},
                timeout=aiohttp.ClientTimeout(total=_FORWARD_TIMEOUT)) as reply:
            body = await reply.json(content_type=None)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            return ApiResponse(reply.status, body, {
                name: value for name, value in reply.headers.items() if name in _PASSED_BACK})
    except Exception as error:  # the owner is gone or moving: the caller retries
        log_exception_kind(log, logging.WARNING, "could not forward a thread API request",
                           error)
        return NOT_READY


def _owner(app: AdaptedApp, partition: int) -> URL | None:
    """The URL of the worker that owns `partition` of the view's table, as the group's
    last assignment says (every worker learns it)."""
    for url, topics in app.router.table_metadata(VIEW_TABLE).items():
        if any(partition in partitions for partitions in topics.values()):
            return URL(url)
    return None


def measure_view(app: AdaptedApp, settings: Settings, metrics: Metrics,
                 view: ThreadView) -> None:
    """Export the view's lag per owned history partition number (offsets after the last
    record it applied: when caught up, the commit markers of the transactions that
    wrote to it last, at most one per partition number; with per-tenant topics the
    largest of the tenants' topics') and the threads it holds."""
    if not app.tables.actives_ready:  # the table is recovering: nothing to say yet
        return
    consumer = app.consumer
    owned = [tp for tp in consumer.assignment() if is_history(settings, tp.topic)]
    lag: dict[int, int] = {}
    for tp in owned:
        end = consumer.highwater(tp)
        if end is not None:
            behind = max(0, end - 1 - view.read_offset((tp.topic, tp.partition)))
            lag[tp.partition] = max(lag.get(tp.partition, 0), behind)
    for partition, behind in lag.items():
        metrics.view_lag.labels(str(partition)).set(behind)
    metrics.view_threads.set(view.threads_held({tp.partition for tp in owned}))
