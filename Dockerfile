# syntax=docker/dockerfile:1
#
# agui-stream worker image.
#
#   docker build -t agui-stream .
#   docker run --rm -e KAFKA_BOOTSTRAP_SERVERS=broker:9092 agui-stream          # = agui-stream worker
#   docker run --rm agui-stream check /data/run.jsonl                            # any subcommand
#
# Two stages: the builder has a compiler and turns the project and every
# dependency into wheels; the runtime stage installs those wheels only, so no
# build tool, source tree or pip cache reaches the final image.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

############################ builder ############################
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Build tools for any dependency that ships no wheel for this platform.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# README* : pyproject names README.md as the long description; the glob keeps
# the build working while it does not exist yet.
COPY pyproject.toml README* ./
COPY processors ./processors
COPY topics ./topics

RUN pip wheel --wheel-dir /wheels .

############################ runtime ############################
FROM ${PYTHON_IMAGE} AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGUI_DATA_DIR=/var/lib/agui-stream \
    AGUI_METRICS_PORT=6066

# A fixed, numeric, unprivileged user: Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 agui \
 && useradd --system --uid 10001 --gid agui --no-create-home \
            --home-dir /var/lib/agui-stream --shell /usr/sbin/nologin agui \
 && mkdir -p /var/lib/agui-stream \
 && chown agui:agui /var/lib/agui-stream

# Install the builder's wheels (the project and its pinned dependency
# closure) and nothing else: no index, nothing compiled here.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/*.whl

# RocksDB table state; rebuilt from the changelog topics when lost.
VOLUME ["/var/lib/agui-stream"]
WORKDIR /var/lib/agui-stream

USER 10001:10001

# /metrics (Prometheus) and /healthz.
EXPOSE 6066

# slim images have no curl: ask /healthz with the standard library.
# urlopen raises on anything but 2xx, so the exit status is the verdict.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('AGUI_METRICS_PORT', '6066'), timeout=4)"]

ENTRYPOINT ["agui-stream"]
CMD ["worker"]
