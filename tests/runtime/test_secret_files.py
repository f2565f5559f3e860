"""Secrets from files, as Kubernetes mounts them (no broker): the SASL password
and an encrypted client key's password are read from the files named, errors name
the variable and the path but never the content, and the settings' repr hides
them."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from processors.config import ConfigError, Settings
from processors.runtime.kafka_client import aiokafka_options, ssl_context

PASSWORD = "pa55 W0RD-from-a-file"  # a space inside is kept
SASL = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "agui"}


def test_the_sasl_password_is_read_from_its_file_less_one_newline(tmp_path: Path) -> None:
    secret = tmp_path / "sasl-password"
    secret.write_text(PASSWORD + "\n")
    settings = Settings.from_env({**SASL, "KAFKA_SASL_PASSWORD_FILE": str(secret)})
    assert settings.sasl_password == PASSWORD
    assert aiokafka_options(settings)["sasl_plain_password"] == PASSWORD
    assert PASSWORD not in repr(settings)


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot be read (FileNotFoundError)"),
    ("", "the file is empty"),
    ("\n", "the file is empty"),
    (b"\xff" + PASSWORD.encode(), "cannot be read (UnicodeDecodeError)"),
])
def test_a_password_file_that_gives_no_password_is_refused_without_its_content(
        tmp_path: Path, content: str | bytes | None, problem: str) -> None:
    secret = tmp_path / "sasl-password"
    if isinstance(content, str):
        secret.write_text(content)
    elif isinstance(content, bytes):
        secret.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**SASL, "KAFKA_SASL_PASSWORD_FILE": str(secret)})
    assert str(raised.value) == f"KAFKA_SASL_PASSWORD_FILE={str(secret)!r}: {problem}"
    assert PASSWORD not in str(raised.value)


def test_a_password_and_a_password_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "sasl-password"
    secret.write_text(PASSWORD)
    with pytest.raises(ConfigError, match="set KAFKA_SASL_PASSWORD or"
                                          " KAFKA_SASL_PASSWORD_FILE, not both"):
        Settings.from_env({**SASL, "KAFKA_SASL_PASSWORD": "other",
                           "KAFKA_SASL_PASSWORD_FILE": str(secret)})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_an_encrypted_client_key_opens_with_the_password_from_its_file(
        tmp_path: Path) -> None:
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1",
                    "-subj", "/CN=agui-stream", "-keyout", str(key), "-out", str(cert),
                    "-passout", f"pass:{PASSWORD}"], check=True, capture_output=True)
    secret = tmp_path / "key-password"
    secret.write_text(PASSWORD + "\n")
    env = {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": str(cert),
           "KAFKA_SSL_CERTFILE": str(cert), "KAFKA_SSL_KEYFILE": str(key)}
    settings = Settings.from_env({**env, "KAFKA_SSL_KEY_PASSWORD_FILE": str(secret)})
    assert isinstance(ssl_context(settings), ssl.SSLContext)
    assert PASSWORD not in repr(settings)
    with pytest.raises(ssl.SSLError):  # without it the key cannot be opened
        ssl_context(Settings.from_env(env | {"KAFKA_SSL_KEY_PASSWORD_FILE": ""}))
