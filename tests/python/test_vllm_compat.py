"""Issue 11: `kimirt serve` as a drop-in for `vllm serve`, driven by the official `openai` client
and plain HTTP on 127.0.0.1 against the built-in model.

Covers the defects found against vLLM's behaviour (reasoning that stopped streaming after a bare
<|open|>, unseeded n > 1 repeating itself, parameters silently ignored, errors without `param`)
and the vLLM-side surface: --api-key / $VLLM_API_KEY, --seed, X-Request-Id, CORS, /tokenize,
/detokenize, /version, vllm:* metrics, `kimirt --version`, refused parser names.
"""
import json
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import ServerProcess, kimirt_binary

import openai  # scripts/python_deps.sh installs it

MODEL = "kimirt-builtin"
PROMPT = "The capital of France is"

# K3 output (spec §10.3) with a bare <|open|> before the reasoning, and a special token (not
# an XTML marker) inside the answer.
FORCED = ("<|open|>The user asks about Paris, so I look at the forecast for the next three days."
          "<|close|>think<|sep|><|open|>response<|sep|>Sunny<|media_begin|> today.<|close|>response<|sep|>"
          "<|close|>message<|sep|>")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def forced_server():
    s = ServerProcess(["--test-forced-completion", FORCED])
    yield s
    assert s.stop() == 0


def http(base_url, method, path, body=None, headers=None):
    """(status, headers, body text) of one request; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def bad_request_param(fn):
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    return e.value.body["param"]


# --- Defect 6 --------------------------------------------------------------------------------

def test_reasoning_streams_after_a_bare_open_marker(forced_server):
    c = openai.OpenAI(base_url=forced_server.base_url + "/v1", api_key="none", max_retries=0)
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                            max_tokens=200, stream=True))
    pieces = [getattr(ch.choices[0].delta, "reasoning_content", None) for ch in chunks if ch.choices]
    pieces = [p for p in pieces if p]
    reasoning = "".join(pieces)
    assert reasoning == "The user asks about Paris, so I look at the forecast for the next three days."
    assert "<|open|>" not in reasoning
    assert len(pieces) > 5, pieces  # streamed token by token, not in one piece at the end
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == "Sunny today."


# --- Defect 7 --------------------------------------------------------------------------------

def unseeded_n2(c):
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=2, temperature=1.0,
                             extra_body={"ignore_eos": True})
    return [ch.text for ch in r.choices]


def test_unseeded_n2_differs_between_requests(client):
    a, b = unseeded_n2(client), unseeded_n2(client)
    assert a != b
    assert a[0] != a[1]


def test_server_seed_replays_unseeded_requests():
    runs = []
    for _ in range(2):
        s = ServerProcess(["--seed", "3"])
        try:
            c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
            runs.append([unseeded_n2(c), unseeded_n2(c)])
        finally:
            assert s.stop() == 0
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]


# --- Defect 8 --------------------------------------------------------------------------------

def test_min_tokens_holds_back_stop_tokens(client):
    # Token 300 is pushed to the top and made a stop token: it ends the completion at once...
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logit_bias={"300": 100})
    r = client.completions.create(extra_body={"stop_token_ids": [300]}, **kw)
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    # ...unless min_tokens forbids it for the first 4 tokens.
    r = client.completions.create(extra_body={"stop_token_ids": [300], "min_tokens": 4}, **kw)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop"


def test_include_stop_str_in_output(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    out = client.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].text
    assert len(out) >= 4, out
    stop = out[len(out) // 2:len(out) // 2 + 2]
    cut = out[:out.find(stop)]
    r = client.completions.create(stop=[stop], extra_body={"ignore_eos": True}, **kw)
    assert r.choices[0].text == cut
    r = client.completions.create(stop=[stop], extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
                                  **kw)
    assert r.choices[0].text == cut + stop
    chunks = list(client.completions.create(stop=[stop], stream=True, extra_body={
        "ignore_eos": True, "include_stop_str_in_output": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut + stop


def test_skip_special_tokens_false_keeps_them(forced_server):
    c = openai.OpenAI(base_url=forced_server.base_url + "/v1", api_key="none", max_retries=0)
    kept = c.completions.create(model=MODEL, prompt="x", max_tokens=200, extra_body={"skip_special_tokens": False})
    assert "Sunny<|media_begin|> today." in kept.choices[0].text
    skipped = c.completions.create(model=MODEL, prompt="x", max_tokens=200)
    assert "Sunny today." in skipped.choices[0].text


def test_tool_choice_none_returns_no_tool_calls():
    completion = ("<|close|>think<|sep|><|open|>response<|sep|>No tools.<|close|>response<|sep|><|open|>tools<|sep|>"
                  '<|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
                  "<|close|>message<|sep|>")
    s = ServerProcess(["--test-forced-completion", completion])
    try:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        msgs = [{"role": "user", "content": "hi"}]
        auto = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=100)
        assert auto.choices[0].finish_reason == "tool_calls"
        none = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, tool_choice="none", max_tokens=100)
        assert not none.choices[0].message.tool_calls
        assert none.choices[0].finish_reason == "stop"
        assert none.choices[0].message.content == "No tools."
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("extra,param", [
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}}}, "response_format"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
])
def test_unsupported_parameters_are_refused_by_name(client, extra, param):
    assert bad_request_param(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body=extra)) == param


# --- Defect 9 --------------------------------------------------------------------------------

def test_validation_errors_name_the_field(client):
    assert bad_request_param(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        tools=[{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}])) \
        == "tools[0].function.parameters"
    assert bad_request_param(lambda: client.completions.create(
        model=MODEL, prompt="x", max_tokens=2, stop=[str(i) for i in range(17)])) == "stop"
    assert bad_request_param(lambda: client.completions.create(
        model=MODEL, prompt=[1, 2, 10 ** 7], max_tokens=2)) == "prompt[2]"


# --- vLLM surface ----------------------------------------------------------------------------

@pytest.mark.parametrize("args,env", [(["--api-key", "sk-flag"], None), ([], {"VLLM_API_KEY": "sk-flag"}),
                                      ([], {"KIMIRT_API_KEY": "sk-flag"})])
def test_api_key(args, env):
    s = ServerProcess(args, env=env)
    try:
        wrong = openai.OpenAI(base_url=s.base_url + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        status, _, _ = http(s.base_url, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 401
        right = openai.OpenAI(base_url=s.base_url + "/v1", api_key="sk-flag", max_retries=0)
        assert right.completions.create(model=MODEL, prompt="x", max_tokens=1).usage.completion_tokens == 1
        assert http(s.base_url, "GET", "/health")[0] == 200  # probes stay open
    finally:
        assert s.stop() == 0


def test_request_id_and_cors(server):
    status, headers, _ = http(server.base_url, "GET", "/v1/models",
                              headers={"X-Request-Id": "trace-1", "Origin": "https://ui.example"})
    assert status == 200
    assert headers["X-Request-Id"] == "trace-1"
    assert headers["Access-Control-Allow-Origin"] == "*"


def test_cors_preflight(server):
    # Needs a transport that routes OPTIONS (the replacement transport of issue 11 does).
    status, headers, _ = http(server.base_url, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in headers["Access-Control-Allow-Methods"]


def test_tokenize_detokenize_version(server, client):
    status, _, body = http(server.base_url, "POST", "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert status == 200
    tok = json.loads(body)
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] > 0
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert r.usage.prompt_tokens == tok["count"]
    status, _, body = http(server.base_url, "POST", "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and json.loads(body)["prompt"] == PROMPT

    messages = [{"role": "user", "content": "Hi there"}]
    chat = json.loads(http(server.base_url, "POST", "/tokenize", {"messages": messages})[2])
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert r.usage.prompt_tokens == chat["count"]

    status, _, body = http(server.base_url, "GET", "/version")
    version = json.loads(body)["version"]
    assert status == 200 and version
    out = subprocess.run([str(kimirt_binary()), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"kimirt {version}"


def test_metrics_use_vllm_names(server, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    _, text = server.get("/metrics")
    label = f'{{model_name="{MODEL}"}}'
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count"]:
        assert name + label in text, name
    assert f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}}' in text
    m = server.metrics()
    assert m["vllm:generation_tokens_total"] >= 3 and 0 <= m["vllm:kv_cache_usage_perc"] <= 1


def test_request_and_stats_log_lines():
    s = ServerProcess([])
    try:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_headers={"X-Request-Id": "logged-1"})
    finally:
        assert s.stop() == 0
    log = "".join(s.stderr_lines)
    assert "POST /v1/completions 200" in log and "request_id=logged-1" in log
    quiet = ServerProcess(["--disable-log-requests", "--log-level", "warning"])
    try:
        c = openai.OpenAI(base_url=quiet.base_url + "/v1", api_key="none", max_retries=0)
        c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    finally:
        assert quiet.stop() == 0
    assert "POST /v1/completions" not in "".join(quiet.stderr_lines)


def test_vllm_command_line_is_accepted():
    s = ServerProcess(["--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3",
                       "--default-chat-template-kwargs", '{"thinking": false}', "--allowed-origins", '["*"]'])
    try:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      temperature=0)
        # Thinking off by default: what the model says is the answer, not reasoning.
        assert getattr(r.choices[0].message, "reasoning_content", None) is None
    finally:
        assert s.stop() == 0
    for bad in (["--reasoning-parser", "deepseek_r1"], ["--tool-call-parser", "hermes"],
                ["--default-chat-template-kwargs", "[1]"]):
        out = subprocess.run([str(kimirt_binary()), "serve", "--port", "0", *bad], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode != 0
        assert bad[0] in out.stderr or "chat-template-kwargs" in out.stderr, out.stderr
