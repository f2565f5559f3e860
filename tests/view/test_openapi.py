"""The thread API's OpenAPI 3.1 document: valid (openapi-spec-validator), the copy
in docs/ equal to what the workers serve, and every answer the routes give valid
against it, errors included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from processors.view.client import RunSummary
from processors.view.openapi import openapi_document
from processors.view.thread_api import ApiResponse, ThreadApi
from tests.view.test_thread_api_reads import (
    ACME,
    GLOBEX,
    TOKENS,
    eraser,
    user,
    view_of,
)

DOCUMENT = openapi_document()


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOCUMENT)  # raises on any violation of the OpenAPI 3.1 schema
    assert DOCUMENT["openapi"] == "3.1.0"


def test_the_copy_in_docs_is_the_document_served() -> None:
    copy = Path(__file__).parents[2] / "docs" / "openapi.json"
    assert orjson.loads(copy.read_bytes()) == DOCUMENT, (
        "regenerate docs/openapi.json from processors.view.openapi.openapi_document()")


def conforms(response: ApiResponse, path: str, method: str = "get") -> None:
    operation = DOCUMENT["paths"][path][method]
    answer = operation["responses"].get(str(response.status))
    assert answer is not None, f"{method} {path}: {response.status} not in the contract"
    schema = {**answer["content"]["application/json"]["schema"],
              "components": DOCUMENT["components"]}
    Draft202012Validator(schema).validate(response.body)


def test_every_answer_of_the_routes_is_in_the_contract() -> None:
    view, history = view_of(("t1", "r1", [user("m1"), user("m2")]))
    feed_failed = history.run("t1", "r2", [], outcome="failed", failure={"code": "x"})
    for record in feed_failed:
        view.apply(record)
    api = ThreadApi(view, TOKENS, max_wait=0.01, eraser=eraser(view, history))

    def run(call: Any) -> ApiResponse:
        return asyncio.run(call)

    messages, runs, one = ("/v1/threads/{threadId}/messages", "/v1/threads/{threadId}",
                           "/v1/threads/{threadId}/runs/{runId}")
    for query in ({}, {"limit": "1"}, {"run": "r2"}, {"run": "r9"}, {"limit": "0"},
                  {"after": "nope"}, {"min_offset": "999"}):
        conforms(run(api.messages(ACME, "t1", query)), messages)
        conforms(run(api.runs(ACME, "t1", query)), runs)
    conforms(run(api.messages(GLOBEX, "t1", {})), messages)
    conforms(run(api.messages("Bearer nope", "t1", {})), messages)
    conforms(run(ThreadApi(view, None).messages(ACME, "t1", {})), messages)
    conforms(run(ThreadApi(view, TOKENS, ready=lambda p: False).runs(ACME, "t1", {})), runs)
    for run_id in ("r1", "r2", "r9"):
        conforms(run(api.run(ACME, "t1", run_id, {})), one)
    conforms(run(api.delete(ACME, "t1", {})), runs, "delete")
    conforms(run(api.delete(ACME, "t1", {})), runs, "delete")  # 404 now


@pytest.mark.parametrize("path", list(DOCUMENT["paths"]))
def test_every_route_requires_a_bearer_token(path: str) -> None:
    assert DOCUMENT["security"] == [{"bearer": []}]
    for operation in DOCUMENT["paths"][path].values():
        assert "401" in operation["responses"]


def test_the_client_reads_every_field_the_contract_gives_a_run() -> None:
    contract = set(DOCUMENT["components"]["schemas"]["RunSummary"]["properties"])
    client = {field.alias or name for name, field in RunSummary.model_fields.items()}
    assert client == contract
