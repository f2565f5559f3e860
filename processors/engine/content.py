"""Where streamed text (message content, tool-call arguments) accumulates.

The run state holds only the shape of a run (ids, open sets, owners, which
slot a message's text lives in); the deltas themselves go to a content store,
one append per delta. Applying one more delta therefore never rewrites what
came before: a persisted store (the service's Faust table) writes one small
entry per delta, not the whole growing message.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol


class Fragments(Protocol):
    """The fragments of one slot's text, in order."""

    def append(self, text: str, /) -> None:
        """Add the next fragment."""


class ContentStore(Protocol):
    """The text of the active run of one key, by slot."""

    def fragments(self, slot: int) -> Fragments:
        """Where `slot`'s next fragments go. The engine keeps it while the key's
        records are deltas to this slot, and drops it at any other record."""

    def texts(self) -> dict[int, str]:
        """Each slot's fragments concatenated in order."""

    def clear(self) -> None:
        """Forget the run's fragments (the run concluded)."""


class InMemoryContentStore:
    """Fragments kept in lists, joined once when the run concludes."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: defaultdict[int, list[str]] = defaultdict(list)

    def fragments(self, slot: int) -> list[str]:
        return self._parts[slot]

    def texts(self) -> dict[int, str]:
        return {slot: "".join(parts) for slot, parts in self._parts.items()}

    def clear(self) -> None:
        self._parts.clear()
