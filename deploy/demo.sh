#!/usr/bin/env bash
# The README's first command: the whole service end to end on a fresh machine.
#
#   bash deploy/demo.sh [--secure]
#
# Installs what is missing (.venv, the Kafka jars), starts a local Apache Kafka
# (KRaft, loopback only) unless KAFKA_BOOTSTRAP_SERVERS names one, creates the
# topics, starts a worker, replays the bundled sample runs, prints a summary
# and keeps running until Ctrl-C; then it stops everything it started.
# --secure: the broker requires TLS and SASL/SCRAM and enforces ACLs; the
# administrator (admin) creates the topics and grants the documented ACLs, the
# worker connects as agui-stream with exactly those (docs/operations.md).
set -euo pipefail

secure=0
case "${1:-}" in
    "") ;;
    --secure) secure=1 ;;
    *) echo "usage: bash deploy/demo.sh [--secure]" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
step() { echo "==> $*" >&2; }

step "python environment"
bash deploy/bootstrap.sh
PY="$ROOT/.venv/bin/python"

STATE="$ROOT/var/demo"
export AGUI_DATA_DIR="$STATE/worker-state"
export AGUI_STORE="${AGUI_STORE:-rocksdb://}"
export AGUI_METRICS_PORT="${AGUI_METRICS_PORT:-6066}"
export AGUI_IDLE_TIMEOUT_SECONDS="${AGUI_IDLE_TIMEOUT_SECONDS:-300}"
rm -rf "$AGUI_DATA_DIR"

started_broker=0
cleanup() {
    # The output may be gone (`| tee` ended by the same Ctrl-C): a write to it
    # must not kill the clean-up, so the broker is stopped first, quietly.
    trap '' PIPE INT TERM
    set +e
    if [ "$started_broker" -eq 1 ]; then
        "$PY" deploy/kafka_local.py stop --state-dir "$STATE/kafka" >/dev/null 2>&1
        step "stopped the local Kafka broker" || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$secure" -eq 1 ] && [ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
    echo "--secure starts its own secured broker: unset KAFKA_BOOTSTRAP_SERVERS" >&2
    exit 2
fi
AGUI=("$ROOT/.venv/bin/agui-stream")
demo_args=()
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
    step "local Apache Kafka (KRaft) from Maven Central"
    "$PY" deploy/kafka_local.py fetch
    "$PY" deploy/kafka_local.py stop --state-dir "$STATE/kafka" >/dev/null 2>&1 || true
    started_broker=1
    start_args=(--state-dir "$STATE/kafka")
    if [ "$secure" -eq 1 ]; then start_args+=(--secure); fi
    bootstrap_line="$("$PY" deploy/kafka_local.py start "${start_args[@]}" | tail -n 1)"
    export "${bootstrap_line?}"
fi
if [ "$secure" -eq 1 ]; then
    eval "$("$PY" deploy/kafka_local.py secure-env --user admin --state-dir "$STATE/kafka")"
    "$PY" deploy/kafka_local.py secure-env --user agui-stream --state-dir "$STATE/kafka" \
        > "$STATE/worker.env"
    step "as admin: topics and the documented ACLs"
    "${AGUI[@]}" create-topics
    "${AGUI[@]}" acls --apply
    demo_args=(--worker-env "$STATE/worker.env")
    step "the worker connects as agui-stream over SASL_SSL with only those ACLs"
fi
step "broker at $KAFKA_BOOTSTRAP_SERVERS"
"${AGUI[@]}" demo "${demo_args[@]}"
