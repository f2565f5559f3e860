"""agui-stream: AG-UI run events in, validated and reassembled history out.

The packages are the layers, lowest first; a module imports only its own layer
and those below it (tests/test_layers.py checks it on every run):

========================  =====================================================
``topics``                the contracts: event models, record shapes, topics,
                          partitioning, redaction (top level, beside processors)
``processors.engine``     the AG-UI rules, sans-IO: events in, decisions out;
                          no Kafka, no Faust, no clock; imports only ``topics``
``processors.tap``        the tap's core, sans-IO like the engine: SSE framing,
                          run keys, the input echo, the publication plan
``config``, ``metrics``,  what every layer above shares: settings, Prometheus
``safe_logging``          metrics, logging that never quotes content
``processors.processing`` records in, records and state changes out: the
                          engine behind each run key, outputs sized before they
                          are sent, state encoded for the changelog; broker-free
``processors.view``       the thread view (history folded per thread), its HTTP
                          API, tenant tokens, and a client for agent servers
``processors.runtime``    the only layer that imports Faust or aiokafka: the
                          Faust app, the worker's jobs, the adaptations that
                          make Faust's exactly-once hold, health, topic admin
``processors.tools``      the command line: ``check``, ``demo``, ``worker``
========================  =====================================================

One engine serves the checker, the worker and the tests: a rule changes in
``processors.engine`` (and ``docs/rules.md``), nowhere else.
"""
