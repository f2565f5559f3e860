"""The service's content store on a table (a dict stands in for the Faust table)."""

from __future__ import annotations

import pytest

from processors.table_content import FragmentConflict, Source, TableContentStore

KEY = b"tenant\x00thread-1"
SOURCE = Source("events", 3, 41)


def test_fragments_join_by_slot_and_clear_removes_them() -> None:
    table: dict[bytes, bytes] = {}
    store = TableContentStore(table, KEY)
    store.fragments(1).append("thought 0 ")
    store.fragments(2).append("answer")
    store.fragments(1).append("thought 1")
    store.record_applied(SOURCE)
    assert store.texts() == {1: "thought 0 thought 1", 2: "answer"}
    restored = TableContentStore(table, KEY)  # from the progress entry
    assert restored.texts() == store.texts() and restored.already_applied(SOURCE)
    restored.clear()
    restored.record_applied(Source("events", 3, 42))
    assert list(table) == [KEY + b"\x02"]  # only the progress entry is left


def test_a_stale_progress_entry_fails_instead_of_overwriting_text() -> None:
    table: dict[bytes, bytes] = {}
    store = TableContentStore(table, KEY)
    store.record_applied(SOURCE)  # progress: no fragment yet
    stale = dict(table)
    store.fragments(0).append("secret thought 0")
    store.fragments(0).append("secret thought 1")
    store.record_applied(Source("events", 3, 43))
    # The fragments came back but the progress entry did not: count 0 again.
    table[KEY + b"\x02"] = stale[KEY + b"\x02"]
    behind = TableContentStore(table, KEY)
    with pytest.raises(FragmentConflict) as conflict:
        behind.fragments(0).append("thought 2")
    assert "secret" not in str(conflict.value)
    assert behind.texts() == {}  # nothing was overwritten, nothing counted
    behind.clear()  # the run is failed: its fragments go, those past the count too
    assert list(table) == [KEY + b"\x02"]
