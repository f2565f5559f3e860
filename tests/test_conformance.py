"""The conformance corpus (../shared/conformance), run through the checker.

Every case is fed through `processors.checker.check_records` (the engine the
service uses) and compared exactly as the corpus README says: outcome and
failure exactly, warnings and lostEncrypted as multisets, messages as JSON
values in order. The console script is exercised on a few cases too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import Message
from pydantic import TypeAdapter

from processors.checker import CheckTotals, check_records, read_records

CORPUS = Path(__file__).parents[1].parent / "shared" / "conformance"
CASES = CORPUS / "cases"
EXPECTED: dict[str, Any] = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))
CLI = Path(sys.executable).with_name("agui-stream")
MESSAGE = TypeAdapter(Message)


def run_case(name: str) -> list[dict[str, Any]]:
    with (CASES / f"{name}.jsonl").open("rb") as stream:
        return [r.as_json() for r in check_records(read_records(stream), CheckTotals())]


def _multiset(entries: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(e, sort_keys=True) for e in entries)


def assert_matches(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(actual) == len(expected), (actual, expected)
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        where = f"run {index}"
        assert got["outcome"] == want["outcome"], where
        assert got["failure"] == want["failure"], where
        assert _multiset(got["warnings"]) == _multiset(want["warnings"]), where
        assert _multiset(got["lostEncrypted"]) == _multiset(want["lostEncrypted"]), where
        assert got["messages"] == want["messages"], where


def assert_ag_ui_messages(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        MESSAGE.validate_python(message)
        assert None not in message.values(), message  # optional keys absent, never null
        for call in message.get("toolCalls", ()):
            assert None not in call.values(), call


def test_corpus_is_complete() -> None:
    files = {p.stem for p in CASES.glob("*.jsonl")}
    assert files == set(EXPECTED)
    assert len(files) == 47


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case(name: str) -> None:
    actual = run_case(name)
    assert_matches(actual, EXPECTED[name]["runs"])
    for run in actual:
        if run["outcome"] in ("finished", "error"):
            assert_ag_ui_messages(run["messages"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expected_messages_parse_with_ag_ui(name: str) -> None:
    for run in EXPECTED[name]["runs"]:
        assert_ag_ui_messages(run["messages"])


# --- the console script ----------------------------------------------------------


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    assert CLI.exists(), CLI
    return subprocess.run([str(CLI), *args], input=stdin, capture_output=True, timeout=60,
                          check=False)


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("span-message-encrypted-basic", 0),
        ("snapshot-unknown-role-dropped", 0),
        ("run-failed-loses-held-values", 1),
        ("event-after-run-finished", 1),
        ("multiple-runs-one-key", 0),
    ],
)
def test_cli_json(name: str, code: int) -> None:
    done = cli("check", str(CASES / f"{name}.jsonl"), "--json")
    assert done.returncode == code, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"runs"}
    assert_matches(report["runs"], EXPECTED[name]["runs"])


def test_cli_stdin() -> None:
    data = (CASES / "chunk-basic.jsonl").read_bytes()
    done = cli("check", "-", "--json", stdin=data)
    assert done.returncode == 0, done.stderr
    assert_matches(json.loads(done.stdout)["runs"], EXPECTED["chunk-basic"]["runs"])


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
    done = cli("check", str(CASES / "run-failed-loses-held-values.jsonl"))
    assert done.returncode == 1
    out = done.stdout.decode()
    assert "FAILED" in out
    assert "failure at line 11: message_not_open" in out
    assert "warning at line" in out and "encrypted_value_unknown_entity" in out
    assert "run_failed" in out and "unknown_entity" in out
    # Confidentiality: the report never shows encrypted values.
    text = (CASES / "run-failed-loses-held-values.jsonl").read_text(encoding="utf-8")
    for line in text.splitlines():
        event = json.loads(line)
        if "encryptedValue" in event:
            assert event["encryptedValue"] not in out


def test_cli_human_report_outcomes() -> None:
    done = cli("check", str(CASES / "multiple-runs-one-key.jsonl"))
    assert done.returncode == 0
    out = done.stdout.decode()
    assert "ERROR" in out and "FINISHED, 1 message(s)" in out and "OPEN" in out
    done = cli("check", str(CASES / "newer-producer-material-stripped.jsonl"))
    assert done.returncode == 0
    out = done.stdout.decode()
    for code in ("protocol_version", "unknown_event_type", "unknown_field", "unknown_member"):
        assert code in out
