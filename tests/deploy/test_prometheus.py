"""Prometheus scrape config and alert rules, checked by promtool and against the service."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.metric_names import (
    PROMETHEUS_SYNTHETIC,
    exported_metric_names,
    promql_metric_names,
)

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
CONFIG = PROM_DIR / "prometheus.yml"
ALERTS = PROM_DIR / "alerts.yml"
ALERTS_TEST = PROM_DIR / "alerts_test.yml"
OPERATIONS = REPO / "docs" / "operations.md"

# The alerts the operations guide promises (issue 4), by what they watch.
REQUIRED_ALERTS = {
    "AguiEncryptedContentLost": "agui_encrypted_content_lost_total",
    "AguiRunFailureRateHigh": "agui_run_failures_total",
    "AguiDeadLetterRateHigh": "agui_deadletter_records_total",
    "AguiConsumerLagHigh": "agui_consumer_lag_records",
    "AguiOpenRunsUnbounded": "agui_open_runs",
    "AguiWorkerDown": "up",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("AGUI_ALLOW_MISSING_PROMTOOL") == "1":
        pytest.skip("promtool not installed and AGUI_ALLOW_MISSING_PROMTOOL=1")
    pytest.fail(
        "promtool is not installed, so the Prometheus config and alert rules cannot be "
        "checked. Install it (Debian: `apt-get install -y --no-install-recommends "
        "prometheus`) or set AGUI_ALLOW_MISSING_PROMTOOL=1 to skip these checks.",
        pytrace=False,
    )


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, (
        f"promtool {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    return result


def alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_check_config() -> None:
    out = run_promtool("check", "config", str(CONFIG)).stdout
    assert "SUCCESS" in out


def test_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", str(ALERTS)).stdout
    assert f"{len(alert_rules())} rules found" in out


def test_promtool_test_rules() -> None:
    out = run_promtool("test", "rules", str(ALERTS_TEST)).stdout
    assert "SUCCESS" in out


def test_config_loads_the_alert_rules_and_scrapes_the_workers() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert (CONFIG.parent / "alerts.yml").resolve() in {
        (CONFIG.parent / f).resolve() for f in config["rule_files"]
    }
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # alerts.yml selects on this job name.
    worker_job = jobs["agui-stream"]
    assert worker_job.get("metrics_path", "/metrics") == "/metrics"
    assert 'job="agui-stream"' in ALERTS.read_text()
    targets = {t for sc in worker_job["static_configs"] for t in sc["targets"]}
    assert targets == {"worker-1:6066", "worker-2:6066"}


def test_every_required_alert_exists_and_watches_its_metric() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(REQUIRED_ALERTS) <= set(rules), set(REQUIRED_ALERTS) - set(rules)
    for name, metric in REQUIRED_ALERTS.items():
        assert metric in promql_metric_names(rules[name]["expr"]), name
        assert rules[name]["labels"]["severity"] in {"critical", "warning"}, name


def test_alert_expressions_use_only_exported_metrics() -> None:
    exported = exported_metric_names()
    for rule in alert_rules():
        used = promql_metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no metric in {rule['expr']!r}"
        missing = used - PROMETHEUS_SYNTHETIC - exported
        assert not missing, f"{rule['alert']} uses metrics the service does not export: {missing}"


def _doc_anchors() -> set[str]:
    text = OPERATIONS.read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_alert_links_its_runbook_section() -> None:
    anchors = _doc_anchors()
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", url
        assert anchor == f"alert-{rule['alert'].lower()}", url
        assert anchor in anchors, f"docs/operations.md has no section #{anchor}"
        assert rule["annotations"].get("summary"), rule["alert"]


def test_unit_tests_fire_and_spare_every_alert() -> None:
    """alerts_test.yml fires each alert at least once and has a case where it stays quiet."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names <= fired, f"alerts never fired by a unit test: {names - fired}"
    assert names <= quiet, f"alerts without a not-firing unit test: {names - quiet}"
