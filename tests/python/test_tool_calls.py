"""A K3 tool-call round trip on the chat endpoint. The built-in model cannot call tools, so the
server runs with `--test-forced-completion`: every request generates the K3 completion below
(spec §10.3 grammar), then EOS. The server must parse it into `tool_calls` with typed arguments,
and accept the follow-up turn carrying the call and its result.
"""
import json

import pytest

from conftest import ServerProcess

import openai  # scripts/python_deps.sh installs it

COMPLETION = (
    "I should look the weather up.<|close|>think<|sep|>"
    "<|open|>response<|sep|><|close|>response<|sep|>"
    "<|open|>tools<|sep|>"
    '<|open|>call tool="get_weather" index="1"<|sep|>'
    '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
    '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>'
    "<|close|>call<|sep|>"
    "<|close|>tools<|sep|><|close|>message<|sep|>"
)

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}]


@pytest.fixture(scope="module")
def forced_server():
    s = ServerProcess(["--test-forced-completion", COMPLETION])
    yield s
    assert s.stop() == 0


def test_tool_call_round_trip(forced_server):
    client = openai.OpenAI(base_url=forced_server.base_url + "/v1", api_key="none")
    messages = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    r = client.chat.completions.create(model="kimirt-builtin", messages=messages, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert getattr(choice.message, "reasoning_content", None) == "I should look the weather up."

    # Streaming gives the same call.
    chunks = list(client.chat.completions.create(model="kimirt-builtin", messages=messages, tools=TOOLS,
                                                 max_tokens=200, stream=True))
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])] if chunks else []
    names = [tc.function.name for tc in streamed if tc.function and tc.function.name]
    args = "".join(tc.function.arguments or "" for tc in streamed if tc.function)
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls" or any(
        c.choices and c.choices[0].finish_reason == "tool_calls" for c in chunks)

    # The next turn carries the assistant's call and the tool's result; it must render and run.
    follow = messages + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})},
    ]
    r2 = client.chat.completions.create(model="kimirt-builtin", messages=follow, tools=TOOLS, max_tokens=200)
    assert r2.choices[0].finish_reason == "tool_calls"
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
