"""`kimirt serve` driven by the official `openai` client (issue 5, "Must show").

Runs against the built-in model: completions and chat, streaming and not, n=2, stop strings,
logprobs, usage numbers, error statuses, and a client that disconnects mid-stream. Usage is
checked against the tokenizer's own count as the server reports it: with echo and logprobs the
prompt's tokens are listed one by one (the first with a null logprob, the rest scored), so
usage.prompt_tokens must equal their number; with ignore_eos the completion is exactly
max_tokens tokens.

Skipped as a whole when `openai` is not installed or the binary is not built.
"""
import json
import os
import random
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import openai  # scripts/python_deps.sh installs it

MODEL = "kimirt-builtin"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(client, prompt=PROMPT, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=prompt, **kw)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_usage_matches_tokens(client):
    r = greedy(client, echo=True, logprobs=0, max_tokens=7, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    n_prompt = len(lp.tokens) - 7
    assert r.usage.prompt_tokens == n_prompt > 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0.0 for x in lp.token_logprobs[1:])
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert choice.finish_reason == "length"
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_completion_logprobs(client):
    r = greedy(client, logprobs=3, max_tokens=5, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0.0
        assert 3 <= len(top) <= 4  # the top 3 plus the sampled token when it is not among them
        assert token in top
        # Greedy picks the most likely token: none of the top ones beats it.
        assert max(top.values()) <= logprob + 1e-5
    assert lp.text_offset[0] == len(PROMPT)


def test_completion_stream_equals_non_stream(client):
    full = greedy(client, max_tokens=10)
    chunks = list(greedy(client, max_tokens=10, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_prompt_list_and_token_ids(client):
    by_text = greedy(client, max_tokens=4)
    ids_echo = greedy(client, max_tokens=1, echo=True, logprobs=0)
    n_prompt = ids_echo.usage.prompt_tokens
    r = client.completions.create(model=MODEL, prompt=[PROMPT, "Once upon a time"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == by_text.choices[0].text
    assert r.usage.prompt_tokens > n_prompt
    assert n_prompt == len(ids_echo.choices[0].logprobs.tokens) - 1


def test_echo_scores_the_prompt_as_decoding_scored_it(client):
    # lm-eval's loglikelihood request (echo, logprobs=1, max_tokens=1) over a prompt that ends
    # with what greedy decoding produced: each of those tokens' prompt logprob (from a chunked
    # prefill) must equal the logprob it had when decoded one step at a time, and be the top one.
    # That needs the prompt + continuation text to re-tokenize to the same tokens, which BPE does
    # not promise for every continuation: the first of a few prompts for which it holds is used.
    for prompt in (PROMPT, "Once upon a time", "Question: what is 2 + 3?\nAnswer:", "Hello", "The"):
        gen = greedy(client, prompt=prompt, max_tokens=6, logprobs=0, extra_body={"ignore_eos": True})
        tokens, logprobs = gen.choices[0].logprobs.tokens, gen.choices[0].logprobs.token_logprobs
        r = greedy(client, prompt=prompt + gen.choices[0].text, max_tokens=1, echo=True, logprobs=1)
        lp = r.choices[0].logprobs
        scored = slice(len(lp.tokens) - 1 - len(tokens), len(lp.tokens) - 1)
        if lp.tokens[scored] == tokens:
            break
    else:
        pytest.fail("no prompt's greedy continuation re-tokenized to the same tokens")
    for got, want, top, token in zip(lp.token_logprobs[scored], logprobs, lp.top_logprobs[scored], tokens):
        assert got == pytest.approx(want, abs=1e-3)
        assert max(top.values()) <= got + 1e-5  # greedy: nothing scored above it
        assert token in top
    assert r.choices[0].text.startswith(prompt + gen.choices[0].text)


def test_n2_seeded(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, n=2, temperature=1.0, seed=1234,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # reproducible per seed
    assert a.usage.completion_tokens == 16
    streamed = list(client.completions.create(stream=True, **kw))
    texts = {0: "", 1: ""}
    for c in streamed:
        for ch in c.choices:
            texts[ch.index] += ch.text
    assert [texts[0], texts[1]] == [c.text for c in a.choices]


def test_stop_string(client):
    out = greedy(client, max_tokens=16, extra_body={"ignore_eos": True}).choices[0].text
    assert len(out.strip()) >= 6, f"the built-in model's continuation is too short to cut: {out!r}"
    stop = out[len(out) // 2:len(out) // 2 + 2]
    r = greedy(client, max_tokens=16, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == out[:out.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(greedy(client, max_tokens=16, stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out[:out.find(stop)]


def chat(client, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there"}], **kw)


def test_chat_non_stream_and_stream(client):
    r = chat(client)
    m = r.choices[0].message
    assert m.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    reasoning = (m.model_extra or {}).get("reasoning_content") or ""
    content = m.content or ""

    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    s_reasoning = s_content = ""
    roles = []
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        if d.role:
            roles.append(d.role)
        s_content += d.content or ""
        s_reasoning += (d.model_extra or {}).get("reasoning_content") or ""
    assert roles == ["assistant"]
    assert (s_reasoning, s_content) == (reasoning, content)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_chat_thinking_off_and_n2(client):
    r = chat(client, n=2, seed=7, temperature=0.8, extra_body={"chat_template_kwargs": {"thinking": False}})
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert not (c.message.model_extra or {}).get("reasoning_content")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_chat_tool_conversation_is_accepted(client):
    # The request half of a tool-call round trip: declared tools, an assistant turn that called
    # one, and the tool's answer all render into the prompt. (Forcing the built-in model to emit a
    # call needs an engine hook; the parsing half is covered by the C++ server tests.)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    base = client.chat.completions.create(model=MODEL, messages=messages[:1], max_tokens=2, temperature=0)
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="auto",
                                       max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens > base.usage.prompt_tokens
    # "required" cannot be enforced without constrained decoding: refused by name (issue 11), not
    # accepted and then answered in prose.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages[:1], tools=[WEATHER_TOOL],
                                       tool_choice="required", max_tokens=2, temperature=0)
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages[:1], tool_choice="required", max_tokens=2)
    assert e.value.body["param"] == "tool_choice"


def test_chat_logprobs(client):
    r = chat(client, max_tokens=4, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 2
        assert bytes(entry.bytes).decode("utf-8", "replace") is not None


def test_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=10**9)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=1)
    assert e.value.body["param"] == "messages"


def test_disconnect_mid_stream_frees_the_sequence(server, client):
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True})
    for _ in zip(range(3), stream):
        pass
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["kimirt_kv_cache_blocks_used"] == 0:
            break
        time.sleep(0.1)
    m = server.metrics()
    assert m["vllm:num_requests_running"] == 0
    assert m["kimirt_kv_cache_blocks_used"] == 0
    assert m["kimirt_state_slots_used"] == 0
    # The abandoned request did not run to its 2000 tokens.
    assert m["vllm:generation_tokens_total"] < 1900


def test_health_and_metrics(server):
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    _, text = server.get("/metrics")
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert 'kimirt_http_requests_total{endpoint="/v1/completions",status="200"}' in text


def test_body_too_large(server):
    body = json.dumps({"model": MODEL, "prompt": "x" * (9 << 20)}).encode()
    req = urllib.request.Request(server.base_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        status = 200
    except urllib.error.HTTPError as e:
        status = e.code
    except (ConnectionError, urllib.error.URLError):
        status = 413  # the server may close before reading the whole body; it refused it either way
    assert status == 413


def test_soak_mixed_load(server, client):
    """Bounded soak: concurrent valid, cancelled, invalid and slow-client requests; afterwards
    nothing leaks and no client was starved.

    $KIMIRT_SOAK_REQUESTS sets the count (CI runs 3,000 with 16 workers, and again under ASan).
    Slow clients (issue 11): one in ten sends its request a few bytes at a time; one in ten reads
    its stream slowly. Every other request must still finish within STARVED_S.
    """
    total = int(os.environ.get("KIMIRT_SOAK_REQUESTS", "120"))
    failures = []
    durations = []

    def one(i):
        rng = random.Random(i)
        kind = i % 10
        try:
            if kind < 2:  # cancelled mid-stream
                stream = client.completions.create(model=MODEL, prompt=f"Story {i}:", max_tokens=500, stream=True,
                                                   extra_body={"ignore_eos": True})
                for _ in zip(range(2), stream):
                    pass
                stream.close()
            elif kind == 2:  # invalid
                try:
                    client.completions.create(model=MODEL, prompt="x", temperature=-1)
                    failures.append((i, "invalid request accepted"))
                except openai.BadRequestError:
                    pass
            elif kind == 8:  # a slow request writer: /health sent a few bytes at a time
                request = b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                    for at in range(0, len(request), 4):
                        sock.sendall(request[at:at + 4])
                        time.sleep(0.02)
                    answer = sock.recv(64)
                if not answer.startswith(b"HTTP/1.1 200"):
                    failures.append((i, f"slow writer got {answer!r}"))
            elif kind == 9:  # a slow stream reader
                stream = client.completions.create(model=MODEL, prompt=f"Slow {i}:", max_tokens=16, stream=True,
                                                   extra_body={"ignore_eos": True})
                for _ in stream:
                    time.sleep(0.02)
            elif kind < 6:
                started = time.monotonic()
                r = client.completions.create(model=MODEL, prompt=f"Item {i} is", max_tokens=rng.randint(1, 16),
                                              n=rng.choice([1, 2]), stream=rng.random() < 0.5, temperature=0.7,
                                              seed=i)
                if not hasattr(r, "choices"):
                    list(r)
                durations.append(time.monotonic() - started)
            else:
                started = time.monotonic()
                r = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Question {i}?"}],
                    max_tokens=rng.randint(1, 16), stream=rng.random() < 0.5)
                if not hasattr(r, "choices"):
                    list(r)
                durations.append(time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - any failure of a valid request is the finding
            failures.append((i, repr(e)))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, range(total)))
    assert failures == []
    # No client starved: a 16-token request waits behind at most 15 others (16 workers), each a few
    # hundred ms on the built-in model, even under ASan; a minute means one was stuck.
    STARVED_S = 60.0
    assert max(durations) < STARVED_S, f"slowest request took {max(durations):.1f} s"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0 \
                and m["kimirt_kv_cache_blocks_used"] == m["kimirt_state_slots_used"] == 0:
            break
        time.sleep(0.1)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["kimirt_kv_cache_blocks_used"] == 0 and m["kimirt_state_slots_used"] == 0
    assert server.proc.poll() is None
