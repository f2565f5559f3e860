"""The conformance corpora through a running worker on a real broker.

One test per corpus (tests/corpora.py): the repository's own,
tests/conformance/, always; the shared one, ../shared/conformance, when that
directory exists (otherwise that test is skipped with the reason). Each case
of the corpus is produced under its own record key and its own tenant (so its
history has its own thread key), all cases interleaved on a 4-partition topic.
The history and dead-letter topics are read back with read_committed and
compared with the expected outcomes; the loss counter is scraped from
/metrics.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.corpora import Corpus, corpus_params
from tests.service_harness import Namespace, TopicReader, Worker, produce

pytestmark = pytest.mark.kafka


def load_cases(corpus: Corpus) -> dict[str, tuple[list[bytes], list[dict[str, Any]]]]:
    return {case.name: (case.lines(), case.runs) for case in corpus.cases()}


def scraped_counter(text: str, name: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for label, value in re.findall(rf'^{name}_total\{{\w+="([^"]+)"\}} (\S+)$', text, re.M):
        found[label] = int(float(value))
    return found


@pytest.mark.parametrize("corpus", corpus_params())
def test_conformance_corpus_through_the_service(corpus: Corpus, kafka_bootstrap: str,
                                                tmp_path: Path) -> None:
    cases = load_cases(corpus)
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    # Interleave the cases line by line, as a fleet of agents would.
    interleaved = []
    longest = max(len(lines) for lines, _ in cases.values())
    for index in range(longest):
        for name, (lines, _) in cases.items():
            if index < len(lines):
                interleaved.append((name.encode(), lines[index], [("tenant", name.encode())]))
    produced = produce(kafka_bootstrap, namespace.events, interleaved)
    line_of: dict[tuple[int, int], tuple[str, int]] = {}
    seen: Counter[str] = Counter()
    for record in produced:
        name = record.key.decode()
        seen[name] += 1
        line_of[(record.partition, record.offset)] = (name, seen[name])

    want_closing = sum(r["outcome"] in ("finished", "error") for _, runs in cases.values()
                       for r in runs)
    want_dead = sum((r["outcome"] == "failed") + len(r["warnings"])
                    for _, runs in cases.values() for r in runs)

    worker = Worker(namespace, tmp_path).start()
    try:
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: sum(r.value["kind"] == "run" for r in recs) >= want_closing, 180,
            f"{want_closing} closing records", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda recs: len(recs) >= want_dead, 60, f"{want_dead} dead letters",
            worker.log_tail)
        metrics = worker.metrics()
    finally:
        worker.stop()

    assert sum(r.value["kind"] == "run" for r in history) == want_closing
    assert len(dead) == want_dead

    runs_by_tenant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    messages_by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in history:
        value = record.value
        assert record.key == f"{value['tenant']}/{value.get('threadId', '')}".encode()
        if value["kind"] == "message":
            messages_by_run[(value["tenant"], value.get("runId", ""))].append(value)
        else:
            runs_by_tenant[value["tenant"]].append(value)
    failures: dict[str, list[dict[str, Any]]] = defaultdict(list)
    warnings: dict[str, Counter[tuple[str, int]]] = defaultdict(Counter)
    for record in dead:
        value = record.value
        name, line = line_of[(value["source"]["partition"], value["source"]["offset"])]
        assert record.key == name.encode()
        assert value["tenant"] == name
        assert record.headers["agui.dlq.code"].decode() == value["code"]
        assert record.headers["agui.dlq.offset"].decode() == str(value["source"]["offset"])
        if value["kind"] == "failure":
            failures[name].append({"code": value["code"], "line": line})
        else:
            warnings[name][(value["code"], line)] += 1

    for name, (_, runs) in cases.items():
        want_concluded = [(r["outcome"], r["messages"]) for r in runs
                          if r["outcome"] in ("finished", "error")]
        got_concluded = []
        for got in runs_by_tenant.get(name, []):
            published = sorted(messages_by_run[(name, got.get("runId", ""))],
                               key=lambda m: m["seq"])
            assert got["messageCount"] == len(published), name
            got_concluded.append((got["outcome"], [m["message"] for m in published]))
        if len({r.get("threadId") for r in runs_by_tenant.get(name, [])}) > 1:
            # History is ordered per key (tenant/thread) only; runs of several threads
            # (a thread-less RUN_ERROR, say) are compared without their order.
            want_concluded.sort(key=orjson.dumps)
            got_concluded.sort(key=orjson.dumps)
        assert got_concluded == want_concluded, name
        assert failures.get(name, []) == [r["failure"] for r in runs if r["outcome"] == "failed"]
        assert warnings.get(name, Counter()) == Counter(
            (w["code"], w["line"]) for r in runs for w in r["warnings"]), name

    want_lost = Counter(loss["reason"] for _, runs in cases.values() for r in runs
                        for loss in r["lostEncrypted"])
    assert scraped_counter(metrics, "agui_encrypted_content_lost") == want_lost
    # The rest of /metrics agrees with what was published.
    want_outcomes = Counter(r["outcome"] for _, runs in cases.values() for r in runs
                            if r["outcome"] != "open")
    assert scraped_counter(metrics, "agui_runs") == want_outcomes
    assert scraped_counter(metrics, "agui_deadletter_records") == Counter(
        r.value["kind"] for r in dead)
    assert scraped_counter(metrics, "agui_warnings") == Counter(
        w["code"] for _, runs in cases.values() for r in runs for w in r["warnings"])
    assert scraped_counter(metrics, "agui_run_failures") == Counter(
        r["failure"]["code"] for _, runs in cases.values() for r in runs if r["failure"])
    assert f"agui_history_records_total {float(len(history))}" in metrics
    assert sum(scraped_counter(metrics, "agui_events").values()) == len(produced)
    assert_dashboard_and_alerts_match(metrics)


def assert_dashboard_and_alerts_match(scrape: str) -> None:
    """Every metric the Grafana dashboard and the alert rules query is on a live /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.deploy.metric_names import (
        PROMETHEUS_SYNTHETIC,
        _sample_names,
        expand_grafana_variables,
        promql_metric_names,
    )
    from tests.deploy.test_grafana import dashboard, queries
    from tests.deploy.test_prometheus import alert_rules

    live = _sample_names(text_string_to_metric_families(scrape))
    used: set[str] = set()
    for _, expr in queries(dashboard()):
        used |= promql_metric_names(expand_grafana_variables(expr))
    for rule in alert_rules():
        used |= promql_metric_names(rule["expr"])
    assert used, "no query found"
    assert used - PROMETHEUS_SYNTHETIC - live == set()
