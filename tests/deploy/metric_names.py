"""Which metric names the service exports, and which ones a PromQL expression uses.

Shared by the dashboard and alert-rule tests: every query they hold must name
a metric the service really exports.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Iterable
from functools import cache

import promql_parser
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# Series Prometheus itself synthesizes for every target; no service exports them.
PROMETHEUS_SYNTHETIC = frozenset({"up"})

# Suffixes a family exposes when it has no sample yet (a labelled metric before
# its first .labels() call exposes only HELP and TYPE).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def _sample_names(families: Iterable[Metric]) -> set[str]:
    names: set[str] = set()
    for family in families:
        if family.samples:
            names.update(sample.name for sample in family.samples)
        else:
            # The names the family will expose once it has samples.
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


@cache
def exported_metric_names() -> frozenset[str]:
    """The sample names a worker and a tap export on /metrics.

    With AGUI_METRICS_URL (a worker's, e.g. http://127.0.0.1:6066/metrics) or
    AGUI_TAP_METRICS_URL (a tap's) set, that side's names come from a live scrape.
    Otherwise they come from the registries of ``processors.metrics.Metrics()`` and
    ``TapMetrics()``, which define every metric the service registers.
    """
    from processors.metrics import Metrics, TapMetrics

    names: set[str] = set()
    for variable, registry in (("AGUI_METRICS_URL", Metrics().registry),
                               ("AGUI_TAP_METRICS_URL", TapMetrics().registry)):
        url = os.environ.get(variable)
        if url:
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode("utf-8")
            names |= _sample_names(text_string_to_metric_families(text))
        else:
            names |= _sample_names(registry.collect())
    return frozenset(names)


def promql_metric_names(expr: str) -> set[str]:
    """Metric names every vector selector of a PromQL expression selects."""
    names: set[str] = set()
    problems: list[str] = []

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:
                by_name = [m for m in node.matchers.matchers if m.name == "__name__"]
                if len(by_name) == 1 and by_name[0].op == promql_parser.MatchOp.Equal:
                    names.add(by_name[0].value)
                else:
                    problems.append(f"selector without a plain metric name: {node}")
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    if problems:
        raise ValueError("; ".join(problems))
    return names


_GRAFANA_BUILTINS = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "60000",
}


def expand_grafana_variables(expr: str) -> str:
    """Replace Grafana variables by values that keep the query valid PromQL.

    Built-in interval variables become durations; dashboard variables (used in
    label matchers) become the regex ``.*``.
    """

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return _GRAFANA_BUILTINS.get(name, ".*")

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)
