"""The closed sets of codes the rule book names (reasoning.md sections 1-9).

They are the only values that ever become metric labels or dead-letter codes.
"""

from __future__ import annotations

from enum import StrEnum


class FailureCode(StrEnum):
    UNDECODABLE_RECORD = "undecodable_record"
    MALFORMED_EVENT = "malformed_event"
    RUN_NOT_STARTED = "run_not_started"
    RUN_ALREADY_ACTIVE = "run_already_active"
    RUN_ALREADY_ENDED = "run_already_ended"
    RUN_ID_MISMATCH = "run_id_mismatch"
    OPEN_AT_FINISH = "open_at_finish"
    RUN_ABANDONED = "run_abandoned"
    SPAN_ALREADY_OPEN = "span_already_open"
    SPAN_NOT_OPEN = "span_not_open"
    MESSAGE_ALREADY_OPEN = "message_already_open"
    MESSAGE_NOT_OPEN = "message_not_open"
    TOOL_CALL_ALREADY_OPEN = "tool_call_already_open"
    TOOL_CALL_NOT_OPEN = "tool_call_not_open"
    STEP_ALREADY_OPEN = "step_already_open"
    STEP_NOT_OPEN = "step_not_open"
    SUBAGENT_ALREADY_OPEN = "subagent_already_open"
    SUBAGENT_NOT_OPEN = "subagent_not_open"
    CHUNK_WITHOUT_ID = "chunk_without_id"
    CHUNK_AMBIGUOUS = "chunk_ambiguous"
    CHUNK_CONFLICT = "chunk_conflict"
    OWNER_MISMATCH = "owner_mismatch"
    # The limits that keep one run, or one tenant, from exhausting a worker
    # (docs/rules.md section 3, docs/operations.md).
    RUN_EVENT_LIMIT = "run_event_limit"
    RUN_CONTENT_LIMIT = "run_content_limit"
    RUN_ITEM_LIMIT = "run_item_limit"
    TENANT_OPEN_RUN_LIMIT = "tenant_open_run_limit"


class WarningCode(StrEnum):
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_MEMBER = "unknown_member"
    UNKNOWN_SUBTYPE = "unknown_subtype"
    PROTOCOL_VERSION = "protocol_version"
    INCOMPLETE_AT_ERROR = "incomplete_at_error"
    ENCRYPTED_VALUE_UNKNOWN_ENTITY = "encrypted_value_unknown_entity"
    NOT_STORABLE = "not_storable"
    # AG-UI 1.1 (docs/rules.md)
    RETIRED_SHAPE = "retired_shape"
    LATE_RUN_ERROR = "late_run_error"
    ACTIVITY_PATCH_FAILED = "activity_patch_failed"
    ACTIVITY_UNKNOWN_MESSAGE = "activity_unknown_message"
    MESSAGE_ID_CONFLICT = "message_id_conflict"
    SUBAGENT_REUSED = "subagent_reused"
    # Per-tenant topics (docs/operations.md): the tenant's topic does not exist.
    TENANT_TOPIC_MISSING = "tenant_topic_missing"


class LossReason(StrEnum):
    """Why an encrypted reasoning value was lost (reasoning.md section 6)."""

    UNKNOWN_ENTITY = "unknown_entity"
    UNKNOWN_SUBTYPE = "unknown_subtype"
    RUN_FAILED = "run_failed"
    RUN_ABANDONED = "run_abandoned"
    INCOMPLETE_AT_ERROR = "incomplete_at_error"
    NOT_STORABLE = "not_storable"
    TENANT_TOPIC_MISSING = "tenant_topic_missing"


class Outcome(StrEnum):
    """How a run ended: AG-UI 1.1's outcomes of RUN_FINISHED (events/lifecycle), RUN_ERROR,
    and the two endings the rules give a run (a failure, the idle timeout)."""

    SUCCESS = "success"
    INTERRUPT = "interrupt"
    CANCELLED = "cancelled"
    ERROR = "error"
    FAILED = "failed"
    ABANDONED = "abandoned"
