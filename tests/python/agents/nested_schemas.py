"""Pydantic models as clients write them, with what a flat schema lacks: a nested model
(`$defs`/`$ref`), bounds (`minimum`/`maximum`) and a `pattern`, through the `openai` SDK's
`responses.parse` and a forced tool call, and LangChain's `with_structured_output`.

Until the server's JSON Schema support takes those keywords it refuses such a schema with a
422 naming the keyword; this script then says so and exits 77, which `agent_clients` reports
as skipped. Any other failure exits non-zero as usual."""

import json
import sys
from typing import Annotated

import openai
import pydantic

from common import KEY, MODEL, URL


class Item(pydantic.BaseModel):
    sku: Annotated[str, pydantic.Field(pattern=r"^[A-Z]{3}[0-9]{2}$")]
    quantity: Annotated[int, pydantic.Field(ge=1, le=9)]


class Order(pydantic.BaseModel):
    customer: Annotated[str, pydantic.Field(max_length=16)]
    items: Annotated[list[Item], pydantic.Field(min_length=1, max_length=2)]


def check(order):
    assert isinstance(order, Order), order
    for item in order.items:
        assert 1 <= item.quantity <= 9, item


client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0)
try:
    r = client.responses.parse(model=MODEL, input="An order", text_format=Order, max_output_tokens=300, temperature=0)
except openai.UnprocessableEntityError as e:
    if "unsupported keyword" in str(e) or "$ref" in str(e):
        print(f"SKIPPED: the server does not take this schema yet: {e}")
        sys.exit(77)
    raise
check(r.output_parsed)
print("responses.parse:", r.output_parsed)
tools = [{"type": "function", "name": "place_order", "parameters": Order.model_json_schema(), "strict": False}]
r = client.responses.create(
    model=MODEL, input="Order something", tools=tools, tool_choice={"type": "function", "name": "place_order"},
    max_output_tokens=300, temperature=0,
)
check(Order.model_validate(json.loads(r.output[0].arguments)))
print("forced call:", r.output[0].arguments)
try:
    from langchain_openai import ChatOpenAI
except ImportError:
    print("langchain_openai missing: its part skipped")
else:
    llm = ChatOpenAI(model=MODEL, base_url=URL + "/v1", api_key=KEY, max_retries=0, temperature=0, max_tokens=300)
    check(llm.with_structured_output(Order, method="json_schema").invoke("An order"))
print("nested schemas: ok")
sys.exit(0)
