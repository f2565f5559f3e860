"""Where a tenant's outputs go in the per-tenant layout (topics.tenant_topics), and
whether those topics exist.

The worker never creates a tenant's topics (a producer names its tenant: it would
create topics at will); an administrator does (`agui-stream create-topics --tenant`).
So the worker keeps the names of the tenant topics that exist, learnt at start and
at every refresh (`learn`), and publishes for a tenant only when both of its topics
are among them. Sans-IO: the runtime does the looking up.

A tenant not known to have its topics is looked up again before its first record
(`needs_look_up`) unless the last listing was made after that record was written:
an administrator provisions a tenant before its producer sends, so such a listing
has its topics if they exist. A record is known to have been written before a
listing when its offset is below the end its partition had been fetched to when
the listing began (`written`: each input partition's high watermark then).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Final, NamedTuple

from topics.tenant_topics import Template, matches_any

# Tenants without their topics that count as checked until the next refresh: a
# bound, since a tenant is a header value and any number of them may come (one
# dropped is looked up again, at most once a second).
CHECKED_TENANTS: Final = 4096

# An input partition: (topic, partition).
Place = tuple[str, int]


class TenantTopics(NamedTuple):
    """A tenant's history and dead-letter topics (None: its name is too long for one)."""

    history: str | None
    deadletter: str | None


class TenantRouting:
    def __init__(self, history: Template, deadletter: Template) -> None:
        self.templates = (history, deadletter)
        self.existing: frozenset[str] = frozenset()
        # Tenants with a topic missing that were looked up since the last `learn`:
        # their absence is taken as known until the next refresh.
        self._checked: OrderedDict[str, None] = OrderedDict()
        # Per input partition, the offset below which every record was written before
        # the last listing of the topics began.
        self.listed_after: dict[Place, int] = {}
        # Bounded: a tenant is a header value, any number of them may come.
        self.topics = functools.lru_cache(maxsize=4096)(self._topics)

    def _topics(self, tenant: str) -> TenantTopics:
        history, deadletter = self.templates
        return TenantTopics(history.topic(tenant), deadletter.topic(tenant))

    def missing(self, tenant: str) -> list[str]:
        """The tenant's topics that do not exist, or that no name can give ("" each)."""
        return [name or "" for name in self.topics(tenant) if name not in self.existing]

    def learn(self, topics: Iterable[str], written: Mapping[Place, int]) -> None:
        """The topics that exist now (any names: those of no template are ignored), as
        listed once each input partition had been written up to `written`."""
        self.existing = frozenset(name for name in topics if matches_any(self.templates, name))
        self._checked.clear()
        self.listed_after.update(written)

    def settled(self, tenant: str) -> bool:
        """Whether it is known, without looking again, where the tenant's outputs go:
        its topics exist, no name can give them, or they were looked up since the
        last refresh."""
        missing = self.missing(tenant)
        return not missing or "" in missing or tenant in self._checked

    def needs_look_up(self, tenant: str, place: Place, offset: int) -> bool:
        """Whether the tenant's topics must be looked up before the record at `offset`
        of input partition `place` is processed: not when that is settled, nor when
        the last listing began after the record was written (the tenant then counts
        as checked)."""
        if self.settled(tenant):
            return False
        if offset < self.listed_after.get(place, 0):
            self._check(tenant)
            return False
        return True

    def looked_up(self, tenant: str, topics: Iterable[str], written: Mapping[Place, int],
                  ) -> None:
        """`topics` exist now, as a look-up made for `tenant` said, begun once each input
        partition had been written up to `written`."""
        self.existing = self.existing | {
            name for name in topics if matches_any(self.templates, name)}
        self.listed_after.update(written)
        self._check(tenant)

    def _check(self, tenant: str) -> None:
        self._checked[tenant] = None
        self._checked.move_to_end(tenant)
        if len(self._checked) > CHECKED_TENANTS:
            self._checked.popitem(last=False)
