"""The metric names the Grafana dashboard and the alert rules query, and the names
a live /metrics page shows: for the checks that scrape a running worker or tap."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.metric_names import (
    _sample_names,
    expand_grafana_variables,
    promql_metric_names,
)
from tests.deploy.test_grafana import dashboard, queries
from tests.deploy.test_prometheus import alert_rules


def queried_metric_names() -> set[str]:
    used: set[str] = set()
    for _, expr in queries(dashboard()):
        used |= promql_metric_names(expand_grafana_variables(expr))
    for rule in alert_rules():
        used |= promql_metric_names(rule["expr"])
    return used


def live_metric_names(scrape: str) -> set[str]:
    """The sample names of a /metrics page (a family without samples yet: the names
    it will have)."""
    return _sample_names(text_string_to_metric_families(scrape))
