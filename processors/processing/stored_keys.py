"""How a run key's state and streamed text are persisted, write-behind.

A key is stored as a `run-state` entry and, while a run is active, a few
`run-text` chunks:

* the state (engine state, the partition the key lives on, how many text
  chunks the run had stored when it was written, and the replay guard: the
  last input record applied to the key) is stored at most once per commit,
  and only when the engine state changed or no chunk carries the newer guard.
  It goes in the state entry (`state_key`), or, when the commit writes a text
  chunk and the entry's count allows it (below), inside that chunk: a run
  that starts and streams in the same commit then writes one record, not two;
* a text chunk (`state_key 0x01 <n>`) holds every fragment the key's run
  received between two commits, as (slot, text) pairs, and the replay guard of
  its commit. Chunks are only ever appended, never rewritten, so the changelog
  stays linear in the input; a commit of deltas only writes only its chunk.
  The run's chunks are deleted when it concludes;
* which state is the newest follows from the entry's chunk count: a state in
  chunk n is newer than the entry when n >= the count (those chunks were
  written after it), and the chunks past the newest state's count carry
  newer guards (the last one's is the key's). So a state goes into chunk n
  only when the stored entry's count is at most n; otherwise the entry is
  rewritten;
* a state entry larger than the changelog takes (a run holding hundreds of
  encrypted values) is stored split: a head entry in the state table and the
  engine state in parts (`state_key 0x03 <n>`) beside the chunks.

The state and the chunks of one commit go out in the source partition's
transaction with the input offsets, so a crash replays onto exactly the state
those offsets produced, and the replay guard skips records already applied.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from processors.engine.content import InMemoryContentStore
from processors.engine.state import KeyState

_FORMAT = 2  # first byte of a state entry; anything else is not ours to read
_SPLIT_FORMAT = 3  # first byte of a split state entry's head
_STATE_HEADER = struct.Struct(">BIqIH")  # format, partition, applied offset, chunks, topic length
_PART_COUNT = struct.Struct(">I")  # after a head's topic: how many parts hold the engine state
_CHUNK_MARK = b"\x01"
_PART_MARK = b"\x03"
_CHUNK_NUMBER = struct.Struct(">I")
_FRAGMENT_HEADER = struct.Struct(">II")  # slot, byte length
_GUARDED = 1  # first byte of a chunk carrying its replay guard (before: a slot's high byte, 0)
_GUARDED_WITH_STATE = 2  # ... and, after the guard, the key's state entry
_GUARD_HEADER = struct.Struct(">BqH")  # mark, applied offset, topic length
_STATE_SIZE = struct.Struct(">I")  # the size of the state entry a chunk carries


class UndecodableState(ValueError):
    """A stored state entry this version cannot read."""


class Applied(NamedTuple):
    """The last input record applied to a key (the replay guard)."""

    topic: str
    offset: int


@dataclass(slots=True)
class StoredKey:
    """A decoded state entry."""

    partition: int
    applied: Applied | None
    chunks: int
    state: KeyState


def _guard_fields(applied: Applied | None) -> tuple[int, bytes]:
    """A replay guard as stored: its offset (-1: none) and its topic."""
    return (-1, b"") if applied is None else (applied.offset, applied.topic.encode())


def _guard_of(offset: int, topic: bytes) -> Applied | None:
    return None if offset < 0 else Applied(topic.decode(), offset)


def encode_state(partition: int, applied: Applied | None, chunks: int, body: bytes) -> bytes:
    """A state entry; `body` is the engine state's JSON (`KeyState.to_json`)."""
    offset, topic = _guard_fields(applied)
    return _STATE_HEADER.pack(_FORMAT, partition, offset, chunks, len(topic)) + topic + body


def decode_state(value: bytes) -> StoredKey:
    """The stored key, or `UndecodableState` for any value this code did not write."""
    try:
        version, partition, offset, chunks, topic_size = _STATE_HEADER.unpack_from(value)
        if version != _FORMAT:
            raise UndecodableState(f"state format {version}")
        start = _STATE_HEADER.size + topic_size
        applied = _guard_of(offset, value[_STATE_HEADER.size:start])
        state = KeyState.from_json(value[start:])
    except UndecodableState:
        raise
    except Exception as error:  # any corruption: a short value, bad JSON, wrong shapes
        raise UndecodableState(type(error).__name__) from None
    return StoredKey(partition, applied, chunks, state)


def holds_body(value: bytes | None, body: bytes) -> bool:
    """Whether the whole state entry `value` holds `body` as its engine state (compared
    in place: a cached key keeps no second copy of its state)."""
    if value is None or len(value) < _STATE_HEADER.size or value[0] != _FORMAT:
        return False
    start = _STATE_HEADER.size + _STATE_HEADER.unpack_from(value)[4]
    return len(value) - start == len(body) and value.endswith(body)


def split_state(value: bytes, limit: int) -> tuple[bytes, list[bytes]]:
    """A state entry as stored: `(value, [])` when it is within `limit` bytes, else a
    head and the engine state in parts of at most `limit` bytes (`state_part_key`).

    One commit writes the head and all its parts, so a restore never sees a mix.
    """
    if len(value) <= limit:
        return value, []
    start = _STATE_HEADER.size + _STATE_HEADER.unpack_from(value)[4]
    size = max(limit, 1)
    parts = [value[at:at + size] for at in range(start, len(value), size)]
    head = bytes([_SPLIT_FORMAT]) + value[1:start] + _PART_COUNT.pack(len(parts))
    return head, parts


def state_parts(stored: bytes) -> int:
    """How many parts a stored state entry names (0: it holds its engine state)."""
    if len(stored) < _STATE_HEADER.size or stored[0] != _SPLIT_FORMAT:
        return 0
    try:
        start = _STATE_HEADER.size + _STATE_HEADER.unpack_from(stored)[4]
        return int(_PART_COUNT.unpack_from(stored, start)[0])
    except struct.error:
        raise UndecodableState("truncated state head") from None


def join_state(state_key: bytes, stored: bytes, texts: Mapping[bytes, bytes]) -> bytes:
    """The whole state entry of a stored one: a split entry's parts joined again."""
    count = state_parts(stored)
    if count == 0:
        return stored
    start = len(stored) - _PART_COUNT.size
    try:
        parts = [texts[state_part_key(state_key, number)] for number in range(count)]
    except KeyError:
        raise UndecodableState("missing state part") from None
    return bytes([_FORMAT]) + stored[1:start] + b"".join(parts)


def state_part_key(state_key: bytes, number: int) -> bytes:
    return state_key + _PART_MARK + _CHUNK_NUMBER.pack(number)


def partition_of(value: bytes) -> int | None:
    """The partition a state entry belongs to (None: unreadable)."""
    if len(value) >= _STATE_HEADER.size and value[0] in (_FORMAT, _SPLIT_FORMAT):
        return int(_STATE_HEADER.unpack_from(value)[1])
    if decode_legacy_state(value) is not None:
        return int(_LEGACY_PARTITION.unpack_from(value)[0])
    return None


# The encoding before write-behind: a state entry was the partition (u32) and the
# engine state; the text table held each fragment (`state_key 0x01 <u64 n>`) and a
# progress entry (`state_key 0x02`: fragment count, last offset, partition, topic).
_LEGACY_PARTITION = struct.Struct(">I")
_LEGACY_PROGRESS_MARK = b"\x02"
_LEGACY_PROGRESS = struct.Struct(">QqI")
_LEGACY_FRAGMENT_NUMBER = struct.Struct(">Q")


def decode_legacy_state(value: bytes) -> KeyState | None:
    """The engine state of a state entry in the encoding before write-behind, or None."""
    if len(value) <= _LEGACY_PARTITION.size or value[0] in (_FORMAT, _SPLIT_FORMAT):
        return None
    try:
        return KeyState.from_json(value[_LEGACY_PARTITION.size:])
    except Exception:  # not that encoding either
        return None


def legacy_text_keys(state_key: bytes, texts: Mapping[bytes, bytes]) -> list[bytes]:
    """The text entries the encoding before write-behind left for a key (to delete)."""
    progress_key = state_key + _LEGACY_PROGRESS_MARK
    progress = texts.get(progress_key)
    if progress is None:
        return []
    try:
        count = int(_LEGACY_PROGRESS.unpack_from(progress)[0])
    except struct.error:
        count = 0
    return [progress_key, *(state_key + _CHUNK_MARK + _LEGACY_FRAGMENT_NUMBER.pack(number)
                            for number in range(count))]


def chunk_key(state_key: bytes, number: int) -> bytes:
    return state_key + _CHUNK_MARK + _CHUNK_NUMBER.pack(number)


_FIRST_CHUNK_SUFFIX = _CHUNK_MARK + _CHUNK_NUMBER.pack(0)


def first_chunk_owner(text_key: bytes) -> bytes | None:
    """The state key whose first chunk `text_key` is (None: it is not a first chunk)."""
    if text_key.endswith(_FIRST_CHUNK_SUFFIX):
        return text_key[:-len(_FIRST_CHUNK_SUFFIX)]
    return None


def encode_chunks(fragments: list[tuple[int, str]], limit: int, guard: Applied | None,
                  state: bytes | None = None) -> list[bytes]:
    """The fragments as chunks of at most `limit` bytes each (a record the changelog
    takes), in order, each carrying the replay guard, the first one `state` (a
    state entry) if given: a slot's text too long for one is split between
    characters into consecutive fragments, which `restore` joins again."""
    offset, topic = _guard_fields(guard)
    header = _GUARD_HEADER.pack(_GUARDED, offset, len(topic)) + topic
    first = header if state is None else (
        _GUARD_HEADER.pack(_GUARDED_WITH_STATE, offset, len(topic)) + topic
        + _STATE_SIZE.pack(len(state)) + state)
    limit = max(limit, len(first) + _FRAGMENT_HEADER.size + 4)  # one character fits
    chunks: list[bytes] = []
    parts: list[bytes] = [first]
    size = len(first)
    for slot, text in fragments:
        data = text.encode("utf-8", "surrogatepass")
        start = 0
        while True:
            room = limit - size - _FRAGMENT_HEADER.size
            end = _character_boundary(data, min(len(data), start + max(room, 0)))
            if len(parts) > 1 and (room < 0 or end == start < len(data)):  # full: the next
                chunks.append(b"".join(parts))
                parts, size = [header], len(header)
                continue
            parts += (_FRAGMENT_HEADER.pack(slot, end - start), data[start:end])
            size += _FRAGMENT_HEADER.size + end - start
            start = end
            if start >= len(data):
                break
    if len(parts) > 1:
        chunks.append(b"".join(parts))
    return chunks


def _character_boundary(data: bytes, position: int) -> int:
    """`position`, or the start of the UTF-8 sequence it falls inside."""
    while 0 < position < len(data) and data[position] & 0xC0 == 0x80:
        position -= 1
    return position


class TextChunk(NamedTuple):
    guard: Applied | None  # None: written before chunks carried one
    state: bytes | None  # the state entry it carries
    fragments: list[tuple[int, str]]


def decode_chunk(value: bytes) -> TextChunk:
    """A stored chunk, or `UndecodableState`."""
    try:
        return _decode_chunk(value)
    except UndecodableState:
        raise
    except Exception as error:  # any corruption: a short value, a bad header
        raise UndecodableState(type(error).__name__) from None


def chunk_partition(value: bytes) -> int | None:
    """The partition of the state entry a chunk carries (None: none, or unreadable)."""
    if value[:1] != bytes([_GUARDED_WITH_STATE]):
        return None
    try:
        state = _chunk_header(value)[1]
    except Exception:  # unreadable: left to the key's next record
        return None
    return None if state is None else partition_of(state)


def _chunk_header(value: bytes) -> tuple[Applied | None, bytes | None, int]:
    """A chunk's replay guard, the state entry it carries, and where its fragments
    start."""
    if value[:1] not in (bytes([_GUARDED]), bytes([_GUARDED_WITH_STATE])):
        return None, None, 0
    mark, offset, topic_size = _GUARD_HEADER.unpack_from(value)
    position = _GUARD_HEADER.size + topic_size
    guard = _guard_of(offset, value[_GUARD_HEADER.size:position])
    if mark != _GUARDED_WITH_STATE:
        return guard, None, position
    (state_size,) = _STATE_SIZE.unpack_from(value, position)
    position += _STATE_SIZE.size
    state = value[position:position + state_size]
    if len(state) != state_size:
        raise UndecodableState("truncated text chunk")
    return guard, state, position + state_size


def _decode_chunk(value: bytes) -> TextChunk:
    guard, state, position = _chunk_header(value)
    fragments: list[tuple[int, str]] = []
    while position < len(value):
        slot, size = _FRAGMENT_HEADER.unpack_from(value, position)
        position += _FRAGMENT_HEADER.size
        data = value[position:position + size]
        if len(data) != size:
            raise UndecodableState("truncated text chunk")
        fragments.append((slot, data.decode("utf-8", "surrogatepass")))
        position += size
    return TextChunk(guard, state, fragments)


class WriteBehindText(InMemoryContentStore):
    """A key's streamed text in memory, with what is not yet persisted.

    The engine appends each delta to a slot's list (no I/O per delta);
    `unpersisted()` returns what came since the last call, as one chunk, and
    leaves each slot one string per chunk.
    """

    __slots__ = ("_cleared", "_persisted")

    def __init__(self) -> None:
        super().__init__()
        self._persisted: dict[int, int] = {}  # slot -> fragments already in a chunk
        self._cleared = False  # a run ended since the last `unpersisted()`

    def clear(self) -> None:
        super().clear()
        self._persisted.clear()
        self._cleared = True

    def restore(self, chunk: list[tuple[int, str]]) -> None:
        """Add a stored chunk's fragments (they are persisted already)."""
        for slot, text in chunk:
            self._parts[slot].append(text)
            self._persisted[slot] = len(self._parts[slot])

    def unpersisted(self) -> tuple[bool, list[tuple[int, str]]]:
        """Whether the text was cleared (a run ended) since the last call, and the text
        added since then, one (slot, text) per slot. Marks it persisted."""
        cleared, self._cleared = self._cleared, False
        fresh: list[tuple[int, str]] = []
        persisted = self._persisted
        for slot, parts in self._parts.items():
            done = persisted.get(slot, 0)
            if len(parts) > done:
                text = "".join(parts[done:])
                # The slot keeps the chunk's text in place of its fragments (the
                # same list: the engine may hold it), freed now while they are in
                # cache; the run's end then joins one string per commit, not per delta.
                parts[done:] = [text]
                persisted[slot] = done + 1
                fresh.append((slot, text))
        return cleared, fresh
