"""LangChain's `ChatOpenAI` against `colibri api`: a `bind_tools` tool loop (the call forced
on the first turn, the tool's result in a ToolMessage, then the answer), the same over the
Responses API (`use_responses_api=True`), and `with_structured_output` of a Pydantic model.
Exits non-zero at the first failed check."""

import sys
from typing import Annotated, Literal

import pydantic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from common import KEY, MODEL, URL, check_weather, weather


@tool
def get_weather(city: Annotated[str, pydantic.Field(max_length=12)], unit: Literal["celsius", "fahrenheit"]) -> str:
    """Weather for a city."""
    return weather(city, unit)


def loop(how, **kw):
    messages = [HumanMessage("Weather in Paris?")]
    # A forced call needs room for its JSON; the answer after it gets a short budget.
    first = llm(max_tokens=100, **kw).bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    assert len(first.tool_calls) == 1, (how, first)
    call = first.tool_calls[0]
    assert call["name"] == "get_weather", (how, call)
    check_weather(call["args"])
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm(**kw).bind_tools([get_weather]).invoke(messages)
    assert not answer.tool_calls, (how, answer)
    assert answer.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"], (how, answer)
    print(f"{how}: called get_weather({call['args']}), answered {answer.text!r}")


def llm(max_tokens=16, **kw):
    return ChatOpenAI(
        model=MODEL, base_url=URL + "/v1", api_key=KEY, max_retries=0, temperature=0, max_tokens=max_tokens, **kw
    )


loop("chat completions")
loop("responses", use_responses_api=True)


class Person(pydantic.BaseModel):
    """A person."""

    # Bounded, so the demo model's name ends within the budget.
    name: str = pydantic.Field(max_length=16)
    age: int


for method in ("json_schema", "function_calling"):
    p = llm(max_tokens=200).with_structured_output(Person, method=method).invoke("A person")
    assert isinstance(p, Person), (method, p)
    print(f"with_structured_output ({method}):", p)
print("langchain: ok")
sys.exit(0)
