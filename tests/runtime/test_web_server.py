"""The worker's web server against slow and greedy clients (no broker): a
half-sent request is closed within the request timeout, a connection over the
cap is refused with a JSON 503, oversized headers are refused, and a request
that takes longer than the timeout to answer is not cut."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import faust
import orjson
import pytest
from aiohttp import web

from processors.runtime.web_server import HardenedWeb, WebLimits

TIMEOUT = 0.5


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(TIMEOUT * 2)
    return web.Response(text="done")


async def _fast(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def with_server(test: Callable[[int], Coroutine[Any, Any, None]],
                max_connections: int = 5) -> None:
    async def scenario() -> None:
        app = faust.App("web-server-test", autodiscover=False, loghandlers=[])
        server = HardenedWeb(app, WebLimits("127.0.0.1", 0, max_connections, TIMEOUT))
        server.web_app.router.add_get("/fast", _fast)
        server.web_app.router.add_get("/slow", _slow)
        await server.start_server()
        try:
            port = server.bound_port()
            assert port is not None
            await test(port)
        finally:
            await server.stop_server()

    asyncio.run(scenario())


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _answer(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), TIMEOUT * 6)


async def _get(port: int, path: str) -> bytes:
    reader, writer = await _connect(port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = await _answer(reader)
    writer.close()
    return answer


@pytest.mark.parametrize("sent", [b"", b"GET /fast HT", b"GET /fast HTTP/1.1\r\nHost: x\r\n"])
def test_a_request_not_sent_in_time_is_closed(sent: bytes) -> None:
    async def test(port: int) -> None:
        reader, writer = await _connect(port)
        writer.write(sent)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await _answer(reader) == b""  # closed, nothing answered
        assert loop.time() - started < TIMEOUT * 3
        writer.close()

    with_server(test)


def test_trickling_bytes_does_not_keep_a_connection_open() -> None:
    async def test(port: int) -> None:
        reader, writer = await _connect(port)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for byte in b"GET /fast HTTP/1.1\r\nHost: x\r\n":
            if writer.is_closing() or reader.at_eof():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(TIMEOUT / 10)
        assert await _answer(reader) == b""
        assert loop.time() - started < TIMEOUT * 4
        writer.close()

    with_server(test)


def test_connections_over_the_cap_are_refused_with_a_json_503() -> None:
    async def test(port: int) -> None:
        held = [await _connect(port) for _ in range(3)]
        await asyncio.sleep(0.05)  # accepted
        reader, writer = await _connect(port)
        answer = await _answer(reader)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        assert orjson.loads(body)["code"] == "too_many_connections"
        writer.close()
        for _, held_writer in held:
            held_writer.close()
        await asyncio.sleep(0.05)
        assert (await _get(port, "/fast")).startswith(b"HTTP/1.1 200")  # room again

    with_server(test, max_connections=3)


def test_oversized_request_lines_and_headers_are_refused() -> None:
    async def test(port: int) -> None:
        line = await _get(port, "/fast?" + "x" * 9000)
        assert line.split(b" ", 2)[1] in (b"400", b"414")
        reader, writer = await _connect(port)
        headers = "".join(f"X-{n}: 1\r\n" for n in range(100))
        writer.write(f"GET /fast HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        assert (await _answer(reader)).split(b" ", 2)[1] in (b"400", b"431")
        writer.close()

    with_server(test)


def test_an_answer_slower_than_the_request_timeout_is_not_cut() -> None:
    async def test(port: int) -> None:
        assert (await _get(port, "/slow")).startswith(b"HTTP/1.1 200")

    with_server(test)

