"""What each tenant holds: its open runs per input partition (the limit a tenant may
not exceed, AGUI_TENANT_MAX_OPEN_RUNS) and, across the worker, in the
`agui_tenant_open_runs{tenant}` gauge.

A tenant is a header value: any number of them may come. The gauge names at most
`LABELLED` tenants (the first seen, of printable names up to `LABEL_CHARS`); every
other one counts under `other`, so a flood of tenant names cannot flood Prometheus.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Final

from processors.metrics import Metrics

LABELLED: Final = 50
LABEL_CHARS: Final = 100  # a longer tenant name counts under `other`
OTHER: Final = "other"


class TenantTally:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._open: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self._by_label: Counter[str] = Counter()
        self._labels: set[str] = set()

    def open(self, partition: int, tenant: str) -> int:
        """The tenant's open runs in the partition."""
        return self._open[partition][tenant]

    def count(self, partition: int, tenant: str, delta: int) -> None:
        counts = self._open[partition]
        counts[tenant] += delta
        if counts[tenant] <= 0:
            del counts[tenant]  # a flood of tenant names leaves nothing behind
        if (tenant not in self._labels and len(self._labels) < LABELLED and tenant != OTHER
                and len(tenant) <= LABEL_CHARS and tenant.isprintable()):
            self._labels.add(tenant)
        label = tenant if tenant in self._labels else OTHER
        self._by_label[label] += delta
        self.metrics.tenant_open_runs.labels(label).set(self._by_label[label])

    def clear(self) -> None:
        """Partitions moved: nothing is held until keys are loaded again."""
        self._open.clear()
        for label in self._by_label:
            self.metrics.tenant_open_runs.labels(label).set(0)
        self._by_label.clear()
