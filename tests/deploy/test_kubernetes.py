"""Kubernetes manifests: validated against the Kubernetes JSON schemas, then checked for intent."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from processors.config import DOCUMENTED

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))
# Oldest Kubernetes minor release the manifests must work on, and the newest
# schemas kubernetes-validate ships.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

# The documented configuration variables (README / issue 4).
DOCUMENTED_ENV = {name for name, _default, _meaning in DOCUMENTED}
SECRET_ENV = {"KAFKA_SASL_USERNAME"}
SECRET_FILES = ("KAFKA_SSL_CAFILE", "KAFKA_SASL_PASSWORD_FILE")  # mounted from the Secret


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> list[dict]:
    return [
        doc
        for path in MANIFESTS
        for doc in load(path)
        if doc["apiVersion"] != "kustomize.config.k8s.io/v1beta1"
    ]


def by_kind(kind: str) -> list[dict]:
    return [r for r in resources() if r["kind"] == kind]


def one(kind: str) -> dict:
    found = by_kind(kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_kubernetes_schema(path: Path, version: str) -> None:
    docs = load(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        if doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1":
            continue  # not a cluster resource; checked below
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path_in_doc = ".".join(str(p) for p in e.path)
            pytest.fail(f"{path.name} {doc['kind']}: {path_in_doc}: {e.message}", pytrace=False)
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{path.name}: no schema for {doc['kind']} ({e})", pytrace=False)


def test_expected_resources_in_one_namespace() -> None:
    kinds = {r["kind"] for r in resources()}
    assert {
        "Namespace", "ConfigMap", "Secret", "StatefulSet", "Service",
        "PodDisruptionBudget", "Job", "Deployment",
    } <= kinds  # fmt: skip
    namespace = one("Namespace")["metadata"]["name"]
    for r in resources():
        if r["kind"] != "Namespace":
            assert r["metadata"]["namespace"] == namespace, r["metadata"]["name"]


def test_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    kustomization = load(K8S / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in MANIFESTS} - {"kustomization.yaml"}
    assert listed == on_disk - {"secret-template.yaml"}


def test_secret_template_holds_placeholders_only() -> None:
    secret = one("Secret")
    assert "data" not in secret  # only readable stringData placeholders
    for key, value in secret["stringData"].items():
        assert "REPLACE_ME" in value, f"secret key {key} looks like a real value"


def pod_spec() -> dict:
    return one("StatefulSet")["spec"]["template"]["spec"]


def worker() -> dict:
    containers = pod_spec()["containers"]
    assert len(containers) == 1
    return containers[0]


def test_statefulset_keeps_rocksdb_state_on_a_claim() -> None:
    sts = one("StatefulSet")
    config = one("ConfigMap")["data"]
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in worker()["volumeMounts"]}
    assert config["AGUI_STORE"] == "rocksdb://"
    assert mounts[config["AGUI_DATA_DIR"]] in claims
    # serviceName is the headless Service.
    headless = {s["metadata"]["name"]: s for s in by_kind("Service")}[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"


def test_statefulset_notes_that_extra_workers_idle() -> None:
    text = (K8S / "statefulset.yaml").read_text()
    assert "beyond the raw topic's partition" in text and "idle" in text
    partitions = int(one("ConfigMap")["data"]["AGUI_PARTITIONS"])
    assert one("StatefulSet")["spec"]["replicas"] <= partitions


def test_worker_runs_the_worker_command_with_probes_and_resources() -> None:
    c = worker()
    assert c["args"] == ["worker"]
    port = int(one("ConfigMap")["data"]["AGUI_METRICS_PORT"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    paths = {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for probe, path in paths.items():
        assert c[probe]["httpGet"]["path"] == path, probe
        assert c[probe]["httpGet"]["port"] in ("metrics", port), probe
    res = c["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    assert "memory" in res["limits"]


def test_pods_run_as_non_root() -> None:
    for spec in (pod_spec(), one("Job")["spec"]["template"]["spec"], tap_spec()):
        containers = spec["containers"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for c in containers:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]


def test_configuration_comes_from_configmap_and_secret() -> None:
    config = one("ConfigMap")
    secret = one("Secret")
    assert set(config["data"]) <= DOCUMENTED_ENV, set(config["data"]) - DOCUMENTED_ENV
    assert not SECRET_ENV & set(config["data"]), "credentials belong in the Secret"
    job_spec = one("Job")["spec"]["template"]["spec"]
    for c in (worker(), job_spec["containers"][0]):
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in c["envFrom"]
        from_secret = {
            e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e
        }
        assert set(from_secret) == SECRET_ENV
        for ref in from_secret.values():
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
    assert "KAFKA_SASL_PASSWORD" not in config["data"]  # the password only as a file
    tls = {v["name"]: v for v in pod_spec()["volumes"]}["kafka-tls"]["secret"]
    assert tls["secretName"] == secret["metadata"]["name"]
    mount = {m["name"]: m["mountPath"] for m in worker()["volumeMounts"]}["kafka-tls"]
    mounted = {f"{mount}/{item['path']}": item["key"] for item in tls["items"]}
    for variable in SECRET_FILES:
        assert mounted[config["data"][variable]] in secret["stringData"], variable


def tap_spec() -> dict:
    return one("Deployment")["spec"]["template"]["spec"]


def worker_services() -> list[dict]:
    return [s for s in by_kind("Service")
            if s["metadata"]["labels"].get("app.kubernetes.io/component") != "tap"]


def test_services_and_pdb_select_the_workers() -> None:
    labels = one("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert one("StatefulSet")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in worker_services():
        assert svc["spec"]["selector"].items() <= labels.items(), svc["metadata"]["name"]
        assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_job_creates_topics_once() -> None:
    job = one("Job")
    spec = job["spec"]["template"]["spec"]
    assert spec["containers"][0]["args"] == ["create-topics"]
    assert spec["restartPolicy"] in {"OnFailure", "Never"}
    assert spec["containers"][0]["image"] == worker()["image"]


def test_the_tap_gateway_is_a_deployment_behind_its_service() -> None:
    deployment = one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/component"] == "tap"
    (c,) = tap_spec()["containers"]
    assert c["args"] == ["tap"] and c["image"] == worker()["image"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert set(env) <= DOCUMENTED_ENV
    assert env["AGUI_TAP_UPSTREAM_URL"].startswith("http")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    config = one("ConfigMap")["data"]
    assert ports == {"http": int(env["AGUI_TAP_PORT"]), "metrics": int(config["AGUI_METRICS_PORT"])}
    assert config["AGUI_TAP_TOPIC"] in config["AGUI_INPUT_TOPICS"].split(",")
    assert {"configMapRef": {"name": one("ConfigMap")["metadata"]["name"]}} in c["envFrom"]
    assert {e["name"] for e in c["env"] if "valueFrom" in e} == SECRET_ENV
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    (service,) = [s for s in by_kind("Service") if s not in worker_services()]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("http", "http")]
