"""Which tenant a thread API caller is: per-tenant bearer tokens, hashed at rest.

The tokens file (`AGUI_TOKENS_FILE`) has one line per token:

    # comment
    <tenant> sha256:<64 hex digits>   # an optional comment

the hex being the SHA-256 of the token's UTF-8 bytes; blank lines and lines
starting with `#` are ignored. A tenant may have several lines (to rotate a
token: add the new one, move the callers, remove the old one). A tenant is the
name the records carry in their tenant header; it cannot contain whitespace.
`agui-stream hash-token <tenant>` reads a token on stdin and prints its line.

A presented token is hashed and compared with every entry in constant time
(`hmac.compare_digest`, no early exit), so neither the timing nor the result
says which entries came close. Tokens should be random (e.g. `openssl rand
-base64 32`): the hash is unsalted, which is safe only for tokens nobody can
guess.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

from processors.config import ConfigError, read_setting_file

# A comment may follow the digest, after whitespace.
_LINE: Final = re.compile(r"(\S+)\s+sha256:([0-9a-fA-F]{64})(?:\s+#.*)?")


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def token_line(tenant: str, token: str) -> str:
    """The tokens-file line giving `token` to `tenant`."""
    if not tenant or any(character.isspace() for character in tenant):
        raise ValueError("a tenant must be non-empty and contain no whitespace")
    if not token or any(character.isspace() for character in token):
        raise ValueError("a token must be non-empty and contain no whitespace")
    return f"{tenant} sha256:{token_digest(token).hex()}"


class TenantTokens:
    """The tokens of a tokens file, as (digest, tenant) pairs."""

    def __init__(self, entries: list[tuple[bytes, str]]) -> None:
        self.entries = entries

    @classmethod
    def load(cls, path: str) -> TenantTokens:
        """Read a tokens file; a `ConfigError` names the path and, for a malformed
        line, its number (never its content: it could be a token pasted by mistake)."""
        return cls.parse(read_setting_file("AGUI_TOKENS_FILE", path), path)

    @classmethod
    def parse(cls, text: str, source: str) -> TenantTokens:
        entries: list[tuple[bytes, str]] = []
        lines_of: dict[bytes, int] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            match = _LINE.fullmatch(stripped)
            if match is None:
                raise ConfigError(f"AGUI_TOKENS_FILE={source!r} line {number}: expected"
                                  " '<tenant> sha256:<64 hex digits>'")
            tenant, digest = match.group(1), bytes.fromhex(match.group(2))
            if digest in lines_of:
                raise ConfigError(f"AGUI_TOKENS_FILE={source!r} line {number}: the same token"
                                  f" as line {lines_of[digest]}")
            lines_of[digest] = number
            entries.append((digest, tenant))
        return cls(entries)

    def tenant_for(self, authorization: str | None) -> str | None:
        """The tenant of an `Authorization: Bearer <token>` header, or None."""
        if authorization is None:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        presented = token_digest(token)
        tenant = None
        for digest, candidate in self.entries:  # every entry, whatever matched before
            if hmac.compare_digest(presented, digest):
                tenant = candidate
        return tenant
