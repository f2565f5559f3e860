"""A client of the thread API: a thread's messages as `ag-ui-protocol` models,
ready to be a run's `RunAgentInput.messages`.

    from processors.view.client import fetch_thread_messages
    messages = fetch_thread_messages("http://agui-stream:6066", token, "thread-1")

Standard library HTTP (urllib) only. Errors name the status and the API's
reason, never the token and never message content.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

import orjson
from ag_ui.core import Message
from pydantic import TypeAdapter, ValidationError

_MESSAGES: Final[TypeAdapter[list[Any]]] = TypeAdapter(list[Message])


class ThreadApiError(Exception):
    """The thread API did not answer with the thread's messages."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unauthorized(ThreadApiError):
    """401: the token is unknown, or the API is disabled on the server."""


class ThreadNotFound(ThreadApiError):
    """404: the token's tenant has no such thread (the view may not have read it yet)."""


class ThreadApiUnreachable(ThreadApiError):
    """No answer: the connection failed or timed out."""


def fetch_thread_messages(base_url: str, token: str, thread_id: str,
                          after: str | None = None, *, run: str | None = None,
                          min_offset: int | None = None,
                          timeout: float = 15.0) -> list[Message]:
    """The thread's messages (only those after the message `after`, if given).
    `run`: first let the view take in that run (the one the caller just finished);
    `min_offset`: first let the view read the history up to this offset."""
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError("base_url must be an http:// or https:// URL")
    query = {name: str(value) for name, value in (
        ("after", after), ("run", run), ("min_offset", min_offset)) if value is not None}
    url = (f"{base_url.rstrip('/')}/v1/threads/{urllib.parse.quote(thread_id, safe='')}"
           f"/messages{'?' + urllib.parse.urlencode(query) if query else ''}")
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise _refusal(error.code, error.read()) from None
    except (OSError, http.client.HTTPException) as error:  # URLError, timeouts, resets
        reason = getattr(error, "reason", error)
        raise ThreadApiUnreachable(f"the thread API at {base_url} did not answer"
                                   f" ({type(reason).__name__})") from None
    try:
        return _MESSAGES.validate_python(orjson.loads(body)["messages"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValidationError):
        raise ThreadApiError("the answer is not a thread's messages", 200) from None


def _refusal(status: int, body: bytes) -> ThreadApiError:
    kind = {401: Unauthorized, 404: ThreadNotFound}.get(status, ThreadApiError)
    return kind(f"the thread API answered {status}: {_reason(body)}", status)


def _reason(body: bytes) -> str:
    """The API's `error` text (it names no content), or a placeholder."""
    try:
        reason = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return "(no reason given)"
    return reason[:200] if isinstance(reason, str) else "(no reason given)"
