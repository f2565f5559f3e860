"""Connection settings for every Kafka client the service makes (Faust, aiokafka)."""

from __future__ import annotations

import ssl
from typing import Any

import faust

from processors.config import Settings


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=settings.ssl_cafile)
    if settings.ssl_certfile is not None:
        # Never OpenSSL's prompt on the terminal for an encrypted key without a password.
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile,
                                settings.ssl_key_password or _no_password)
    return context


def _no_password() -> str:
    return ""


def aiokafka_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments shared by aiokafka producers, consumers and admin clients."""
    options: dict[str, Any] = {
        "bootstrap_servers": list(settings.bootstrap_servers),
        "security_protocol": settings.security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.security_protocol.startswith("SASL_"):
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password
    return options


def faust_credentials(settings: Settings) -> Any:
    context = ssl_context(settings)
    if settings.security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            ssl_context=context,
            mechanism=settings.sasl_mechanism,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None
