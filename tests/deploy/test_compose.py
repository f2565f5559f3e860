"""docker-compose.yml: checked against the compose specification's schema, then for intent.

No Docker engine runs here, so the stack is not started: the file is validated
with check-jsonschema's bundled compose-spec schema and parsed with PyYAML.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
AGUI_SERVICES = ("topics", "worker-1", "worker-2", "tap", "demo-producer")
WORKERS = ("worker-1", "worker-2")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def command(service: dict) -> list[str]:
    return [*service["entrypoint"], *service["command"]]


def test_compose_file_matches_the_compose_spec() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(COMPOSE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_and_images() -> None:
    s = services()
    assert set(s) == {"kafka", "prometheus", "grafana", *AGUI_SERVICES}
    kafka_image = s["kafka"]["image"]
    assert kafka_image.startswith("apache/kafka:4."), kafka_image
    assert s["prometheus"]["image"].startswith("prom/prometheus:")
    assert s["grafana"]["image"].startswith("grafana/grafana")
    for name in AGUI_SERVICES:
        assert s[name]["build"]["context"] == "."
        assert s[name]["build"]["dockerfile"] == "Dockerfile"
        assert s[name]["image"] == s["worker-1"]["image"]
    for name, service in s.items():
        assert not str(service.get("image", "")).endswith(":latest"), f"{name}: pin the tag"


def test_kafka_runs_kraft_single_node_with_transactions() -> None:
    kafka = services()["kafka"]
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "ZOOKEEPER" not in " ".join(env)
    # exactly_once needs the transaction log, which must fit one broker.
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1
    assert "9092:9092" in kafka["ports"]
    assert "EXTERNAL://localhost:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_agui_services_reach_kafka_on_the_internal_listener() -> None:
    s = services()
    internal = next(
        a.split("//")[1]
        for a in s["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
        if a.startswith("INTERNAL://")
    )
    for name in AGUI_SERVICES:
        env = s[name]["environment"]
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == internal, name
        assert s[name]["depends_on"]["kafka"]["condition"] == "service_healthy", name


def test_topics_is_one_shot_and_gates_the_workers() -> None:
    s = services()
    assert command(s["topics"]) == ["agui-stream", "create-topics"]
    assert s["topics"]["restart"] == "no"
    assert s["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in (*WORKERS, "tap", "demo-producer"):
        assert s[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_two_workers_with_own_state_and_metrics() -> None:
    s = services()
    volumes = []
    host_ports = []
    for name in WORKERS:
        w = s[name]
        assert command(w) == ["agui-stream", "worker"], name
        env = w["environment"]
        data_mounts = [v for v in w["volumes"] if v.endswith(":" + env["AGUI_DATA_DIR"])]
        assert len(data_mounts) == 1, name
        volumes.append(data_mounts[0].split(":")[0])
        port = env["AGUI_METRICS_PORT"]
        (mapping,) = w["ports"]
        host, container = mapping.split(":")
        assert container == port, name
        host_ports.append(host)
        test = " ".join(w["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/livez" in test, name
        assert w["healthcheck"]["start_period"]
    assert len(set(volumes)) == 2, "workers must not share a RocksDB volume"
    assert set(volumes) <= set(compose()["volumes"])
    assert len(set(host_ports)) == 2


def test_prometheus_and_grafana_mount_the_deploy_folders() -> None:
    s = services()
    assert "./deploy/prometheus:/etc/prometheus:ro" in s["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in s["prometheus"]["command"]
    assert "9090:9090" in s["prometheus"]["ports"]
    assert "3000:3000" in s["grafana"]["ports"]
    for service in ("prometheus", "grafana"):
        for volume in s[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).is_dir(), volume
    scraped = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        t
        for job in scraped["scrape_configs"]
        if job["job_name"] == "agui-stream"
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    assert targets == {f"{w}:{s[w]['environment']['AGUI_METRICS_PORT']}" for w in WORKERS}


def test_demo_producer_is_optional() -> None:
    s = services()
    demo = s["demo-producer"]
    assert demo["profiles"] == ["demo"]
    assert command(demo) == ["agui-stream", "demo", "--replay-only"]
    for name, service in s.items():
        if name != "demo-producer":
            assert "profiles" not in service, f"{name} must start with a plain `docker compose up`"


def test_the_tap_forwards_to_an_agent_and_publishes_to_the_workers_input() -> None:
    tap = services()["tap"]
    env = tap["environment"]
    assert command(tap) == ["agui-stream", "tap"]
    assert env["AGUI_TAP_UPSTREAM_URL"].startswith("${AGENT_URL:-http")
    assert env["AGUI_TAP_TOPIC"] in services()["worker-1"]["environment"]["AGUI_INPUT_TOPICS"]
    host_ports = {mapping.split(":")[1]: mapping.split(":")[0] for mapping in tap["ports"]}
    assert set(host_ports) == {env["AGUI_TAP_PORT"], env["AGUI_METRICS_PORT"]}
    assert f"127.0.0.1:{env['AGUI_METRICS_PORT']}/livez" in " ".join(tap["healthcheck"]["test"])
