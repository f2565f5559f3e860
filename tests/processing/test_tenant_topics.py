"""Per-tenant topics without a broker: the tenant -> topic naming (injective, always a
legal name or none), the settings' checks, and the routing of a record's outputs,
with the one dead letter of a tenant whose topics do not exist."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.config import ConfigError, Settings
from processors.engine.codes import FailureCode, Outcome, WarningCode
from processors.engine.decisions import Concluded, Failed, HistoryEntry, RunIdentity, Step
from processors.metrics import Metrics
from processors.processing.outputs import Incoming, OutputBuilder
from processors.processing.routing import CHECKED_TENANTS, TenantRouting
from topics.tenant_topics import MAX_TOPIC_CHARS, Template, encode_tenant

HISTORY = Template("agui.history.{tenant}")
DEADLETTER = Template("agui.deadletter.{tenant}")
LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
TEMPLATES = {"AGUI_HISTORY_TOPIC_TEMPLATE": HISTORY.text,
             "AGUI_DEADLETTER_TOPIC_TEMPLATE": DEADLETTER.text}

tenants = st.text(min_size=1, max_size=300)


@given(tenants, tenants)
def test_two_tenants_never_share_a_topic(first: str, second: str) -> None:
    if first != second:
        assert encode_tenant(first) != encode_tenant(second)
        assert HISTORY.topic(first) is None or HISTORY.topic(first) != HISTORY.topic(second)


@given(tenants)
def test_a_tenant_s_topic_is_a_legal_name_its_template_s_pattern_matches(tenant: str) -> None:
    for template in (HISTORY, DEADLETTER, Template("x{tenant}.h")):
        topic = template.topic(tenant)
        if topic is None:
            assert len(template.prefix + encode_tenant(tenant) + template.suffix) > (
                MAX_TOPIC_CHARS)
            continue
        assert LEGAL.fullmatch(topic)
        assert re.match(template.pattern, topic)
    other = DEADLETTER.topic(tenant)
    assert other is None or not re.match(HISTORY.pattern, other)


def test_dots_and_underscores_are_escaped() -> None:
    assert encode_tenant("acme") == "acme"
    assert encode_tenant("a.b_c d") == "a_2Eb_5Fc_20d"
    assert encode_tenant("é") == "_C3_A9"


@pytest.mark.parametrize(("env", "message"), [
    ({"AGUI_HISTORY_TOPIC_TEMPLATE": HISTORY.text}, "set both"),
    ({**TEMPLATES, "AGUI_HISTORY_TOPIC_TEMPLATE": "agui.history"}, "exactly once"),
    ({**TEMPLATES, "AGUI_HISTORY_TOPIC_TEMPLATE": "{tenant}.history"}, "must start with"),
    ({**TEMPLATES, "AGUI_HISTORY_TOPIC_TEMPLATE": "agui/{tenant}"}, "may hold only"),
    ({**TEMPLATES, "AGUI_HISTORY_TOPIC_TEMPLATE": "agui.{tenant}x"}, "must start with '.'"),
    ({**TEMPLATES, "AGUI_DEADLETTER_TOPIC_TEMPLATE": HISTORY.text}, "are the same"),
    ({**TEMPLATES, "AGUI_DEADLETTER_TOPIC_TEMPLATE": "agui.history.dl.{tenant}"},
     "one starts the other"),
    ({**TEMPLATES, "AGUI_HISTORY_TOPIC_TEMPLATE": "agui.{tenant}",
      "AGUI_DEADLETTER_TOPIC_TEMPLATE": "dl.{tenant}"}, "is also a name the tenant"),
    ({**TEMPLATES, "AGUI_INPUT_PATTERN": r"agui\.history\..*"},
     "AGUI_INPUT_PATTERN matches"),
])
def test_unusable_templates_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_templates_are_off_by_default_and_read_when_set() -> None:
    assert Settings.from_env({}).tenant_templates is None
    templates = Settings.from_env(TEMPLATES).tenant_templates
    assert templates is not None and templates.both == (HISTORY, DEADLETTER)


# --- routing --------------------------------------------------------------------------

RECORD = Incoming("agui.events", 3, 42, 1_700_000_000_000, b"t1", b"{}", [])
ENCRYPTED = {"id": "m", "role": "reasoning", "content": "", "encryptedValue": "x"}


def builder(*existing: str) -> tuple[OutputBuilder, Metrics]:
    routing = TenantRouting(HISTORY, DEADLETTER)
    routing.learn(existing, {})
    metrics = Metrics()
    return OutputBuilder("agui.history", "agui.deadletter", 1_000_000, metrics, routing), metrics


def finished() -> Step:
    return Step("RUN_FINISHED", (Concluded(Outcome.SUCCESS, RunIdentity("t1", "r1"), [
        HistoryEntry("message", {"id": "u", "role": "user", "content": "q"}),
        HistoryEntry("message", ENCRYPTED)], None, None),))


def test_a_provisioned_tenant_s_outputs_go_to_its_own_topics() -> None:
    built, _ = builder("agui.history.acme", "agui.deadletter.acme", "agui.history.globex")
    assert {out.topic for out in built.build(finished(), RECORD, "acme")} == {
        "agui.history.acme"}
    failure = Step("x", (Failed(FailureCode.RUN_NOT_STARTED, "no", RunIdentity("t", "r")),))
    assert [out.topic for out in built.build(failure, RECORD, "acme")] == [
        "agui.deadletter.acme", "agui.history.acme"]


def test_a_tenant_without_its_topics_gets_one_dead_letter_in_the_shared_topic() -> None:
    # globex has a history topic but no dead-letter topic: not provisioned either.
    built, metrics = builder("agui.history.acme", "agui.deadletter.acme",
                             "agui.history.globex")
    out = built.build(finished(), RECORD, "globex")
    assert [record.topic for record in out] == ["agui.deadletter"]
    letter = orjson.loads(out[0].value)
    assert letter["code"] == WarningCode.TENANT_TOPIC_MISSING == "tenant_topic_missing"
    assert "agui.deadletter.globex" in letter["reason"]
    assert "agui.history.globex" not in letter["reason"]
    assert "create-topics --tenant" in letter["reason"]
    assert "3 history record(s)" in letter["reason"] and "1 encrypted" in letter["reason"]
    assert letter["tenant"] == "globex" and letter["runId"] == "r1"
    assert "event" not in letter and "raw" not in letter  # no tenant content shared
    assert metrics.encrypted_content_lost.labels("tenant_topic_missing")._value.get() == 1
    assert metrics.history_records._value.get() == 0
    # Nothing produced: nothing to say.
    assert built.build(Step("TEXT_MESSAGE_START", ()), RECORD, "globex") == []


def test_a_tenant_too_long_for_a_topic_is_not_routable() -> None:
    built, _ = builder()
    out = built.build(finished(), RECORD, "x" * 300)
    assert [record.topic for record in out] == ["agui.deadletter"]
    assert "too long for a topic name" in orjson.loads(out[0].value)["reason"]


def test_a_look_up_settles_a_tenant_until_the_next_refresh() -> None:
    routing = TenantRouting(HISTORY, DEADLETTER)
    routing.learn(["agui.history.acme", "agui.deadletter.acme", "unrelated"], {})
    assert routing.existing == {"agui.history.acme", "agui.deadletter.acme"}
    assert routing.settled("acme") and not routing.settled("globex")
    assert routing.settled("x" * 300)  # no name can give its topics: nothing to look up
    routing.looked_up("globex", ["agui.history.globex"], {})
    assert routing.settled("globex") and routing.missing("globex") == [
        "agui.deadletter.globex"]
    routing.learn(["agui.history.globex", "agui.deadletter.globex"], {})
    assert routing.settled("globex") and not routing.missing("globex")


def test_a_record_written_after_the_last_listing_needs_a_look_up() -> None:
    """An administrator provisions a tenant before its producer sends: a listing begun
    after a record was written has the tenant's topics if they exist, and one begun
    before may not (the tenant provisioned a moment after it)."""
    routing = TenantRouting(HISTORY, DEADLETTER)
    routing.learn(["agui.history.acme", "agui.deadletter.acme"], {("agui.events", 0): 10})
    assert not routing.needs_look_up("acme", ("agui.events", 0), 50)  # its topics exist
    assert routing.needs_look_up("hooli", ("agui.events", 0), 10)  # written after
    assert routing.needs_look_up("hooli", ("agui.events", 1), 0)  # partition never listed
    assert not routing.settled("hooli")  # asking does not settle it
    assert not routing.needs_look_up("initech", ("agui.events", 0), 9)  # written before
    assert routing.settled("initech") and routing.missing("initech")
    routing.looked_up("hooli", ["agui.history.hooli", "agui.deadletter.hooli"],
                      {("agui.events", 0): 40, ("agui.events", 1): 7})
    assert not routing.missing("hooli")
    assert not routing.needs_look_up("umbrella", ("agui.events", 1), 6)
    assert routing.needs_look_up("stark", ("agui.events", 1), 7)
    # A refresh forgets what was checked, not how far the listings reached.
    routing.learn(["agui.history.acme", "agui.deadletter.acme"], {("agui.events", 1): 9})
    assert routing.missing("hooli") and not routing.settled("initech")
    assert not routing.needs_look_up("initech", ("agui.events", 0), 39)


def test_the_tenants_checked_without_their_topics_are_bounded() -> None:
    routing = TenantRouting(HISTORY, DEADLETTER)
    routing.learn([], {("agui.events", 0): CHECKED_TENANTS + 2})
    for offset in range(CHECKED_TENANTS + 1):
        assert not routing.needs_look_up(f"t{offset}", ("agui.events", 0), offset)
    assert not routing.settled("t0")  # the oldest dropped: checked again when it comes
    assert routing.settled("t1") and routing.settled(f"t{CHECKED_TENANTS}")
