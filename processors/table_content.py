"""A `ContentStore` kept in a Faust table: one small entry per delta.

Keys are `<state key> 0x01 <fragment number>`; a counter entry
`<state key> 0x02` says how many fragments the active run has. Appending one
delta therefore writes one fragment and one 8-byte counter to the changelog,
never the text that came before; concluding the run deletes them.
"""

from __future__ import annotations

import struct
from collections.abc import MutableMapping

_FRAGMENT = b"\x01"
_COUNTER = b"\x02"
_SLOT = struct.Struct(">I")
_NUMBER = struct.Struct(">Q")


class TableContentStore:
    __slots__ = ("_count", "_prefix", "_table")

    def __init__(self, table: MutableMapping[bytes, bytes], state_key: bytes) -> None:
        self._table = table
        self._prefix = state_key
        stored = table.get(state_key + _COUNTER)
        self._count = 0 if stored is None else _NUMBER.unpack(stored)[0]

    def append(self, slot: int, text: str) -> None:
        index = self._count
        self._table[self._prefix + _FRAGMENT + _NUMBER.pack(index)] = (
            _SLOT.pack(slot) + text.encode("utf-8", "surrogatepass")
        )
        self._count = index + 1
        self._table[self._prefix + _COUNTER] = _NUMBER.pack(self._count)

    def texts(self) -> dict[int, str]:
        parts: dict[int, list[bytes]] = {}
        for index in range(self._count):
            entry = self._table[self._prefix + _FRAGMENT + _NUMBER.pack(index)]
            parts.setdefault(_SLOT.unpack_from(entry)[0], []).append(entry[_SLOT.size:])
        return {
            slot: b"".join(chunks).decode("utf-8", "surrogatepass")
            for slot, chunks in parts.items()
        }

    def clear(self) -> None:
        for index in range(self._count):
            self._table.pop(self._prefix + _FRAGMENT + _NUMBER.pack(index), None)
        if self._count:
            self._table.pop(self._prefix + _COUNTER, None)
        self._count = 0
