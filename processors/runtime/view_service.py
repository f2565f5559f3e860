"""The thread view inside the worker: the agent that applies the history topic to
it, and the thread API's web routes.

The view (`processors.view.thread_view`) is maintained like the run state: write-behind,
its changes sent with the next commit of their history partition and applied to
the local table once committed. The history topic has the raw topics' partition
count (`create-topics`), so Faust puts it in their co-partitioned group: partition
n of the raw topics, of the history topic and of every table is owned by one
worker, and one transaction per partition number carries the outputs, the state,
the view's changes and the offsets of both topics.

A request goes to the worker that owns the thread's history partition; any worker
answers it, forwarding it there when it is not that worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import aiohttp
from yarl import URL

from processors.config import Settings
from processors.metrics import Metrics
from processors.processing.outputs import incoming_record
from processors.runtime.faust_adaptations import AdaptedApp, apply_each
from processors.safe_logging import log_exception_kind
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_api import ApiResponse, ThreadApi
from processors.view.thread_view import ThreadView
from topics.declarations import VIEW_TABLE

log = logging.getLogger("agui_stream")

_FORWARDED: Final = "X-Agui-Forwarded"  # a forwarded request is answered where it lands
_JSON: Final = "application/json"
_NOT_HERE: Final = ApiResponse(503, {"error": "the thread's partition is moving between"
                                              " workers; retry in a few seconds"})

Route = Callable[[str | None, str, Mapping[str, str]], Awaitable[ApiResponse]]


def serve_thread_view(app: AdaptedApp, settings: Settings, metrics: Metrics,
                      view: ThreadView, tokens: TenantTokens | None) -> ThreadApi:
    """Add the history agent and the API's routes to `app`; the API they serve."""
    api = ThreadApi(view, tokens)
    history = app.raw_topic(settings.history_topic)

    def apply(event: Any) -> None:
        view.apply(incoming_record(event.message))
        event.ack()
        api.progress.advanced()

    @app.agent(history, name="thread-view")
    async def maintain_thread_view(stream: Any) -> None:
        await apply_each(stream, app, apply)

    async def answer(page: Any, request: Any, thread_id: str, name: str,
                     route: Route) -> Any:
        started = time.perf_counter()
        authorization = request.headers.get("Authorization")
        response = await _forwarded(app, view, tokens, request, thread_id, authorization)
        if response is None:
            response = await route(authorization, thread_id, dict(request.query))
        metrics.api_request_seconds.labels(name, str(response.status)).observe(
            time.perf_counter() - started)
        return page.bytes(response.json(), content_type=_JSON, status=response.status,
                          headers=dict(response.headers))

    @app.page("/v1/threads/{thread_id}/messages")
    async def thread_messages(page: Any, request: Any, thread_id: str) -> Any:
        return await answer(page, request, thread_id, "messages", api.messages)

    @app.page("/v1/threads/{thread_id}")
    async def thread_runs(page: Any, request: Any, thread_id: str) -> Any:
        return await answer(page, request, thread_id, "runs", api.runs)

    return api


async def _forwarded(app: AdaptedApp, view: ThreadView, tokens: TenantTokens | None,
                     request: Any, thread_id: str,
                     authorization: str | None) -> ApiResponse | None:
    """The owner's answer when another worker owns the thread's partition; None when
    this one does (or the request cannot be admitted: the API answers that)."""
    tenant = tokens.tenant_for(authorization) if tokens is not None else None
    if tenant is None or request.headers.get(_FORWARDED):
        return None
    try:
        owner = _owner(app, view.partition_for(tenant, thread_id))
        if owner is None:  # no assignment known yet
            return _NOT_HERE
        here = app.conf.canonical_url
        if (owner.host, owner.port) == (here.host, here.port):
            return None
        url = request.url.with_scheme(owner.scheme).with_host(owner.host or "").with_port(
            owner.port)
        async with app.http_client.get(
                url, headers={"Authorization": authorization or "", _FORWARDED: "1"},
                timeout=aiohttp.ClientTimeout(total=30)) as reply:
            body = await reply.json(content_type=None)
            return ApiResponse(reply.status, body, {
                name: value for name, value in reply.headers.items()
                if name == "WWW-Authenticate"})
    except Exception as error:  # the owner is gone or moving: the caller retries
        log_exception_kind(log, logging.WARNING, "could not forward a thread API request",
                           error)
        return _NOT_HERE


def _owner(app: AdaptedApp, partition: int) -> URL | None:
    """The URL of the worker that owns `partition` of the view's table, as the group's
    last assignment says (every worker learns it)."""
    for url, topics in app.router.table_metadata(VIEW_TABLE).items():
        if any(partition in partitions for partitions in topics.values()):
            return URL(url)
    return None


def measure_view(app: AdaptedApp, settings: Settings, metrics: Metrics,
                 view: ThreadView) -> None:
    """Export the view's lag per owned history partition (offsets after the last record
    it applied: when caught up, the commit markers of the transactions that wrote to it
    last, at most one per partition number) and the threads it holds."""
    consumer = app.consumer
    owned = [tp for tp in consumer.assignment() if tp.topic == settings.history_topic]
    for tp in owned:
        end = consumer.highwater(tp)
        if end is not None:
            behind = max(0, end - 1 - view.read_offset(tp.partition))
            metrics.view_lag.labels(str(tp.partition)).set(behind)
    metrics.view_threads.set(view.threads_held(tp.partition for tp in owned))
