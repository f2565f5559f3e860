"""Where a tenant's outputs go in the per-tenant layout (topics.tenant_topics), and
whether those topics exist.

The worker never creates a tenant's topics (a producer names its tenant: it would
create topics at will); an administrator does (`agui-stream create-topics --tenant`).
So the worker keeps the names of the tenant topics that exist, learnt at start and
at every refresh (`learn`), and publishes for a tenant only when both of its topics
are among them. Sans-IO: the runtime does the looking up.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple

from topics.tenant_topics import Template, matches_any


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
        self._checked: set[str] = set()
        # Bounded: a tenant is a header value, any number of them may come.
        self.topics = functools.lru_cache(maxsize=4096)(self._topics)

    def _topics(self, tenant: str) -> TenantTopics:
        history, deadletter = self.templates
        return TenantTopics(history.topic(tenant), deadletter.topic(tenant))

    def missing(self, tenant: str) -> list[str]:
        """The tenant's topics that do not exist, or that no name can give ("" each)."""
        return [name or "" for name in self.topics(tenant) if name not in self.existing]

    def learn(self, topics: Iterable[str]) -> None:
        """The topics that exist now (any names: those of no template are ignored)."""
        self.existing = frozenset(name for name in topics if matches_any(self.templates, name))
        self._checked.clear()

    def settled(self, tenant: str) -> bool:
        """Whether it is known, without looking again, where the tenant's outputs go:
        its topics exist, no name can give them, or they were looked up since the
        last refresh."""
        missing = self.missing(tenant)
        return not missing or "" in missing or tenant in self._checked

    def looked_up(self, tenant: str, topics: Iterable[str]) -> None:
        """`topics` exist now, as a look-up made for `tenant` said."""
        self.existing = self.existing | {
            name for name in topics if matches_any(self.templates, name)}
        self._checked.add(tenant)
