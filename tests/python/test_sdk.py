"""The official `openai` and `anthropic` Python SDKs against a running `colibri api`.

Run by tests/tests/api.rs (`sdk_clients`) with COLI_API_URL, COLI_API_KEY and COLI_MODEL set;
exits non-zero at the first failed check.
"""

import json
import os
import sys

import anthropic
import openai

URL = os.environ["COLI_API_URL"]
KEY = os.environ["COLI_API_KEY"]
MODEL = os.environ.get("COLI_MODEL", "colibri-demo")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
}


def check_weather(args):
    assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
    assert args["unit"] in ("celsius", "fahrenheit"), args
    assert isinstance(args["days"], int), args


def test_openai():
    client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    msgs = [{"role": "user", "content": "In the beginning"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length", r
    assert r.usage.prompt_tokens > 0
    # Streaming gives the same text.
    parts = []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == text, (parts, text)
    # A stop string.
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=16, temperature=0, stop=[stop]
    )
    assert cut.choices[0].message.content == text[: text.index(stop)], (cut, stop)
    # A forced tool call parses and matches its schema.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
        temperature=0,
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    check_weather(json.loads(call.function.arguments))
    # Its result goes back.
    msgs2 = [
        {"role": "user", "content": "Weather in Paris?"},
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    client.chat.completions.create(model=MODEL, messages=msgs2, tools=tools, max_tokens=4)
    # JSON schema output validates.
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person"}],
        max_tokens=300,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
                    "required": ["name", "age"],
                },
            },
        },
    )
    person = json.loads(r.choices[0].message.content)
    assert isinstance(person["name"], str) and isinstance(person["age"], int), person
    # Legacy completions.
    r = client.completions.create(model=MODEL, prompt="In the beginning", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8
    # Any model name is served by the loaded model (what tools send at a local base URL),
    # and the response names the real one.
    r = client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    assert r.model == MODEL, r.model
    # Errors surface as the SDK's exceptions.
    bad = openai.OpenAI(base_url=URL + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def test_anthropic():
    client = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "In the beginning"}]
    # Recent SDKs dropped the sampling parameters from their signatures; the API still
    # takes them, sent as extra body fields.
    greedy = {"temperature": 0}
    m = client.messages.create(model=MODEL, max_tokens=16, messages=msgs, system="Be brief.", extra_body=greedy)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 16, m
    text = m.content[0].text
    # count_tokens is the prompt that call read: its uncached and cached tokens together.
    n = client.messages.count_tokens(model=MODEL, messages=msgs, system="Be brief.").input_tokens
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m.usage)
    with client.messages.stream(
        model=MODEL, max_tokens=16, messages=msgs, system="Be brief.", extra_body=greedy
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text, (streamed, text)
    assert final.stop_reason == "max_tokens"
    m = client.messages.create(
        model=MODEL,
        max_tokens=200,
        extra_body=greedy,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"][0]
    check_weather(use.input)
    back = client.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ],
        tools=[{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}],
    )
    assert back.usage.input_tokens > 0
    try:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "robot", "content": "x"}])
        raise AssertionError("a bad role was accepted")
    except anthropic.UnprocessableEntityError:
        pass


if __name__ == "__main__":
    test_openai()
    print("openai SDK: ok")
    test_anthropic()
    print("anthropic SDK: ok")
    sys.exit(0)
