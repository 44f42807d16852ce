#!/usr/bin/env python3
"""Writes tests/fixtures/dsv4-chat-cases.json: conversations rendered by DeepSeek-V4's
published prompt encoder (`encoding/encoding_dsv4.py` of the DeepSeek-V4 checkpoints), the
bytes `engine/chat_dsv4.rs` must reproduce.

DeepSeek's file is not part of this repository: pass its path.

    python scripts/dsv4_encoding_cases.py PATH/TO/encoding_dsv4.py

The copy read was supermy/ds4rs `encoding/encoding_dsv4.py` @ 2ecc534c (DeepSeek's logic with
Chinese docstrings added; sfxnz/DeepSeek-V4-Flash-Vision-Exp-vLLM-2x-DGX-Spark's copy is
patched for images and other effort levels).

The encoder takes the tools on a message; an OpenAI request carries them beside the
messages. As vLLM's DeepSeek-V4 tokenizer does (in its later form), they go on the first
message when it is a system message, else on a new empty system message put first. The
thinking switch is `thinking_mode` ("thinking" or "chat"); drop_thinking is the encoder's
default (True; it turns itself off when tools are present). A case may carry the request's
`reasoning_effort` ("max" or "high", the values the encoder takes; null: none), and
assistant messages their earlier reasoning (`reasoning_content`, as DeepSeek's API names it).
"""

import importlib.util
import json
import os
import sys

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather of a city, in °C",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CASES = [
    ("one_user_turn", [{"role": "user", "content": "Hi"}], None),
    ("system_and_history", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke, ünïcode ok."},
    ], None),
    ("tools_without_system", [
        {"role": "user", "content": "Weather in Paris?"},
    ], TOOLS),
    ("tool_round_trip", [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris for 2 days, and news?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            call("call_1", "get_weather", json.dumps({"city": "Paris", "days": 2})),
            call("call_2", "search", json.dumps({"q": "news \"today\""})),
        ]},
        # Results out of call order: the encoder sorts them by the calls' ids.
        {"role": "tool", "tool_call_id": "call_2", "content": "No news."},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18"},
    ], TOOLS),
    ("calls_without_content_then_answer_then_user", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("c1", "get_weather", json.dumps(
                {"city": "Zürich", "opts": {"units": ["C", "F"], "raw": True}, "n": 1.5},
                ensure_ascii=False)),
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
        {"role": "user", "content": "Thanks"},
    ], TOOLS),
    ("tool_result_then_user_text_merge", [
        {"role": "user", "content": "Search cats"},
        {"role": "assistant", "content": "", "tool_calls": [call("s", "search", "not json")]},
        {"role": "tool", "tool_call_id": "s", "content": "cats are cute"},
        {"role": "user", "content": "And dogs?"},
    ], TOOLS),
    ("multi_turn_no_tools", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ], None),
    # reasoning_effort: "max" writes the preamble before the first message in thinking mode
    # only; "high" writes nothing.
    ("effort_max_one_turn", [{"role": "user", "content": "Hi"}], None, "max"),
    ("effort_max_system_and_history", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Prove it."},
    ], None, "max"),
    ("effort_max_tools_without_system", [
        {"role": "user", "content": "Weather in Paris?"},
    ], TOOLS, "max"),
    ("effort_high_system", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ], None, "high"),
    # Earlier reasoning passed back: without tools the answers before the last user turn lose
    # it; an answer after it (the last message) keeps it.
    ("reasoning_before_the_last_user_turn", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "think about a"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "reasoning_content": "now c\nin two lines"},
    ], None),
    # With tools every answer keeps its reasoning: a call's, the answer after its result's,
    # and the ones of earlier user turns.
    ("reasoning_in_a_tool_loop", [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I need the weather tool.",
         "tool_calls": [call("w1", "get_weather", json.dumps({"city": "Paris"}))]},
        {"role": "tool", "tool_call_id": "w1", "content": "sunny, 18"},
        {"role": "assistant", "content": "Sunny, 18 °C.",
         "reasoning_content": "The tool said sunny."},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call again, days=2.",
         "tool_calls": [call("w2", "get_weather", json.dumps({"city": "Paris", "days": 2}))]},
        {"role": "tool", "tool_call_id": "w2", "content": "rain"},
    ], TOOLS),
    ("reasoning_in_a_tool_loop_at_max", [
        {"role": "user", "content": "Search cats"},
        {"role": "assistant", "content": "", "reasoning_content": "Search.",
         "tool_calls": [call("s", "search", json.dumps({"q": "cats"}))]},
        {"role": "tool", "tool_call_id": "s", "content": "cats are cute"},
    ], TOOLS, "max"),
]


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    enc = load_encoder(sys.argv[1])
    out = []
    for name, messages, tools, *rest in CASES:
        effort = rest[0] if rest else None
        for mode in ("chat", "thinking"):
            msgs = [dict(m) for m in messages]
            if tools:
                if msgs and msgs[0]["role"] == "system":
                    msgs[0]["tools"] = tools
                else:
                    msgs.insert(0, {"role": "system", "tools": tools})
            expected = enc.encode_messages(msgs, thinking_mode=mode, reasoning_effort=effort)
            out.append({"name": name, "thinking": mode == "thinking",
                        "reasoning_effort": effort,
                        "messages": messages, "tools": tools or [],
                        "expected": expected})
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    path = os.path.join(root, "tests", "fixtures", "dsv4-chat-cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} cases -> {path}")


if __name__ == "__main__":
    main()
