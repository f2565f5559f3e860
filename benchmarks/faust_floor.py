"""The floor under any Faust agent: the worker's Faust app with an agent that does nothing.

Run by ``service_bench.py`` as a child process, configured by the same
environment variables as ``agui-stream worker`` plus ``FLOOR_EVENTS`` (N) and
``FLOOR_RESULT`` (a file path); ``FLOOR_STOCK=1`` uses stock Faust classes
(``faust.App``) with the same settings instead of the worker's adapted ones.
The agent only iterates the raw input stream (Faust acks each event); no engine,
no tables, no outputs. When it has seen N
events it writes ``{"records": ..., "seconds": ...}`` (counted from the first
event seen) to the result file (Faust takes over stdout), and waits to be
stopped. Whatever the real worker does, it cannot beat this rate: the gap between
it and a bare aiokafka passthrough is Faust's own per-event cost.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import faust
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processors.config import Settings
from processors.runtime.app import faust_app
from processors.runtime.faust_adaptations import use_uvloop


def main() -> None:
    settings = Settings.from_env()
    total = int(os.environ["FLOOR_EVENTS"])
    stock = os.environ.get("FLOOR_STOCK") == "1"
    if not stock:
        use_uvloop()
    app = faust_app(settings, faust.App) if stock else faust_app(settings)
    source = (app.topic(*settings.input_topics, key_serializer="raw", value_serializer="raw")
              if stock else app.raw_topic(*settings.input_topics))

    @app.agent(source)
    async def count(stream: Any) -> None:
        seen = 0
        clock = 0.0
        async for _event in stream.events():
            seen += 1
            if seen == 1:
                clock = time.perf_counter()
            elif seen == total:
                result = {"records": total - 1, "seconds": time.perf_counter() - clock}
                written = Path(os.environ["FLOOR_RESULT"] + ".part")
                written.write_bytes(orjson.dumps(result))
                written.replace(os.environ["FLOOR_RESULT"])  # whole, for the reader polling it

    sys.argv[1:] = ["worker", "--loglevel", "warn", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
