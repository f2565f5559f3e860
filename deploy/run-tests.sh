#!/usr/bin/env bash
# The project's test command (.ci/run calls exactly this).
#
#   bash deploy/run-tests.sh [pytest args...]     e.g. bash deploy/run-tests.sh tests/test_local_broker.py
#
# 1. .venv via deploy/bootstrap.sh   2. promtool (Debian's prometheus) if missing
# 3. Kafka jars (deploy/kafka_local.py fetch) unless KAFKA_BOOTSTRAP_SERVERS is set
# 4. ruff + mypy on processors/ and topics/   5. pytest (its fixtures start/stop Kafka)
# Works non-interactively (CI=true, no stdin).  Exits non-zero on any failure.
# AGUI_SKIP_LINT=1 skips step 4 for a quick local run (ignored when CI=true).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PIP_NO_INPUT=1 DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1
exec </dev/null

step() { echo "==> [$(date +%H:%M:%S)] $*" >&2; }
warn() { echo "WARNING: $*" >&2; }

step "python environment"
bash deploy/bootstrap.sh
PY="$ROOT/.venv/bin/python"

if ! command -v promtool >/dev/null 2>&1; then
    step "installing promtool (Debian package prometheus)"
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then SUDO=(sudo -n); fi
    # Don't let the package's maintainer scripts start a prometheus daemon.
    POLICY=/usr/sbin/policy-rc.d
    made_policy=0
    if [ "$(id -u)" -eq 0 ] && [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$POLICY" && chmod +x "$POLICY" && made_policy=1
    fi
    if "${SUDO[@]}" apt-get update -qq >/dev/null 2>&1 \
        && "${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; then
        step "promtool: $(promtool --version 2>&1 | head -n 1)"
    else
        warn "could not install prometheus/promtool; tests that need promtool will skip or fail"
    fi
    if [ "$made_policy" -eq 1 ]; then rm -f "$POLICY"; fi
fi

if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
    step "kafka broker jars"
    "$PY" deploy/kafka_local.py fetch
else
    step "using external Kafka at KAFKA_BOOTSTRAP_SERVERS=$KAFKA_BOOTSTRAP_SERVERS"
fi

if [ "${AGUI_SKIP_LINT:-0}" = "1" ] && [ "${CI:-}" != "true" ]; then
    warn "AGUI_SKIP_LINT=1: skipping ruff and mypy (never skipped when CI=true)"
else
    step "ruff check"
    "$ROOT/.venv/bin/ruff" check processors topics deploy tests benchmarks

    step "mypy (strict) processors topics"
    "$ROOT/.venv/bin/mypy" processors topics
fi

step "pytest $*"
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    warn "pytest collected no tests (exit 5); treating as success"
    rc=0
fi
exit "$rc"
