"""The `openai` SDK's Responses API against `colibri api`: create, stream, a function call's
round trip and a parsed `text_format`. Exits non-zero at the first failed check."""

import json
import sys

import openai
import pydantic

from common import KEY, MODEL, URL, WEATHER, check_weather, weather

client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0)

r = client.responses.create(model=MODEL, input="In the beginning", max_output_tokens=16, temperature=0)
assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
assert r.usage.output_tokens == 16 and r.usage.input_tokens > 0, r.usage
text = r.output_text
assert text, r

# The stream: the same text, ending `response.incomplete` (the budget cut it) with the
# whole response.
events = list(client.responses.create(model=MODEL, input="In the beginning", max_output_tokens=16, temperature=0, stream=True))
kinds = [e.type for e in events]
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] == "response.incomplete", kinds
deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
assert "".join(deltas) == text, (deltas, text)
assert events[-1].response.output_text == text, events[-1]
assert [e.sequence_number for e in events] == list(range(len(events))), events

# A function call and its output going back; the SDK's stream helper reads the forced call
# (it needs `response.completed`, which a call that ends by itself gets).
tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER, "strict": False}]
history = [{"role": "user", "content": "Weather in Paris?"}]
forced = {"type": "function", "name": "get_weather"}
r = client.responses.create(model=MODEL, input=history, tools=tools, tool_choice=forced, max_output_tokens=100, temperature=0)
assert r.status == "completed", r
calls = [o for o in r.output if o.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "get_weather", r.output
args = json.loads(calls[0].arguments)
check_weather(args)
with client.responses.stream(model=MODEL, input=history, tools=tools, tool_choice=forced, max_output_tokens=100, temperature=0) as s:
    arg_deltas = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
    final = s.get_final_response()
assert final.output[0].arguments == arg_deltas == calls[0].arguments, (final, arg_deltas)
history += [o.model_dump(exclude_none=True) for o in r.output]
history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": weather(**args)})
answer = client.responses.create(model=MODEL, input=history, tools=tools, max_output_tokens=12, temperature=0)
assert answer.output and answer.usage.input_tokens > r.usage.input_tokens, answer
print("answer after the tool:", repr(answer.output_text))


# Structured output through the SDK's parse helper (a flat model: see common.WEATHER).
class Person(pydantic.BaseModel):
    # Bounded, so the demo model's name ends within the budget.
    name: str = pydantic.Field(max_length=16)
    age: int


p = client.responses.parse(model=MODEL, input="A person", text_format=Person, max_output_tokens=200, temperature=0)
assert isinstance(p.output_parsed, Person), p
print("parsed:", p.output_parsed)

# Stateless: a previous_response_id is refused with the SDK's 400.
try:
    client.responses.create(model=MODEL, input="Hi", previous_response_id=r.id)
    raise AssertionError("previous_response_id was accepted")
except openai.BadRequestError as e:
    assert "stores no responses" in str(e), e
print("openai responses: ok")
sys.exit(0)
