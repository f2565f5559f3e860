"""The conformance corpora through a running worker on a real broker.

One test per corpus (tests/corpora.py): the repository's own,
tests/conformance/, always; the shared one, ../shared/conformance, when that
directory exists (otherwise that test is skipped with the reason). Each case
of the corpus is produced under its own record key and its own tenant (so its
history has its own thread key), all cases interleaved on a 4-partition topic.
The history and dead-letter topics are read back with read_committed and
compared, case by case, with what the offline checker concludes for the same
lines (tests/engine/test_conformance.py holds the checker to the corpus'
expected results): the same runs, endings, history records in `seq` order,
failures, warnings and losses; /metrics agrees with the records.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from processors.tools.checker import CheckTotals, RunReport, check_records
from tests.corpora import Corpus, corpus_params
from tests.service_harness import Namespace, TopicReader, Worker, produce

pytestmark = pytest.mark.kafka


def load_cases(corpus: Corpus) -> dict[str, tuple[list[bytes], list[RunReport]]]:
    return {case.name: (case.lines(), list(check_records(case.lines(), CheckTotals())))
            for case in corpus.cases()}


def scraped_counter(text: str, name: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for label, value in re.findall(rf'^{name}_total\{{\w+="([^"]+)"\}} (\S+)$', text, re.M):
        found[label] = int(float(value))
    return found


def closing_records(report: RunReport) -> int:
    """How many closing records the service publishes for what the checker concluded."""
    if report.outcome == "open" or (report.outcome == "failed" and report.run is None):
        return 0  # still open, or a record that failed on its own: no run ended
    return 2 if report.late_line is not None else 1


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

    want_closing = sum(closing_records(r) for _, runs in cases.values() for r in runs)
    want_dead = sum((r.outcome == "failed") + len(r.warnings)
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

    closings: dict[str, list[dict[str, Any]]] = defaultdict(list)
    content: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in history:
        value = record.value
        assert value["schema"] == "agui.history.v2"
        assert record.key == f"{value['tenant']}/{value.get('threadId', '')}".encode()
        if value["kind"] == "run":
            closings[value["tenant"]].append(value)
        else:
            content[(value["tenant"], value.get("runId", ""))].append(value)
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
        want_runs = []
        for report in runs:
            if not closing_records(report):
                continue
            ending = "failed" if report.outcome == "failed" else report.ending
            want_runs.append((ending, report.late_line is not None, report.messages,
                              report.updates, report.input_echoed))
        got_runs = []
        for got in closings.get(name, []):
            if got.get("late"):
                continue  # checked with the run it turns into an error, below
            published = sorted(content[(name, got.get("runId", ""))], key=lambda m: m["seq"])
            assert got["messageCount"] == len(published), name
            late = [c for c in closings[name] if c.get("late") and c.get("runId") == got.get(
                "runId") and c.get("threadId") == got.get("threadId")]
            got_runs.append((
                "error" if late else got["outcome"],
                bool(late),
                [r["message"] for r in published if r["kind"] in ("message", "input")],
                [{"kind": r["kind"], "messageId": r["messageId"]} if r["kind"] == "removal"
                 else {"kind": r["kind"], "message": r["message"]}
                 for r in published if r["kind"] in ("continuation", "removal")],
                got.get("inputEchoed"),
            ))
        if len({r.get("threadId") for r in closings.get(name, [])}) > 1:
            # History is ordered per key (tenant/thread) only; runs of several threads
            # (a thread-less RUN_ERROR, say) are compared without their order.
            want_runs.sort(key=orjson.dumps)
            got_runs.sort(key=orjson.dumps)
        assert got_runs == want_runs, name
        assert failures.get(name, []) == [r.failure for r in runs if r.outcome == "failed"]
        assert warnings.get(name, Counter()) == Counter(
            (w["code"], w["line"]) for r in runs for w in r.warnings), name

    want_lost = Counter(loss["reason"] for _, runs in cases.values() for r in runs
                        for loss in r.lost)
    assert scraped_counter(metrics, "agui_encrypted_content_lost") == want_lost
    # The rest of /metrics agrees with what was published: a run is counted once, by
    # how it ended first (a late error is a warning), a record failing on its own too.
    want_outcomes = Counter(value["outcome"] for values in closings.values()
                            for value in values if not value.get("late"))
    want_outcomes["failed"] += sum(r.outcome == "failed" and r.run is None
                                   for _, runs in cases.values() for r in runs)
    assert scraped_counter(metrics, "agui_runs") == +want_outcomes
    assert scraped_counter(metrics, "agui_deadletter_records") == Counter(
        r.value["kind"] for r in dead)
    assert scraped_counter(metrics, "agui_warnings") == Counter(
        w["code"] for _, runs in cases.values() for r in runs for w in r.warnings)
    assert scraped_counter(metrics, "agui_run_failures") == Counter(
        r.failure["code"] for _, runs in cases.values() for r in runs if r.failure)
    assert f"agui_history_records_total {float(len(history))}" in metrics
    assert sum(scraped_counter(metrics, "agui_events").values()) == len(produced)
    assert_dashboard_and_alerts_match(metrics)


def assert_dashboard_and_alerts_match(scrape: str) -> None:
    """Every worker metric the Grafana dashboard and the alert rules query is on a live
    /metrics (the tap's, `agui_tap_*`, are a tap's: tests/deploy checks them against
    its registry, and tests/runtime/test_tap_service.py scrapes a live tap)."""
    from tests.deploy.metric_names import PROMETHEUS_SYNTHETIC
    from tests.deploy.queried_metrics import live_metric_names, queried_metric_names

    worker_metrics = {name for name in queried_metric_names()
                      if not name.startswith("agui_tap_")}
    assert worker_metrics, "no query found"
    assert worker_metrics - PROMETHEUS_SYNTHETIC - live_metric_names(scrape) == set()
