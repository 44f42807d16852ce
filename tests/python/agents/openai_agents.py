"""The OpenAI Agents SDK (`openai-agents`) against `colibri api`: an agent with one function
tool, on the Responses model (run and streamed) and on the Chat Completions model. The first
turn forces the tool (the demo model is tiny); the SDK resets tool_choice after the call, and
the model answers from the tool's output in a small structured form: an answer the budget
cuts is `incomplete`, which the SDK raises on, and a schema's answer ends by itself. Exits
non-zero at the first failed check."""

import asyncio
import sys
from typing import Annotated, Literal

import pydantic

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from common import KEY, MODEL, URL, check_weather, weather

set_tracing_disabled(True)
calls = []


@function_tool
def get_weather(city: Annotated[str, pydantic.Field(max_length=12)], unit: Literal["celsius", "fahrenheit"]) -> str:
    """Weather for a city."""
    calls.append({"city": city, "unit": unit})
    return weather(city, unit)


class Report(pydantic.BaseModel):
    sunny: bool


def agent(model):
    return Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=model,
        output_type=Report,
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=100, temperature=0),
    )


def check_loop(result, how):
    assert len(calls) == 1, (how, calls)
    check_weather(calls[0])
    kinds = [i.type for i in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], (how, kinds)
    assert kinds[-1] == "message_output_item", (how, kinds)
    assert isinstance(result.final_output, Report), (how, result.final_output)
    print(f"{how}: called get_weather({calls[0]}), answered {result.final_output!r}")
    calls.clear()


async def main():
    client = AsyncOpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0)
    responses = OpenAIResponsesModel(model=MODEL, openai_client=client)
    chat = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    check_loop(await Runner.run(agent(responses), "Weather in Paris?", max_turns=4), "responses")
    streamed = Runner.run_streamed(agent(responses), "Weather in Paris?", max_turns=4)
    async for _ in streamed.stream_events():
        pass
    check_loop(streamed, "responses, streamed")
    check_loop(await Runner.run(agent(chat), "Weather in Paris?", max_turns=4), "chat completions")


asyncio.run(main())
print("openai-agents: ok")
sys.exit(0)
