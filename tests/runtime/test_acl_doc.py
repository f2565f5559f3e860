"""The ACLs docs/operations.md shows are the list the code checks and the secured-broker
tests grant (topics/acls.py), for the default settings."""

import re
from pathlib import Path

import pytest

from processors.config import Settings
from processors.runtime.kafka_access import layout
from topics.acls import (
    Layout,
    acl_document,
    literal_prefix,
    tenant_service_acls,
    worker_acls,
)

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
GENERATED = re.compile(r"<!-- generated: (.*?)agui-stream acls --markdown(.*?) \(tests[^>]*-->"
                       r"\n(.*?)\n<!-- end of generated ACLs -->", re.S)
PER_TENANT = {"AGUI_HISTORY_TOPIC_TEMPLATE": "agui.history.{tenant}",
              "AGUI_DEADLETTER_TOPIC_TEMPLATE": "agui.deadletter.{tenant}"}


def test_the_documented_acls_are_the_checked_list() -> None:
    """Both layouts: shared topics, and per-tenant topics with one tenant's service."""
    documented = GENERATED.findall(OPERATIONS.read_text())
    assert len(documented) == 2, "a generated ACL section of docs/operations.md is gone"
    expected = [("", "", acl_document(layout(Settings.from_env({})), markdown=True)),
                (" ".join(f"{name}={value}" for name, value in PER_TENANT.items()) + " ",
                 " --tenant acme", acl_document(layout(Settings.from_env(PER_TENANT)),
                                                markdown=True, tenants=["acme"]))]
    assert documented == expected, (
        "docs/operations.md's ACLs differ from topics/acls.py: paste the output of the"
        " command each marker names between the markers")


def test_a_tenant_s_history_service_reads_its_own_topic_only() -> None:
    acls = tenant_service_acls(layout(Settings.from_env(PER_TENANT)), "a.b")
    assert {(acl.operation.name, acl.resource.label, acl.name) for acl in acls} == {
        ("READ", "topic", "agui.history.a_2Eb"), ("READ", "group", "history-service-a_2Eb")}
    worker = worker_acls(layout(Settings.from_env(PER_TENANT)))
    assert not any(acl.operation.name == "CREATE" and acl.name.startswith("agui.")
                   for acl in worker)


def test_the_workers_read_the_history_they_write() -> None:
    """The thread view consumes the history topic (issue 29: the old doc left it out)."""
    granted = {(acl.operation.name, acl.name)
               for acl in worker_acls(layout(Settings.from_env({})))}
    assert {("READ", "agui.history"), ("WRITE", "agui.history")} <= granted


@pytest.mark.parametrize(("pattern", "prefix"), [
    (r"agui\.events\..*", "agui.events."),
    (r"^tenant-[a-z]+", "tenant-"),
    ("events-?x", "events"),
    ("(a|b)", ""),
])
def test_a_pattern_grants_its_literal_prefix(pattern: str, prefix: str) -> None:
    assert literal_prefix(pattern) == prefix


def test_a_pattern_without_a_literal_start_grants_nothing() -> None:
    everything = Layout("agui-stream", (), ".*", "agui.history", "agui.deadletter")
    with pytest.raises(ValueError, match="grant the raw topics by name"):
        worker_acls(everything)
