#!/usr/bin/env bash
# Create/refresh the project virtualenv at <repo>/.venv and install agui-stream
# (editable, with the dev extras).  Idempotent: the install is skipped while
# pyproject.toml, the repo path and the interpreter are unchanged since the
# last successful install (stamp file .venv/.agui-install.stamp).
#
#   bash deploy/bootstrap.sh           # PYTHON=python3.12 to pick another interpreter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
STAMP="$VENV/.agui-install.stamp"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "[bootstrap] $*" >&2; }

pick_python() {
    local cand
    for cand in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$cand" ] || continue
        command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 14)))'; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

# A venv whose interpreter no longer runs (e.g. python upgraded underneath) is rebuilt.
if [ -e "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    say "existing .venv is broken; recreating it"
    rm -rf "$VENV"
fi

if [ ! -x "$VENV/bin/python" ]; then
    PY="$(pick_python)" || { say "error: need Python >=3.11,<3.14 (set PYTHON=...)"; exit 1; }
    say "creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
fi

want="$(
    {
        sha256sum pyproject.toml
        echo "$ROOT"
        "$VENV/bin/python" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/agui-stream" ]; then
    say ".venv up to date (pyproject.toml unchanged since last install)"
    exit 0
fi

rm -f "$STAMP"
LOG="$VENV/bootstrap-pip.log"
: > "$LOG"
pip_logged() {
    if ! "$VENV/bin/python" -m pip "$@" >>"$LOG" 2>&1; then
        say "error: pip $* failed; last lines of $LOG:"
        tail -n 40 "$LOG" >&2
        exit 1
    fi
}
say "upgrading pip (log: $LOG)"
pip_logged install --upgrade pip
say "installing agui-stream (editable) with dev extras; this can take a minute"
pip_logged install -e ".[dev]"
[ -x "$VENV/bin/agui-stream" ] || { say "error: console script agui-stream missing after install"; exit 1; }
echo "$want" > "$STAMP"
say "done: $("$VENV/bin/python" --version 2>&1) in .venv, agui-stream at .venv/bin/agui-stream"
