"""The thread API's contract: an OpenAPI 3.1 document, built from the same constants
the routes use (page size, wait, error codes), served by every worker at
`GET /v1/openapi.json` and checked in CI with openapi-spec-validator; the
answers of the routes are validated against its schemas in the tests
(tests/view/test_openapi.py). `docs/openapi.json` is a copy, kept equal by a test.
"""

from __future__ import annotations

from typing import Any, Final

from processors.view.thread_api import MAX_PAGE, MAX_WAIT_SECONDS, ErrorCode

_JSON: Final = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref(schema)}}}


def _refusals(*statuses: str) -> dict[str, Any]:
    meaning = {
        "400": "a parameter is not valid (`bad_parameter`) or a cursor names no entry"
               " (`cursor_not_found`)",
        "401": "no valid bearer token (`unauthorized`), or the API is disabled"
               " (`api_disabled`)",
        "404": "the tenant has no such thread (`thread_not_found`) or run"
               " (`run_not_found`)",
        "429": "too many requests wait for the view (`too_many_waiters`); see Retry-After",
        "503": "the partition is moving or recovering (`not_ready`), or what the request"
               " waits for did not come in time (`wait_timeout`); see Retry-After",
        "500": "an internal error (`internal`)",
    }
    return {status: _answer(meaning[status], "Error") for status in statuses}


_THREAD_ID: Final = {"name": "threadId", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1}}
_PAGE_PARAMETERS: Final = [
    {"name": "limit", "in": "query", "description": f"entries per page (default {MAX_PAGE})",
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": MAX_PAGE}},
    {"name": "after", "in": "query", "description": "the id of the entry the page follows",
     "schema": {"type": "string", "minLength": 1}},
    {"name": "before", "in": "query", "description": "the id of the entry the page precedes",
     "schema": {"type": "string", "minLength": 1}},
    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"], "default": "asc"}},
    {"name": "run", "in": "query", "description": "wait until this run is complete in the"
     f" view (at most {MAX_WAIT_SECONDS:g} s)", "schema": {"type": "string", "minLength": 1}},
    {"name": "min_offset", "in": "query", "description": "wait until the thread's"
     " historyOffset is at least this", "schema": {
         "type": "integer", "minimum": 0, "maximum": 2**63 - 1}},
]
_PAGE_FIELDS: Final = {
    "hasMore": {"type": "boolean"},
    "firstId": {"type": "string"},
    "lastId": {"type": "string"},
    "historyOffset": {"type": "integer",
                      "description": "offset of the thread's last history record applied"},
}
_SECURITY: Final[list[dict[str, list[str]]]] = [{"bearer": []}]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the thread API."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "agui-stream thread API", "version": "1",
                 "description": "Each thread's AG-UI messages and runs, as the history"
                                " topic folds them (docs/thread-view.md)."},
        "security": _SECURITY,
        "paths": {
            "/v1/threads/{threadId}/messages": {"get": {
                "operationId": "getThreadMessages",
                "summary": "The thread's messages: the next run's RunAgentInput.messages",
                "parameters": [_THREAD_ID, *_PAGE_PARAMETERS],
                "responses": {"200": _answer("a page of the thread's messages", "Messages"),
                              **_refusals("400", "401", "404", "429", "503", "500")}}},
            "/v1/threads/{threadId}": {
                "get": {
                    "operationId": "getThreadRuns",
                    "summary": "The thread's runs, in the order of their first closing record",
                    "parameters": [_THREAD_ID, *_PAGE_PARAMETERS],
                    "responses": {"200": _answer("a page of the thread's runs", "Runs"),
                                  **_refusals("400", "401", "404", "429", "503", "500")}},
                "delete": {
                    "operationId": "deleteThread",
                    "summary": "Erase the thread (an erasure record on the history topic)",
                    "parameters": [_THREAD_ID],
                    "responses": {"200": _answer("erased from the view", "Erasure"),
                                  "202": _answer("the erasure is written, not yet applied",
                                                 "Erasure"),
                                  **_refusals("400", "401", "404", "503", "500")}}},
            "/v1/threads/{threadId}/runs/{runId}": {"get": {
                "operationId": "getRun",
                "summary": "What became of one run, at once",
                "parameters": [_THREAD_ID, {"name": "runId", "in": "path", "required": True,
                                            "schema": {"type": "string", "minLength": 1}}],
                "responses": {"200": _answer("the run's summary", "RunStatus"),
                              **_refusals("400", "401", "404", "503", "500")}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a tenant's token"}},
            "schemas": _schemas(),
        },
    }


def _schemas() -> dict[str, Any]:
    return {
        "Error": {
            "type": "object", "required": ["error", "code"],
            "properties": {"error": {"type": "string"},
                           "code": {"enum": [code.value for code in ErrorCode]},
                           "historyOffset": {"type": "integer"}}},
        "Message": {
            "type": "object", "required": ["id", "role"],
            "description": "an AG-UI message (ag-ui-protocol's Message models),"
                           " encryptedValue and encryptedValueType as published",
            "properties": {"id": {"type": "string"}, "role": {"enum": [
                "developer", "system", "assistant", "user", "tool", "activity", "reasoning"]}}},
        "RunSummary": {
            "type": "object", "required": ["runId", "outcome", "firstTime", "lastTime"],
            "properties": {
                "runId": {"type": "string"},
                "outcome": {"enum": ["success", "interrupt", "cancelled", "error", "failed",
                                     "abandoned"]},
                "messageCount": {"type": "integer", "minimum": 0},
                "pendingToolCallIds": {"type": "array", "items": {"type": "string"}},
                "interrupts": {"type": "array", "items": {"type": "object"}},
                "usage": {"type": "array", "items": {"type": "object"}},
                "error": {"type": "object"},
                "failure": {"type": "object", "required": ["code"],
                            "properties": {"code": {"type": "string"}}},
                "inputEchoed": {"type": "boolean"},
                "late": {"type": "boolean"},
                "firstTime": {"type": "integer"},
                "lastTime": {"type": "integer"}}},
        "Messages": {
            "type": "object",
            "required": ["threadId", "messages", "hasMore", "complete", "historyOffset"],
            "properties": {
                "threadId": {"type": "string"},
                "messages": {"type": "array", "items": _ref("Message")},
                **_PAGE_FIELDS,
                "complete": {"type": "boolean"},
                "incomplete": {"type": "string"},
                "run": _ref("RunSummary")}},
        "Runs": {
            "type": "object", "required": ["threadId", "runs", "hasMore", "historyOffset"],
            "properties": {"threadId": {"type": "string"},
                           "runs": {"type": "array", "items": _ref("RunSummary")},
                           **_PAGE_FIELDS}},
        "RunStatus": {
            "type": "object", "required": ["threadId", "run", "complete", "historyOffset"],
            "properties": {"threadId": {"type": "string"}, "run": _ref("RunSummary"),
                           "complete": {"type": "boolean"},
                           "historyOffset": {"type": "integer"}}},
        "Erasure": {
            "type": "object", "required": ["threadId", "erased", "historyOffset"],
            "properties": {"threadId": {"type": "string"}, "erased": {"type": "boolean"},
                           "historyOffset": {"type": "integer"}}},
    }
