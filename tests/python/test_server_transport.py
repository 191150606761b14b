"""`kimirt serve` under connections that hold on (issue 11, "A server that one slow client cannot stop").

A server with only 4 generation slots faces 100 open streams and 100 clients that trickle their
headers: /health and /metrics must still answer within 1 s, and the streams' requests must be
freed when their clients hang up. Then 128 completions with logprobs at once must each get a
complete response (a transport limit once reset one of 64 on CUDA).
"""
import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ServerProcess

MODEL = "kimirt-builtin"


@pytest.fixture(scope="module")
def small_server():
    s = ServerProcess(["--max-num-seqs", "4"])
    yield s
    rc = s.stop()
    assert rc == 0, "kimirt serve did not exit cleanly on SIGTERM:\n" + "".join(s.stderr_lines)


def timed_get(server, path):
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - t0
    finally:
        conn.close()


def open_stream(server):
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def wait_for_idle_engine(server, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        time.sleep(0.1)
    return server.metrics()


def test_health_and_metrics_answer_with_100_streams_and_100_slow_clients(small_server):
    streams = [open_stream(small_server) for _ in range(100)]
    slow = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", small_server.port), timeout=10)
        s.sendall(b"GET /hea")
        slow.append(s)
    try:
        # The first four streams are generating, the other 96 wait in the engine's queue.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and small_server.metrics()["vllm:num_requests_waiting"] < 90:
            time.sleep(0.1)
        m = small_server.metrics()
        assert m["vllm:num_requests_running"] == 4
        assert m["vllm:num_requests_waiting"] >= 90
        for _ in range(3):
            for path in ("/health", "/metrics"):
                status, took = timed_get(small_server, path)
                assert status == 200
                assert took < 1.0, f"{path} took {took:.2f} s"
    finally:
        for s in streams + slow:
            s.close()
    # Every stream's client left: its request is aborted, running or queued.
    m = wait_for_idle_engine(small_server)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["kimirt_kv_cache_blocks_used"] == 0


def test_128_concurrent_completions_with_logprobs_each_complete(small_server):
    body = json.dumps({"model": MODEL, "prompt": "Count: one, two,", "max_tokens": 4, "logprobs": 1,
                       "temperature": 0})

    def one(_):
        conn = http.client.HTTPConnection("127.0.0.1", small_server.port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read())
            return resp.status, data["usage"]["completion_tokens"], len(data["choices"][0]["logprobs"]["tokens"])
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=128) as pool:
        results = list(pool.map(one, range(128)))
    assert results == [(200, 4, 4)] * 128
    assert small_server.proc.poll() is None
