"""The compatibility boundary for the retired 0.x `THINKING_*` events (AG-UI 1.1,
basic/versioning *Retired shapes*; the registry `DEPRECATIONS.md`: translated until
2027-08-24, a date the registry calls provisional).

Each retired event becomes its `REASONING_*` replacement before the schema sees it,
and the engine warns `retired_shape`. The 0.x events name no message, so the
boundary mints ids: deterministic (a replay after a crash must mint the same ones),
per run, `<runId>/thinking-<n>` for a span and `<runId>/thinking-message-<n>` for a
message, each counted from 1. A CONTENT or END with no current message gets a fresh
id, and is then an orphan like any other (the reference client's shim does the same
with a random id).
"""

from __future__ import annotations

from typing import Any, Final

from processors.engine.state import RunState

# Retired type -> (replacement, what the event names: a span or a message, and
# whether it opens one).
RETIRED_EVENTS: Final = {
    "THINKING_START": ("REASONING_START", "span", True),
    "THINKING_END": ("REASONING_END", "span", False),
    "THINKING_TEXT_MESSAGE_START": ("REASONING_MESSAGE_START", "message", True),
    "THINKING_TEXT_MESSAGE_CONTENT": ("REASONING_MESSAGE_CONTENT", "message", False),
    "THINKING_TEXT_MESSAGE_END": ("REASONING_MESSAGE_END", "message", False),
}
# RunState.thinking is [current span, current message, spans minted, messages minted].
_CURRENT: Final = {"span": 0, "message": 1}
_MINTED: Final = {"span": 2, "message": 3}


def translate_thinking(event: dict[str, Any], run: RunState | None) -> dict[str, Any]:
    """The replacement of a retired event (its type one of `RETIRED_EVENTS`)."""
    replacement, names, opens = RETIRED_EVENTS[event["type"]]
    translated = {key: value for key, value in event.items() if key != "title"}
    translated["type"] = replacement
    if replacement == "REASONING_MESSAGE_START":
        translated["role"] = "reasoning"
    current = _CURRENT[names]
    ids = None
    if run is not None:
        if run.thinking is None:
            run.thinking = [None, None, 0, 0]
        ids = run.thinking
    item_id = None if ids is None or opens else ids[current]
    if item_id is None:
        item_id = _mint(run, ids, names)
        if ids is not None and opens:
            ids[current] = item_id
    translated["messageId"] = item_id
    return translated


def _mint(run: RunState | None, ids: list[Any] | None, names: str) -> str:
    if ids is None:
        return f"/thinking-{names}"  # no run: the event fails run_not_started anyway
    ids[_MINTED[names]] += 1
    infix = "thinking" if names == "span" else "thinking-message"
    assert run is not None
    return f"{run.run_id}/{infix}-{ids[_MINTED[names]]}"
