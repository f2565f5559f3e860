"""A real AG-UI agent server for the demo and the tap's tests: pydantic-ai's
`AGUIAdapter` in a Starlette app on uvicorn, its model a `FunctionModel` (no
network, no model) that reasons, calls a tool and answers.

`python -m processors.tools.sample_agent PORT` serves `POST /agent` on 127.0.0.1:PORT.
A user message containing `slow` gets a long answer streamed a delta every
50 ms instead (for cutting a run in the middle).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import uvicorn
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.ui.ag_ui import AGUIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

SLOW_DELTAS = 400
ANSWER = ("The ", "weather ", "in ", "Paris ", "is ", "sunny.")


def _last_prompt(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


async def model_stream(messages: list[ModelMessage], _info: AgentInfo,
                       ) -> AsyncIterator[str | DeltaToolCalls | DeltaThinkingCalls]:
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart)
                                              for p in last.parts):
        for word in ANSWER:
            yield word
        return
    if "slow" in _last_prompt(messages):
        for index in range(SLOW_DELTAS):
            await asyncio.sleep(0.05)
            yield f"word{index} "
        return
    yield {0: DeltaThinkingPart(content="The user wants ")}
    yield {0: DeltaThinkingPart(content="the weather.", signature="opaque-signature-1")}
    yield {1: DeltaToolCall(name="weather", json_args='{"city": ', tool_call_id="call-1")}
    yield {1: DeltaToolCall(json_args='"Paris"}')}


agent = Agent(FunctionModel(stream_function=model_stream))


@agent.tool_plain
def weather(city: str) -> str:
    return f"sunny in {city}"


async def run_agent(request: Request) -> Response:
    return await AGUIAdapter.dispatch_request(request, agent=agent)


app = Starlette(routes=[Route("/agent", run_agent, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
