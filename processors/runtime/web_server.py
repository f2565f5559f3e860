"""Faust's web server, closed to slow and greedy clients.

Faust serves its pages with aiohttp's defaults: a connection that sends half a
request is held for an hour (aiohttp's keep-alive timeout, 3,630 s, is the only
clock on it), and nothing caps how many connections are held. `HardenedWeb` is
Faust's aiohttp driver with its runner built from aiohttp's public knobs (and
`hardened_runner` with `listen_capped` give any aiohttp app the same, as the
tap's proxy and health ports use them):

* `request_timeout` (`REQUEST_TIMEOUT_SECONDS`): a connection must have sent a whole request (line
  and headers) this long after it opened, or after its previous answer; else it
  is closed. (aiohttp arms its keep-alive timer when a connection opens and after
  each answer, and closes the connection when it fires while no whole request
  is in; data arriving does not postpone it, so trickling bytes does not help.)
  A request being answered (a `run=` wait) is never cut by it.
* request line and header sizes (`MAX_LINE_BYTES`, `MAX_HEADERS`): beyond them
  aiohttp answers 400 or 431 and closes;
* `max_connections`: over it, a new connection is answered 503 (JSON, with
  `Retry-After`) and closed at once, before anything of it is read.

The routes read no request body: a body sent is never read, whatever its size.
docs/faust-adaptations.md, *The web server*, has the proof.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from aiohttp.web import Application, AppRunner
from faust.web.drivers.aiohttp import Web

from processors.view.thread_api import ErrorCode, api_error

REQUEST_TIMEOUT_SECONDS: Final = 10.0
MAX_LINE_BYTES: Final = 8190  # aiohttp's default request line and header field size
MAX_HEADERS: Final = 64
# Connections the kernel queues before they are accepted (asyncio's default, 100,
# dropped a burst of callers' handshakes, which then retried seconds later).
_BACKLOG: Final = 1024


@dataclass(frozen=True, slots=True)
class WebLimits:
    bind: str
    port: int
    max_connections: int
    request_timeout: float = REQUEST_TIMEOUT_SECONDS


_REFUSED: Final = api_error(503, ErrorCode.TOO_MANY_CONNECTIONS,
                            "too many open connections; retry in a second").json()
_REFUSAL: Final = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                   b"Retry-After: 1\r\nConnection: close\r\n"
                   + f"Content-Length: {len(_REFUSED)}\r\n\r\n".encode() + _REFUSED)


class _Refusal(asyncio.Protocol):
    """A connection over the cap: answered 503 and closed, nothing read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


def hardened_runner(app: Application, limits: WebLimits, **kwargs: Any) -> AppRunner:
    """An `AppRunner` for `app` with the request timeout and size limits above."""
    return AppRunner(app, access_log=None, keepalive_timeout=limits.request_timeout,
                     max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
                     max_headers=MAX_HEADERS, **kwargs)


async def listen_capped(runner: AppRunner, limits: WebLimits) -> asyncio.Server:
    """Set `runner` up and listen with a protocol factory that refuses connections
    over the cap."""
    await runner.setup()
    server = runner.server
    assert server is not None
    cap = limits.max_connections

    def protocol() -> asyncio.BaseProtocol:
        if len(server.connections) >= cap:
            return _Refusal()
        return server()

    return await asyncio.get_running_loop().create_server(
        protocol, limits.bind, limits.port, reuse_address=True, backlog=_BACKLOG)


class HardenedWeb(Web):
    """Faust's aiohttp web driver with the limits above (`limits` from the app)."""

    def __init__(self, app: Any, limits: WebLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits
        self._runner = hardened_runner(self.web_app, limits)
        self._listener: asyncio.Server | None = None

    async def start_server(self) -> None:
        self._listener = await listen_capped(self._runner, self.limits)

    async def stop_server(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await super().stop_server()

    def bound_port(self) -> int | None:
        """The port listened on (for a port 0 given)."""
        if self._listener is None or not self._listener.sockets:
            return None
        return int(self._listener.sockets[0].getsockname()[1])
