"""Tenant tokens: the file format, its errors, matching a bearer header, and the
`hash-token` command."""

from __future__ import annotations

import hmac
import io
from pathlib import Path

import pytest

from processors.config import ConfigError
from processors.tools import cli
from processors.view.tenant_tokens import TenantTokens, token_line

TOKENS = "\n".join([
    "# thread API tokens",
    "",
    token_line("acme", "acme-token"),
    "   " + token_line("acme", "acme-next-token"),  # rotation: a second token
    token_line("globex", "globex-token").upper().replace("GLOBEX SHA256", "globex sha256"),
])


@pytest.fixture
def tokens(tmp_path: Path) -> TenantTokens:
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    return TenantTokens.load(str(path))


def test_a_bearer_token_names_its_tenant(tokens: TenantTokens) -> None:
    assert tokens.tenant_for("Bearer acme-token") == "acme"
    assert tokens.tenant_for("bearer  acme-next-token ") == "acme"
    assert tokens.tenant_for("Bearer globex-token") == "globex"


@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer ", "Basic acme-token", "acme-token", "Bearer acme-token2",
    "Bearer ACME-TOKEN", "Bearer \ud800",
])
def test_anything_else_names_no_tenant(tokens: TenantTokens, header: str | None) -> None:
    assert tokens.tenant_for(header) is None


@pytest.mark.parametrize(("text", "line"), [
    ("acme", 1),
    ("# fine\nacme sha256:abc", 2),
    ("acme md5:" + "0" * 64, 1),
    ("acme sha256:" + "0" * 64 + " extra", 1),
    ("acme plain-token-pasted-here", 1),
])
def test_a_malformed_line_is_named_by_number_not_content(text: str, line: int) -> None:
    with pytest.raises(ConfigError) as raised:
        TenantTokens.parse(text, "tokens")
    message = str(raised.value)
    assert f"line {line}:" in message
    assert "plain-token-pasted-here" not in message


def test_one_token_for_two_tenants_is_an_error() -> None:
    text = f"{token_line('acme', 'shared')}\n{token_line('globex', 'shared')}"
    with pytest.raises(ConfigError, match="line 2: the same token as line 1"):
        TenantTokens.parse(text, "tokens")


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        TenantTokens.load(str(tmp_path / "missing"))


def test_every_entry_is_compared_whether_or_not_one_matched(
        tokens: TenantTokens, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[bytes] = []
    compare = hmac.compare_digest

    def counting(presented: bytes, digest: bytes) -> bool:
        compared.append(digest)
        return compare(presented, digest)

    monkeypatch.setattr("processors.view.tenant_tokens.hmac.compare_digest", counting)
    for header in ("Bearer acme-token", "Bearer globex-token", "Bearer nobody"):
        compared.clear()
        tokens.tenant_for(header)
        assert compared == [digest for digest, _ in tokens.entries]


def test_hash_token_prints_the_line_for_a_token_on_stdin(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("acme-token\r\n"))
    assert cli.main(["hash-token", "acme"]) == 0
    line = capsys.readouterr().out.strip()
    assert "acme-token" not in line
    assert TenantTokens.parse(line, "stdout").tenant_for("Bearer acme-token") == "acme"


@pytest.mark.parametrize(("tenant", "token"), [("acme", "\n"), ("acme", "two words"),
                                                ("two words", "token"), ("", "token")])
def test_hash_token_refuses_what_the_file_cannot_hold(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tenant: str,
        token: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(token))
    assert cli.main(["hash-token", tenant]) == 2
    assert capsys.readouterr().out == ""


def test_a_worker_with_a_malformed_tokens_file_refuses_to_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{token_line('acme', 'acme-token')}\nacme pasted-a-token-by-mistake\n")
    monkeypatch.setenv("AGUI_TOKENS_FILE", str(path))
    assert cli.main(["worker"]) == 2  # before any connection to a broker
    error = capsys.readouterr().err
    assert "AGUI_TOKENS_FILE" in error and "line 2" in error
    assert "pasted-a-token-by-mistake" not in error


def test_the_documented_example_file_parses() -> None:
    """docs/thread-view.md's example, trailing comment included, is a valid file."""
    doc = (Path(__file__).parents[2] / "docs" / "thread-view.md").read_text()
    example = doc.split("## Tokens file", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    tokens = TenantTokens.parse(example, "docs")
    assert [tenant for _, tenant in tokens.entries] == ["acme", "acme", "globex"]
    assert tokens.tenant_for("Bearer globex-token") == "globex"
