"""The tap's pure core: an AG-UI SSE response in, the raw topic's records out.

Sans-IO like the engine: no sockets, no Kafka client, no clock. `sse` splits a
byte stream into events; `runs` names each event's run, echoes the request's
input on the requested run's `RUN_STARTED`, and plans what is published for
each run (the buffer bound, dropping a run whole, the `RUN_ERROR` of a run the
tap saw cut); `pipe_frames` is what the tap and its publisher process say to each
other. `processors/runtime/tap_server.py` and `tap_publisher.py` are the shell
around them.
"""
