"""A key's streamed text and its progress, kept in a Faust table.

Keys are `<state key> 0x01 <fragment number>` for the deltas of the active
run, and `<state key> 0x02` for the key's progress: how many fragments the run
has and which input record was applied last. Applying one record writes its
fragment (if it carried a delta) and the small progress entry, never the text
that came before; concluding the run deletes the fragments.

The progress entry is what makes applying records idempotent: it commits in
the same transaction as the record's state and outputs, so a record at or
below it was applied and its outputs published. A worker that restarts from
an older committed offset (the offset fetch can race the commit of the
transaction a killed worker had in flight) skips such records instead of
publishing their history again.
"""

from __future__ import annotations

import struct
from collections.abc import MutableMapping
from dataclasses import dataclass

_FRAGMENT = b"\x01"
_PROGRESS = b"\x02"
_SLOT = struct.Struct(">I")
_NUMBER = struct.Struct(">Q")
_PROGRESS_VALUE = struct.Struct(">QqI")  # fragments, last offset, source partition


@dataclass(frozen=True, slots=True)
class Source:
    """Where an input record came from."""

    topic: str
    partition: int
    offset: int


class FragmentConflict(RuntimeError):
    """A fragment number to be written is already taken (inconsistent stored state)."""


class TableContentStore:
    __slots__ = ("_applied", "_count", "_prefix", "_table")

    def __init__(self, table: MutableMapping[bytes, bytes], state_key: bytes) -> None:
        self._table = table
        self._prefix = state_key
        stored = table.get(state_key + _PROGRESS)
        self._count = 0
        self._applied: Source | None = None
        if stored is not None:
            self._count, offset, partition = _PROGRESS_VALUE.unpack_from(stored)
            topic = stored[_PROGRESS_VALUE.size:].decode()
            self._applied = Source(topic, partition, offset)

    def fragments(self, slot: int) -> SlotFragments:
        return SlotFragments(self, slot)

    def append(self, slot: int, text: str) -> None:
        """Write the next fragment of `slot`: one table entry.

        A run's fragments are numbered from 0 and all removed when it
        concludes, so the next number is never stored yet. If it is, the
        progress entry is behind the fragments (the state came back
        inconsistent) and writing would overwrite text: fail instead.
        """
        key = self._fragment_key(self._count)
        if key in self._table:
            raise FragmentConflict(
                f"fragment {self._count} of the key's run is already stored:"
                " the key's progress entry is behind its fragments")
        self._table[key] = _SLOT.pack(slot) + text.encode("utf-8", "surrogatepass")
        self._count += 1

    def texts(self) -> dict[int, str]:
        parts: dict[int, list[bytes]] = {}
        for index in range(self._count):
            entry = self._table[self._fragment_key(index)]
            parts.setdefault(_SLOT.unpack_from(entry)[0], []).append(entry[_SLOT.size:])
        return {
            slot: b"".join(chunks).decode("utf-8", "surrogatepass")
            for slot, chunks in parts.items()
        }

    def clear(self) -> None:
        index = 0
        # Past the count too, up to the first gap: fragments a stale count did
        # not cover (FragmentConflict).
        while self._table.pop(self._fragment_key(index), None) is not None or index < self._count:
            index += 1
        self._count = 0

    def _fragment_key(self, index: int) -> bytes:
        return self._prefix + _FRAGMENT + _NUMBER.pack(index)

    def already_applied(self, source: Source) -> bool:
        applied = self._applied
        return (applied is not None and applied.topic == source.topic
                and applied.partition == source.partition and source.offset <= applied.offset)

    def record_applied(self, source: Source) -> None:
        self._applied = source
        self._table[self._prefix + _PROGRESS] = (
            _PROGRESS_VALUE.pack(self._count, source.offset, source.partition)
            + source.topic.encode()
        )

    def forget(self) -> None:
        """The key's state is freed: drop its fragments and its progress."""
        self.clear()
        self._table.pop(self._prefix + _PROGRESS, None)
        self._applied = None


class SlotFragments:
    """One slot's fragments in a `TableContentStore` (each append is a table entry)."""

    __slots__ = ("_slot", "_store")

    def __init__(self, store: TableContentStore, slot: int) -> None:
        self._store = store
        self._slot = slot

    def append(self, text: str, /) -> None:
        self._store.append(self._slot, text)
