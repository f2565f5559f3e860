"""The conformance corpora the tests run, and how to load them.

Two corpora share one format (tests/conformance/README.md):

* the repository's own, `tests/conformance/`, which every clone carries and
  every run checks;
* the external one, `../shared/conformance` next to the repository's root,
  which developers and CI have and a user's clone does not. It runs when its
  directory exists; otherwise its tests are skipped, saying why. The
  `AGUI_EXTERNAL_CORPUS` environment variable points at another location
  (for instance a directory that does not exist, to check the skip).

`tests/engine/test_conformance.py` (the offline checker) and
`tests/runtime/test_service_conformance.py` (a worker on a real broker) both load
their cases from here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

Runs = list[dict[str, Any]]

EXTERNAL_ENV = "AGUI_EXTERNAL_CORPUS"
_REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Corpus:
    label: str  # the first part of each case's test id
    root: Path
    shown: str  # how messages name the directory

    def present(self) -> bool:
        return self.root.is_dir()

    @property
    def cases_dir(self) -> Path:
        return self.root / "cases"

    @cached_property
    def expected(self) -> dict[str, Runs]:
        """Case name -> expected runs.

        The in-repo file maps a name straight to its list of runs; the external
        one wraps the list as `{"runs": [...], "note": "..."}`. Both load the same.
        An external case whose expectation AG-UI 1.1 superseded (`SUPERSEDED`) is
        checked against the 1.1 result instead.
        """
        entries = json.loads((self.root / "expected.json").read_text(encoding="utf-8"))
        expected = {
            name: entry["runs"] if isinstance(entry, dict) else entry
            for name, entry in entries.items()
        }
        if self.label == "external":
            for name, (_why, runs) in SUPERSEDED.items():
                if name in expected:
                    expected[name] = runs
        return expected

    def case_files(self) -> set[str]:
        return {path.stem for path in self.cases_dir.glob("*.jsonl")}

    def cases(self) -> list[Case]:
        return [Case(self, name, runs) for name, runs in sorted(self.expected.items())]


# The external corpus was written for AG-UI 1.0; where the normative 1.1 specification
# reads otherwise, the specification wins (docs/rules.md). Each case so superseded,
# with why and the result 1.1 gives it.
SUPERSEDED: dict[str, tuple[str, Runs]] = {
    "newer-producer-material-stripped": (
        "1.1 is the current protocol version: a producer declaring it is not newer"
        " (AG-UI 1.1, basic/versioning)",
        [{"outcome": "finished", "failure": None,
          "warnings": [{"code": "unknown_field", "line": 2},
                       {"code": "unknown_field", "line": 2},
                       {"code": "unknown_event_type", "line": 3},
                       {"code": "unknown_member", "line": 8}],
          "lostEncrypted": [], "messages": [{"id": "rm4", "role": "reasoning", "content": "x"}],
          "ending": "success"}]),
}


@dataclass(frozen=True)
class Case:
    corpus: Corpus
    name: str
    runs: Runs

    @property
    def path(self) -> Path:
        return self.corpus.cases_dir / f"{self.name}.jsonl"

    @property
    def id(self) -> str:
        return f"{self.corpus.label}/{self.name}"

    def lines(self) -> list[bytes]:
        """The record values, one per line (a final newline ends the last one)."""
        lines = self.path.read_bytes().split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        return lines


def _external() -> Corpus:
    override = os.environ.get(EXTERNAL_ENV, "").strip()
    if override:
        return Corpus("external", Path(override).resolve(), override)
    return Corpus("external", _REPO_ROOT.parent / "shared" / "conformance",
                  "../shared/conformance")


IN_REPO = Corpus("in-repo", _REPO_ROOT / "tests" / "conformance", "tests/conformance/")
EXTERNAL = _external()
EXTERNAL_SKIP_REASON = (
    f"external corpus {EXTERNAL.shown} not present; the in-repo corpus {IN_REPO.shown} still runs"
)
_SKIP_EXTERNAL = pytest.mark.skip(reason=EXTERNAL_SKIP_REASON)


def case_params() -> list[Any]:
    """One pytest param per case of both corpora.

    Without the external corpus its cases cannot be listed, so a single
    skipped param stands for them and reports the reason.
    """
    params = [pytest.param(case, id=case.id) for case in IN_REPO.cases()]
    if EXTERNAL.present():
        params += [pytest.param(case, id=case.id) for case in EXTERNAL.cases()]
    else:
        params.append(pytest.param(None, id=EXTERNAL.label, marks=_SKIP_EXTERNAL))
    return params


def corpus_params() -> list[Any]:
    """One pytest param per corpus; the external one is skipped when absent."""
    return [
        pytest.param(IN_REPO, id=IN_REPO.label),
        pytest.param(EXTERNAL, id=EXTERNAL.label,
                     marks=() if EXTERNAL.present() else _SKIP_EXTERNAL),
    ]
