"""Pydantic AI against `colibri api`: an agent with one tool on the Chat Completions model and
on the Responses model. The first step forces the tool (the demo model is tiny; a callable
`model_settings` varies `tool_choice` by step), the tool's result goes back, and the model
answers. Exits non-zero at the first failed check."""

import sys
from typing import Annotated, Literal

import pydantic

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from common import KEY, MODEL, URL, check_weather, weather

provider = OpenAIProvider(base_url=URL + "/v1", api_key=KEY)
calls = []


def settings(ctx):
    # Step 1 is the first model request: the tool is forced there only.
    forced = ctx.run_step <= 1
    return {"tool_choice": ["get_weather"] if forced else "auto", "max_tokens": 100 if forced else 16, "temperature": 0}


for how, model in (
    ("chat completions", OpenAIChatModel(MODEL, provider=provider)),
    ("responses", OpenAIResponsesModel(MODEL, provider=provider)),
):
    agent = Agent(model, instructions="Answer with the weather.", model_settings=settings)

    @agent.tool_plain
    def get_weather(city: Annotated[str, pydantic.Field(max_length=12)], unit: Literal["celsius", "fahrenheit"]) -> str:
        """Weather for a city."""
        calls.append({"city": city, "unit": unit})
        return weather(city, unit)

    result = agent.run_sync("Weather in Paris?")
    assert len(calls) == 1, (how, calls)
    check_weather(calls[0])
    kinds = [p.part_kind for m in result.all_messages() for p in m.parts]
    assert "tool-call" in kinds and "tool-return" in kinds, (how, kinds)
    assert isinstance(result.output, str), (how, result.output)
    print(f"{how}: called get_weather({calls[0]}), answered {result.output!r}")
    calls.clear()
print("pydantic-ai: ok")
sys.exit(0)
