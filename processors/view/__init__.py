"""The thread view: the history topic folded per thread (`thread_view`), the HTTP API
that serves it to agent servers (`thread_api`), who may ask (`tenant_tokens`), and a
client for them (`client`). No Faust: the runtime feeds it and serves its routes."""
