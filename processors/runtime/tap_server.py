"""`agui-stream tap`: a reverse proxy for the AG-UI HTTP + SSE binding that
publishes what it forwards to the raw topic (docs/tap.md).

The shell around `processors.tap`: aiohttp forwards the request and streams the
response back chunk by chunk, each chunk written to the client before the core
sees it, and the next chunk read from the upstream only once the client took
this one (backpressure as the upstream would see it). The core's records go to
the `Publisher`, which hands them to a publisher process of its own
(`processors.runtime.tap_publisher`: an idempotent producer, acks=all, in
order, that outlives a crash of the tap); nothing on the client's path awaits
Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import logging.config
import signal
import sys
import time
from typing import Final

import aiohttp
import uvloop
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processors.config import ConfigError, TapSettings
from processors.metrics import TapMetrics
from processors.runtime.tap_publisher import PUBLISHER_COMMAND, Publisher
from processors.runtime.web_server import WebLimits, hardened_runner, listen_capped
from processors.runtime.worker import worker_logging
from processors.tap.runs import Budget, Cut, ResponseTap, RunRequest
from processors.view.tenant_tokens import TenantTokens

log = logging.getLogger("agui_stream.tap")

# Headers of one connection, not of the message (RFC 9110, 7.6.1), and those the
# client library sets itself.
_HOP_BY_HOP: Final = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length"})
_MAX_TENANT_CHARS: Final = 255
_HEALTH_CONNECTIONS: Final = 100  # probes and scrapes only


def _end_to_end(headers: CIMultiDictProxy[str], keep_length: bool) -> CIMultiDict[str]:
    """`headers` less the hop-by-hop ones (and those the Connection header names)."""
    named = {token.strip().lower() for value in headers.getall("Connection", ())
             for token in value.split(",")}
    dropped = (_HOP_BY_HOP - ({"content-length"} if keep_length else set())) | named
    return CIMultiDict((name, value) for name, value in headers.items()
                       if name.lower() not in dropped)


class TapProxy:
    """The proxy's request handler: any method and path, forwarded to the upstream."""

    def __init__(self, settings: TapSettings, tokens: TenantTokens | None,
                 publisher: Publisher, metrics: TapMetrics) -> None:
        self.settings = settings
        self.tokens = tokens
        self.publisher = publisher
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def tenant_of(self, request: web.Request) -> str | None:
        if self.tokens is not None:
            return self.tokens.tenant_for(request.headers.get("Authorization"))
        tenant = request.headers.get(self.settings.tenant_request_header, "").strip()
        return tenant if 0 < len(tenant) <= _MAX_TENANT_CHARS else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.read()
        headers = _end_to_end(request.headers, keep_length=False)
        headers["Accept-Encoding"] = "identity"  # the tap reads the stream it forwards
        url = self.settings.upstream_url + request.rel_url.raw_path_qs
        try:
            async with asyncio.timeout(self.settings.connect_timeout_seconds):
                upstream = await self.session.request(request.method, url, headers=headers,
                                                      data=body, allow_redirects=False)
        except TimeoutError:
            return self._failed("timeout", 504)
        except (aiohttp.ClientError, OSError):
            return self._failed("unreachable", 502)
        try:
            return await self._relay(request, body, upstream)
        finally:
            upstream.close()  # never back to the pool: a cut stream must reach the agent

    def _failed(self, kind: str, status: int) -> web.Response:
        self.metrics.upstream_errors.labels(kind).inc()
        self.metrics.responses.labels("upstream_error").inc()
        return web.json_response({"error": f"agent endpoint {kind}"}, status=status)

    async def _relay(self, request: web.Request, body: bytes,
                     upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=_end_to_end(upstream.headers, keep_length=True))
        tap, tenant = self._tap_for(request, body, upstream)
        await response.prepare(request)
        cut = Cut.UPSTREAM_CLOSED
        try:
            while True:
                try:
                    chunk = await upstream.content.readany()
                except (aiohttp.ClientError, OSError):
                    cut = Cut.UPSTREAM_FAILED
                    break
                if not chunk:
                    break
                read_at = time.perf_counter()
                try:
                    await response.write(chunk)
                except (aiohttp.ClientError, OSError):
                    cut = Cut.CLIENT_GONE
                    break
                self.metrics.forwarded_bytes.inc(len(chunk))
                if tap is not None:
                    self.publisher.take(tap.feed(chunk), tenant, read_at)
        except asyncio.CancelledError:  # the client left while the upstream was quiet
            cut = Cut.CLIENT_GONE
            raise
        finally:
            if tap is not None:
                self.publisher.take(tap.end(cut), tenant, time.perf_counter())
        if cut is Cut.UPSTREAM_FAILED:
            self.metrics.upstream_errors.labels("broken").inc()
            if request.transport is not None:  # as the upstream's: the client sees it break
                request.transport.abort()
        elif cut is Cut.UPSTREAM_CLOSED:
            await response.write_eof()
        return response

    def _tap_for(self, request: web.Request, body: bytes,
                 upstream: aiohttp.ClientResponse) -> tuple[ResponseTap | None, bytes]:
        """The core for this response, when it is a run's SSE stream of a known tenant."""
        media = upstream.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        encoding = upstream.headers.get("Content-Encoding", "identity").strip().lower()
        if not 200 <= upstream.status < 300:
            self.metrics.upstream_errors.labels("status").inc()
            self.metrics.responses.labels("upstream_error").inc()
            return None, b""
        if request.method != "POST" or media != "text/event-stream" or encoding != "identity":
            self.metrics.responses.labels("not_sse").inc()
            return None, b""
        tenant = self.tenant_of(request)
        if tenant is None:
            self.metrics.responses.labels("untenanted").inc()
            return None, b""
        self.metrics.responses.labels("tapped").inc()
        settings = self.settings
        return (ResponseTap(RunRequest.parse(body, settings.echo), self.publisher.budget,
                            settings.max_event_bytes),
                tenant.encode("utf-8", "surrogatepass"))


def health_app(publisher: Publisher, metrics: TapMetrics, stopping: asyncio.Event,
               ) -> web.Application:
    """/healthz, /livez, /readyz and /metrics. Ready means forwarding: Kafka being
    down never takes the tap out of its Service (clients would lose their agent);
    `publishing` and the metrics say whether runs reach Kafka."""

    def state(_: web.Request) -> web.Response:
        ready = not stopping.is_set()
        reason = ("stopping" if not ready else "forwarding and publishing"
                  if publisher.publishing else "forwarding; Kafka is not taking records")
        return web.json_response({"ready": ready, "publishing": publisher.publishing,
                                  "bufferedBytes": publisher.budget.used, "reason": reason},
                                 status=200 if ready else 503)

    async def health(request: web.Request) -> web.Response:
        return state(request)

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, health)
    return app


async def serve(settings: TapSettings, tokens: TenantTokens | None,
                stopping: asyncio.Event, ports: list[int] | None = None,
                publisher_command: tuple[str, ...] = PUBLISHER_COMMAND) -> None:
    """Run the tap until `stopping` is set; `ports` gets (proxy, health) bound ports.
    `publisher_command` starts its publisher process (another one in a benchmark)."""
    metrics = TapMetrics()
    publisher = Publisher(settings, Budget(settings.buffer_bytes), metrics, publisher_command)
    proxy = TapProxy(settings, tokens, publisher, metrics)
    app = web.Application(client_max_size=settings.max_request_bytes)
    app.router.add_route("*", "/{path:.*}", proxy.handle)
    base = settings.base
    proxy_limits = WebLimits(base.api_bind, settings.port, base.api_max_connections)
    health_limits = WebLimits(base.api_bind, base.metrics_port, _HEALTH_CONNECTIONS)
    # Cancelled when its client leaves, so a quiet upstream's run is cut at once.
    runners = [hardened_runner(app, proxy_limits, handler_cancellation=True),
               hardened_runner(health_app(publisher, metrics, stopping), health_limits)]
    await proxy.start()
    publisher.start()
    listeners = [await listen_capped(runners[0], proxy_limits),
                 await listen_capped(runners[1], health_limits)]
    if ports is not None:
        ports.extend(int(listener.sockets[0].getsockname()[1]) for listener in listeners)
    log.info("tap listening on %s:%d for %s", base.api_bind, settings.port,
             settings.upstream_url)
    await stopping.wait()
    listeners[0].close()
    await runners[0].cleanup()  # in-flight responses end; their runs are cut and said so
    await publisher.stop(base.shutdown_timeout_seconds)
    await proxy.close()
    listeners[1].close()
    await runners[1].cleanup()


def run_tap() -> int:
    try:
        settings = TapSettings.from_env()
        tokens = (TenantTokens.load(settings.base.tokens_file)
                  if settings.tenant_source == "token" and settings.base.tokens_file else None)
    except ConfigError as error:
        sys.stderr.write(f"agui-stream: configuration error: {error}\n")
        return 2
    logging.config.dictConfig(worker_logging(settings.base))

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await serve(settings, tokens, stopping)

    uvloop.run(main())
    return 0

