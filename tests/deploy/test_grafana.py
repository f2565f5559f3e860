"""Grafana provisioning and dashboard: every query names a metric the service exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.deploy.metric_names import (
    PROMETHEUS_SYNTHETIC,
    expand_grafana_variables,
    exported_metric_names,
    promql_metric_names,
)

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "agui-stream.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "agui-stream.yml"

# Panel title -> a metric its queries must use (the list of panels).
REQUIRED_PANELS = {
    "Runs concluded by outcome": "agui_runs_total",
    "Run failures by code": "agui_run_failures_total",
    "Encrypted values lost by reason": "agui_encrypted_content_lost_total",
    "Throughput (events/s)": "agui_events_total",
    "Processing latency": "agui_processing_latency_seconds_bucket",
    "Consumer lag": "agui_consumer_lag_records",
    "Open runs": "agui_open_runs",
    "Dead letters by kind": "agui_deadletter_records_total",
    "Warnings by code": "agui_warnings_total",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(container: dict) -> Iterator[dict]:
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)  # rows may nest panels


def queries(dash: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in panels(dash):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target.get('refId')}", target["expr"]
    for variable in dash.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        # label_values(metric_selector, label) -> the selector is PromQL.
        match = re.fullmatch(r"\s*label_values\((.+),\s*\w+\s*\)\s*", query)
        assert match, f"variable {variable['name']}: unsupported query {query!r}"
        yield f"variable {variable['name']}", match.group(1)


def test_every_query_names_an_exported_metric() -> None:
    exported = exported_metric_names()
    seen: set[str] = set()
    for where, expr in queries(dashboard()):
        used = promql_metric_names(expand_grafana_variables(expr))
        assert used, f"{where}: no metric in {expr!r}"
        missing = used - PROMETHEUS_SYNTHETIC - exported
        assert not missing, f"{where} uses metrics the service does not export: {missing}"
        seen |= used
    # The dashboard shows every metric family the service exports.
    families = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in exported}
    shown = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in seen}
    assert families <= shown, f"exported but on no panel: {families - shown}"


def test_required_panels() -> None:
    by_title = {p["title"]: p for p in panels(dashboard())}
    for title, metric in REQUIRED_PANELS.items():
        assert title in by_title, f"missing panel {title!r}"
        exprs = [t["expr"] for t in by_title[title]["targets"]]
        used = set().union(*(promql_metric_names(expand_grafana_variables(e)) for e in exprs))
        assert metric in used, f"panel {title!r} does not query {metric}"
    latency = " ".join(t["expr"] for t in by_title["Processing latency"]["targets"])
    assert "histogram_quantile(0.5," in latency
    assert "histogram_quantile(0.99," in latency


def test_panels_are_well_formed() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in panels(dash):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_uses_the_provisioned_datasource() -> None:
    datasources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    prometheus = [d for d in datasources if d["type"] == "prometheus"]
    assert len(prometheus) == 1
    uid = prometheus[0]["uid"]
    assert prometheus[0]["url"] == "http://prometheus:9090"  # the compose service
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid, panel["title"]


def test_dashboard_provider_points_at_the_mounted_folder() -> None:
    providers = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    path = providers[0]["options"]["path"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in mounts
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
