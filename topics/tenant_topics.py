"""Per-tenant output topics (AGUI_HISTORY_TOPIC_TEMPLATE, AGUI_DEADLETTER_TOPIC_TEMPLATE):
a tenant's history and dead letters in topics of its own, named by a template such
as `agui.history.{tenant}`, so that a tenant's history service can be granted its
own topic only (docs/operations.md, *Topics and ACLs*).

A tenant is any header value, and a topic name takes `[A-Za-z0-9._-]` only: the
tenant is written with `[A-Za-z0-9-]` kept and every other byte of its UTF-8 as
`_XX` (upper-case hex). That is injective (`_` never appears raw, so every `_`
starts an escape), and `.` never appears in it, so a template whose text after
`{tenant}` is empty or starts with `.` names each topic of one tenant only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

PLACEHOLDER: Final = "{tenant}"
MAX_TOPIC_CHARS: Final = 249  # Kafka's limit on a topic's name
_KEPT: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_LEGAL: Final = re.compile(r"[A-Za-z0-9._-]*")
# What `encode_tenant` can write, as a regex.
_ENCODED: Final = "(?:[A-Za-z0-9-]|_[0-9A-F]{2})+"


def encode_tenant(tenant: str) -> str:
    """The tenant as a part of a topic name (see the module docstring)."""
    return "".join(chr(byte) if byte in _KEPT else f"_{byte:02X}"
                   for byte in tenant.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class Template:
    """A topic name with `{tenant}` in it once."""

    text: str

    @property
    def prefix(self) -> str:
        """What every topic of the template starts with (ACLs are granted on it)."""
        return self.text.split(PLACEHOLDER)[0]

    @property
    def suffix(self) -> str:
        return self.text.split(PLACEHOLDER)[1]

    def topic(self, tenant: str) -> str | None:
        """The tenant's topic; None when its name would be longer than Kafka allows
        (the tenant is not routable)."""
        name = f"{self.prefix}{encode_tenant(tenant)}{self.suffix}"
        return name if len(name) <= MAX_TOPIC_CHARS else None

    @property
    def pattern(self) -> str:
        """A regex matching exactly the names `topic` gives (a consumer subscribes by it)."""
        return f"^{re.escape(self.prefix)}{_ENCODED}{re.escape(self.suffix)}$"

    def problem(self) -> str | None:
        """Why this is not a usable template, or None."""
        if self.text.count(PLACEHOLDER) != 1:
            return f"{self.text!r} must contain {PLACEHOLDER} exactly once"
        literal = self.prefix + self.suffix
        if not _LEGAL.fullmatch(literal):
            return (f"{self.text!r}: its text besides {PLACEHOLDER} may hold only letters,"
                    " digits, '.', '_' and '-' (a topic name's characters)")
        if not self.prefix:
            return (f"{self.text!r} must start with text before {PLACEHOLDER}: ACLs grant"
                    " the tenants' topics by that prefix")
        if self.suffix and not self.suffix.startswith("."):
            return (f"{self.text!r}: the text after {PLACEHOLDER} must start with '.' (a"
                    " tenant's name never holds one, so no two tenants share a topic)")
        if len(literal) + 3 > MAX_TOPIC_CHARS:
            return f"{self.text!r} leaves no room for a tenant in a topic name"
        return None


def templates_problem(history: Template, deadletter: Template) -> str | None:
    """Why the two templates cannot be used together: they could name one topic."""
    if history.text == deadletter.text:
        return "AGUI_HISTORY_TOPIC_TEMPLATE and AGUI_DEADLETTER_TOPIC_TEMPLATE are the same"
    first, second = history.prefix, deadletter.prefix
    if first != second and (first.startswith(second) or second.startswith(first)):
        return (f"the templates' prefixes {first!r} and {second!r}: one starts the other,"
                " so a tenant's history topic could be another tenant's dead-letter topic;"
                " give them the same prefix or prefixes that differ")
    return None


def matches_any(templates: tuple[Template, ...], topic: str) -> bool:
    """Whether `topic` is a name one of the templates gives."""
    return any(re.match(template.pattern, topic) for template in templates)
