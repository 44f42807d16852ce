"""What every client script shares: the server's address, key and model (set by
tests/tests/api_responses.rs `agent_clients`), the weather tool's schema and its check."""

import os

URL = os.environ["COLI_API_URL"]
KEY = os.environ["COLI_API_KEY"]
MODEL = os.environ.get("COLI_MODEL", "colibri-demo")

# A schema the grammar takes as it is (no $defs/$ref, minimum or pattern).
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}


def check_weather(args):
    assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
    assert args["unit"] in ("celsius", "fahrenheit"), args


def weather(city, unit):
    """The tool itself: a fixed answer the next turn reads."""
    return f"sunny, 21 degrees {unit} in {city}"
