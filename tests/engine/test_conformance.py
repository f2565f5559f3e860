"""The conformance corpora, run through the checker.

Two corpora (tests/corpora.py): the repository's own, tests/conformance/,
always; the shared one, ../shared/conformance, when that directory exists
(otherwise its tests are skipped with the reason). Every case is fed through
`processors.tools.checker.check_records` (the engine the service uses) and compared
as tests/conformance/README.md says, on the keys each expected entry lists:
outcome, failure and the AG-UI 1.1 keys (ending, pendingToolCallIds, interrupts,
lateError, inputEchoed, updates) exactly, warnings and lostEncrypted as
multisets, messages as JSON values in order, each message parsing with the
ag-ui-protocol models. The in-repo corpus must cover every failure, warning and
loss code the checker can produce, and every run ending but `abandoned`. The
command line is exercised on a few in-repo cases too, and the reading of records
from a file.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import pytest
from ag_ui.core import Message
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from processors.engine.codes import FailureCode, LossReason, WarningCode
from processors.tools.checker import CheckTotals, check_records, read_records
from tests.corpora import EXTERNAL, EXTERNAL_SKIP_REASON, IN_REPO, Case, case_params
from topics.records import RunOutcome

CASES = IN_REPO.cases_dir
EXPECTED = IN_REPO.expected
REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGE = TypeAdapter(Message)
README = (IN_REPO.root / "README.md").read_text(encoding="utf-8")

# Codes no single key's records can make the checker produce; the in-repo
# README says why and where they are tested instead.
NOT_IN_CORPUS = {
    FailureCode.RUN_ABANDONED,  # the service's idle timeout; the checker never abandons
    LossReason.RUN_ABANDONED,
    WarningCode.NOT_STORABLE,  # the service's history sink refusing a record
    LossReason.NOT_STORABLE,
    # Limits of a deployment, far above any case (tests/processing/test_bounds.py),
    # and the tenant limit, which needs more keys than a case's one.
    FailureCode.RUN_EVENT_LIMIT,
    FailureCode.RUN_CONTENT_LIMIT,
    FailureCode.RUN_ITEM_LIMIT,
    FailureCode.TENANT_OPEN_RUN_LIMIT,
    # Per-tenant topics: a deployment's topics, not a stream's content.
    WarningCode.TENANT_TOPIC_MISSING,
    LossReason.TENANT_TOPIC_MISSING,
}


# The keys every in-repo entry lists (the 1.0 shape), and the ones AG-UI 1.1 added
# (tests/conformance/README.md): an entry lists those that matter for its case.
BASE_KEYS = ("outcome", "failure", "warnings", "lostEncrypted", "messages")
KEYS_1_1 = ("ending", "pendingToolCallIds", "interrupts", "lateError", "inputEchoed", "updates")
MULTISET_KEYS = {"warnings", "lostEncrypted"}
# Endings the corpus cannot show: `abandoned` is the service's idle timeout, a clock.
ENDINGS_NOT_IN_CORPUS = {"abandoned"}


def run_case(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as stream:
        # Every report first, then their JSON: a late RUN_ERROR changes the entry of
        # the run it follows, which the checker has already yielded.
        reports = list(check_records(read_records(stream), CheckTotals()))
    return [report.as_json() for report in reports]


def _multiset(entries: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(e, sort_keys=True) for e in entries)


def _actual(got: dict[str, Any], key: str) -> Any:
    """An entry's value for `key`; the checker leaves out the 1.1 keys that do not
    apply (absent is compared as null, and absent `updates` as an empty list)."""
    if key == "updates":
        return got.get(key) or []
    return got.get(key)


def assert_matches(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Entries in order, each compared on the keys its expected entry lists.

    A listed `null` asks for the key to be absent (or null): `"ending": null` on a
    record that failed on its own outside any run, for instance.
    """
    assert len(actual) == len(expected), (actual, expected)
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        where = f"run {index}"
        unknown = set(want) - set(BASE_KEYS) - set(KEYS_1_1)
        assert not unknown, (where, unknown)  # a misspelt key would compare nothing
        for key, wanted in want.items():
            if key in MULTISET_KEYS:
                assert _multiset(_actual(got, key) or []) == _multiset(wanted), (where, key)
            elif key == "updates":
                assert _actual(got, key) == (wanted or []), (where, key)
            else:
                assert _actual(got, key) == wanted, (where, key)


def assert_ag_ui_messages(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        MESSAGE.validate_python(message)
        assert None not in message.values(), message  # optional keys absent, never null
        for call in message.get("toolCalls", ()):
            assert None not in call.values(), call


# --- the corpora ------------------------------------------------------------------


def test_in_repo_corpus_is_complete() -> None:
    files = IN_REPO.case_files()
    assert files == set(EXPECTED)
    stated = re.search(r"It holds (\d+) cases\.", README)
    assert stated is not None and int(stated.group(1)) == len(files)
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", README, re.M))
    assert listed == files  # every case has its line in the README's tables


def test_in_repo_entries_list_the_base_keys() -> None:
    # The in-repo corpus always states the 1.0 facts; the 1.1 keys are optional.
    for name, runs in EXPECTED.items():
        for index, run in enumerate(runs):
            assert tuple(run)[:len(BASE_KEYS)] == BASE_KEYS, (name, index)
            assert set(run) <= set(BASE_KEYS) | set(KEYS_1_1), (name, index)


def test_in_repo_corpus_covers_every_code() -> None:
    failures = {r["failure"]["code"] for runs in EXPECTED.values() for r in runs if r["failure"]}
    warnings = {w["code"] for runs in EXPECTED.values() for r in runs for w in r["warnings"]}
    losses = {x["reason"] for runs in EXPECTED.values() for r in runs
              for x in r["lostEncrypted"]}
    assert failures == {c.value for c in FailureCode} - {c.value for c in NOT_IN_CORPUS}
    assert warnings == {c.value for c in WarningCode} - {c.value for c in NOT_IN_CORPUS}
    assert losses == {c.value for c in LossReason} - {c.value for c in NOT_IN_CORPUS}
    for code in NOT_IN_CORPUS:
        assert f"`{code.value}`" in README, code  # the README says why it is left out


def test_in_repo_corpus_covers_every_ending() -> None:
    endings = {r["ending"] for runs in EXPECTED.values() for r in runs if r.get("ending")}
    assert endings == set(get_args(RunOutcome)) - ENDINGS_NOT_IN_CORPUS
    for ending in ENDINGS_NOT_IN_CORPUS:
        assert f"`{ending}`" in README, ending


@pytest.mark.parametrize("case", case_params())
def test_expected_updates_are_well_formed(case: Case) -> None:
    # Continuations carry only what a run added, so they are not whole AG-UI
    # messages; each still names the message it continues and that message's role.
    for run in case.runs:
        for update in run.get("updates") or []:
            if update["kind"] == "removal":
                assert set(update) == {"kind", "messageId"}, update
                assert isinstance(update["messageId"], str), update
            else:
                assert update["kind"] == "continuation", update
                assert set(update) == {"kind", "message"}, update
                message = update["message"]
                assert isinstance(message["id"], str) and isinstance(message["role"], str), update
                assert None not in message.values(), update


@pytest.mark.skipif(not EXTERNAL.present(), reason=EXTERNAL_SKIP_REASON)
def test_external_corpus_is_complete() -> None:
    files = EXTERNAL.case_files()
    assert files == set(EXTERNAL.expected)
    assert len(files) == 47


@pytest.mark.parametrize("case", case_params())
def test_case(case: Case) -> None:
    actual = run_case(case.path)
    assert_matches(actual, case.runs)
    for run in actual:
        if run["outcome"] in ("finished", "error"):
            assert_ag_ui_messages(run["messages"])


@pytest.mark.parametrize("case", case_params())
def test_expected_messages_parse_with_ag_ui(case: Case) -> None:
    for run in case.runs:
        assert_ag_ui_messages(run["messages"])


# --- the console script ----------------------------------------------------------


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # What the console script runs, from this checkout: the installed script
    # may import another checkout's code (an editable install).
    return subprocess.run([sys.executable, "-m", "processors.tools.cli", *args], input=stdin,
                          capture_output=True, timeout=60, check=False, cwd=REPO_ROOT)


class SmallReads(io.BytesIO):
    """A stream whose reads return at most `size` bytes, whatever is asked."""

    def __init__(self, data: bytes, size: int) -> None:
        super().__init__(data)
        self.size = size

    def read(self, size: int | None = -1, /) -> bytes:
        return super().read(self.size)

    def read1(self, size: int | None = -1, /) -> bytes:
        return super().read1(self.size)


@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=8),
       st.booleans(), st.integers(1, 9))
def test_read_records_splits_lines_across_reads(
    lines: list[bytes], final_newline: bool, read_size: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    one_line_at_a_time = [line.removesuffix(b"\n") for line in io.BytesIO(data)]
    assert list(read_records(SmallReads(data, read_size))) == one_line_at_a_time


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("reasoning-span-encrypted-answer", 0),
        ("snapshot-unknown-members-and-fields", 0),
        ("lost-run-failed-counts-held-values", 1),
        ("lifecycle-events-after-terminal", 1),
        ("lifecycle-error-first-then-finished-then-open", 0),
    ],
)
def test_cli_json(name: str, code: int) -> None:
    done = cli("check", str(CASES / f"{name}.jsonl"), "--json")
    assert done.returncode == code, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"runs"}
    assert_matches(report["runs"], EXPECTED[name])


def test_cli_stdin() -> None:
    data = (CASES / "chunk-reasoning-then-text-same-lane.jsonl").read_bytes()
    done = cli("check", "-", "--json", stdin=data)
    assert done.returncode == 0, done.stderr
    assert_matches(json.loads(done.stdout)["runs"],
                   EXPECTED["chunk-reasoning-then-text-same-lane"])


def test_cli_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    done = cli("check", str(missing), "--json")
    assert done.returncode == 2
    assert done.stdout == b""
    stderr = done.stderr.decode()
    assert "cannot read" in stderr and str(missing) in stderr
    assert "Traceback" not in stderr


def test_cli_usage_error() -> None:
    done = cli("check")
    assert done.returncode == 2
    assert b"usage" in done.stderr.lower()


def test_cli_human_report_failure() -> None:
    done = cli("check", str(CASES / "lost-run-failed-counts-held-values.jsonl"))
    assert done.returncode == 1
    out = done.stdout.decode()
    assert "FAILED" in out
    assert "failure at line 12: malformed_event" in out
    assert "warning at line" in out and "encrypted_value_unknown_entity" in out
    assert "run_failed" in out and "unknown_entity" in out
    # Confidentiality: the report never shows encrypted values.
    text = (CASES / "lost-run-failed-counts-held-values.jsonl").read_text(encoding="utf-8")
    for line in text.splitlines():
        event = json.loads(line)
        if "encryptedValue" in event:
            assert event["encryptedValue"] not in out


def test_cli_human_report_outcomes() -> None:
    done = cli("check", str(CASES / "lifecycle-error-first-then-finished-then-open.jsonl"))
    assert done.returncode == 0
    out = done.stdout.decode()
    assert "ERROR" in out and "FINISHED, 1 message(s)" in out and "OPEN" in out
    done = cli("check", str(CASES / "protocol-version-and-unknown-material.jsonl"))
    assert done.returncode == 0
    out = done.stdout.decode()
    for code in ("protocol_version", "unknown_event_type", "unknown_field", "unknown_member"):
        assert code in out
