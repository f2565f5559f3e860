"""The output records' hand-written encoders agree with their pydantic models."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from topics.records import HistoryMessage

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # no lone surrogates
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(tenant=TEXT, thread_id=st.none() | TEXT, run_id=st.none() | TEXT,
       seq=st.integers(0, 10_000), message=st.dictionaries(TEXT, JSON, max_size=6))
def test_history_message_encode_is_the_models_bytes(
    tenant: str, thread_id: str | None, run_id: str | None, seq: int, message: dict[str, Any]
) -> None:
    model = HistoryMessage(tenant=tenant, threadId=thread_id, runId=run_id, seq=seq,
                           message=message)
    assert HistoryMessage.encode(tenant, thread_id, run_id, seq, message) == model.to_bytes()
