"""`kimirt serve -tp 2 --distributed-executor-backend mp`: one process per rank (docs/distributed.md
"Process ranks"). It answers exactly as the thread ranks do; a follower rank killed mid-run turns
/health into 503 naming the rank, requests into errors, and the server exits 1 — never a hang.
"""
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

from conftest import ServerProcess, kimirt_binary

PROMPTS = ["Hello world", "The quick brown fox jumps over", "1 2 3 4 5 6 7"]


def post(base_url, path, body):
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(base_url, path):
    try:
        with urllib.request.urlopen(base_url + path, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health_after_a_death(base_url, within_s=5):
    """/health, polled until it stops answering 200 (or within_s passes): (status, body)."""
    t0 = time.monotonic()
    status, body = get(base_url, "/health")
    while status == 200 and time.monotonic() - t0 < within_s:
        time.sleep(0.05)
        status, body = get(base_url, "/health")
    return status, body


def completions(server):
    out = []
    for p in PROMPTS:
        status, body = post(server.base_url, "/v1/completions",
                            {"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        out.append(body["choices"][0]["text"])
    return out


def followers(pid):
    r = subprocess.run(["pgrep", "-P", str(pid), "-x", "kimirt"], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def test_process_ranks_answer_as_thread_ranks_do():
    threads = ServerProcess(["-tp", "2"])
    try:
        want = completions(threads)
    finally:
        assert threads.stop() == 0
    procs = ServerProcess(["-tp", "2", "--distributed-executor-backend", "mp"])
    try:
        assert len(followers(procs.proc.pid)) == 1  # rank 1 is a child process
        assert completions(procs) == want
    finally:
        assert procs.stop() == 0, "".join(procs.stderr_lines)
    assert followers(procs.proc.pid) == []


def test_pipeline_stages_answer_as_one_rank_does():
    """serve -pp 2 (thread ranks), -pp 2 and -tp 2 -pp 2 as processes: the texts of -tp 1 (the
    stages change no sum; docs/distributed.md "Pipeline parallelism")."""
    one = ServerProcess([])
    try:
        want = completions(one)
    finally:
        assert one.stop() == 0
    for args, ranks in ((["-pp", "2"], 1), (["--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"], 2),
                        (["-tp", "2", "-pp", "2", "--distributed-executor-backend", "mp"], 4)):
        s = ServerProcess(args)
        try:
            assert len(followers(s.proc.pid)) == ranks - 1, args
            assert completions(s) == want, args
        finally:
            assert s.stop() == 0, "".join(s.stderr_lines)


def test_bad_pipeline_degrees_are_refused_naming_them():
    for args, want in ((["-pp", "0"], "-tp and -pp must be >= 1"),
                       (["-pp", "99"], "-pp 99: must be between 1 and the")):
        r = subprocess.run([str(kimirt_binary()), "serve", "--port", "0"] + args,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, args
        assert want in r.stderr, r.stderr


def test_a_killed_follower_makes_health_503_requests_fail_and_the_server_exit():
    s = ServerProcess(["-tp", "2", "--distributed-executor-backend", "mp"])
    try:
        assert get(s.base_url, "/health")[0] == 200
        completions(s)
        (rank1,) = followers(s.proc.pid)
        os.kill(rank1, signal.SIGKILL)
        status, body = health_after_a_death(s.base_url)
        assert status == 503, body
        assert "rank 1" in body["error"]["message"]
        status, body = post(s.base_url, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        assert status >= 500 and "rank 1" in body["error"]["message"], body
        assert s.proc.wait(timeout=15) == 1
        assert any("the model cannot run" in line and "rank 1" in line for line in s.stderr_lines), s.stderr_lines
    finally:
        s.stop()


def test_a_follower_dying_mid_stream_ends_the_stream_with_an_error_and_the_server_exits():
    # Issue 15's fault: rank 1 kills itself inside its 6th model step (KIMIRT_FAULT_RANK_DIES_IN_STEP,
    # process_ranks_runner.cpp), while a streamed completion is being decoded: the stream ends with
    # an error event naming rank 1, /health turns 503 and the server exits 1 within seconds.
    s = ServerProcess(["-tp", "2", "--distributed-executor-backend", "mp"],
                      env={"KIMIRT_FAULT_RANK_DIES_IN_STEP": "1:6"})
    try:
        t0 = time.monotonic()
        body = json.dumps({"prompt": "Hello there", "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                           "stream": True}).encode()
        req = urllib.request.Request(s.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        events = []
        with urllib.request.urlopen(req, timeout=30) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[len("data: "):]))
        texts = [e for e in events if "choices" in e and e["choices"] and e["choices"][0].get("text")]
        errors = [e for e in events if "error" in e]
        assert texts, events  # the stream had started: the rank died mid-stream
        assert errors and "rank 1" in errors[-1]["error"]["message"], events
        status, health = health_after_a_death(s.base_url)
        assert status == 503 and "rank 1" in health["error"]["message"], health
        assert s.proc.wait(timeout=15) == 1
        assert time.monotonic() - t0 < 20
    finally:
        s.stop()
