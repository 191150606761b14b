"""`kimirt serve` across nodes, exercised on one host (docs/distributed.md "Multi-node"; issue 15:
"two processes started by the environment-variable launcher (as on two nodes) give the same output
as -tp 2"). Node 0's `serve` is rank 0 (HTTP, scheduling) and listens on --master-port; node 1's
`serve` serves no HTTP and starts its ranks as followers connecting there. Both spellings are
tested: --nnodes/--node-rank/--master-addr flags, and torchrun's RANK/WORLD_SIZE/... variables
(one process per rank). The answers must equal single-host `-tp 2 --distributed-executor-backend
mp` exactly (text and logprobs: the same rank-ordered sums); a dead node fails node 0 loudly.
"""
import os
import signal
import socket
import subprocess
import threading
import time

from conftest import ServerProcess, kimirt_binary
from test_process_ranks import followers, health_after_a_death, post

MP = ["--distributed-executor-backend", "mp"]
PROMPTS = ["Hello world", "The quick brown fox jumps over", "1 2 3 4 5 6 7"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(server):
    out = []
    for p in PROMPTS:
        status, body = post(server.base_url, "/v1/completions",
                            {"prompt": p, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 2})
        assert status == 200, body
        choice = body["choices"][0]
        out.append((choice["text"], choice["logprobs"]))
    return out


class Node:
    """A `kimirt serve` that serves no HTTP (another node's launcher, or one follower rank)."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen([str(kimirt_binary()), "serve", *args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True,
                                     env=None if env is None else {**os.environ, **env})
        self.stderr_lines = []
        threading.Thread(target=lambda: self.stderr_lines.extend(self.proc.stderr), daemon=True).start()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def stderr(self):
        time.sleep(0.2)  # the drain thread's last lines
        return "".join(self.stderr_lines)


def single_host_answers():
    s = ServerProcess(["-tp", "2", *MP])
    try:
        return answers(s)
    finally:
        assert s.stop() == 0, "".join(s.stderr_lines)


def flag_nodes(port, timeout_s=60):
    """Node 1 first (its follower retries until node 0 listens), then node 0."""
    common = ["-tp", "2", "--nnodes", "2", "--master-port", str(port), "--rank-timeout-s", str(timeout_s), *MP]
    node1 = Node([*common, "--node-rank", "1", "--master-addr", "127.0.0.1"])
    node0 = ServerProcess([*common, "--node-rank", "0"])
    return node0, node1


def test_two_nodes_by_flags_answer_as_one_host_does_and_end_together():
    want = single_host_answers()
    node0, node1 = flag_nodes(free_port())
    try:
        assert followers(node0.proc.pid) == []  # rank 1 is node 1's, not node 0's child
        assert len(followers(node1.proc.pid)) == 1
        assert answers(node0) == want
    finally:
        assert node0.stop() == 0, "".join(node0.stderr_lines)
    # Rank 0 told its followers to quit: node 1 ends by itself, cleanly.
    assert node1.wait(timeout=15) == 0, node1.stderr()
    assert "node 1 of 2 (flags) starts ranks 1..1 of 2" in node1.stderr()


def test_two_processes_by_torchrun_variables_answer_as_one_host_does():
    want = single_host_answers()
    port = free_port()
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    rank1 = Node(["-tp", "2", *MP], env={**env, "RANK": "1", "LOCAL_RANK": "1"})
    rank0 = ServerProcess(["-tp", "2", *MP], env={**env, "RANK": "0", "LOCAL_RANK": "0"})
    try:
        assert followers(rank0.proc.pid) == []
        assert followers(rank1.proc.pid) == []  # it is rank 1 itself
        assert answers(rank0) == want
    finally:
        assert rank0.stop() == 0, "".join(rank0.stderr_lines)
    assert rank1.wait(timeout=15) == 0, rank1.stderr()
    assert "rank 1 of 2 (torchrun): follows rank 0 at 127.0.0.1:%d" % port in rank1.stderr()


def test_a_killed_node_makes_health_503_and_node_0_exit():
    node0, node1 = flag_nodes(free_port())
    try:
        answers(node0)
        (rank1,) = followers(node1.proc.pid)
        os.kill(node1.proc.pid, signal.SIGKILL)  # the node's launcher; its rank dies with it
        status, body = health_after_a_death(node0.base_url)
        assert status == 503, body
        assert "rank 1" in body["error"]["message"] and "another node" in body["error"]["message"], body
        status, body = post(node0.base_url, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        assert status >= 500 and "rank 1" in body["error"]["message"], body
        assert node0.proc.wait(timeout=15) == 1
        time.sleep(0.5)
        assert subprocess.run(["kill", "-0", str(rank1)], capture_output=True).returncode != 0, "rank 1 outlived its node"
    finally:
        node0.stop()
        node1.wait(timeout=5)


def test_a_node_that_never_comes_is_named_within_the_rank_timeout():
    port = free_port()
    t0 = time.monotonic()
    node0 = Node(["-tp", "4", "--nnodes", "2", "--node-rank", "0", "--master-port", str(port),
                  "--rank-timeout-s", "2", *MP])
    assert node0.wait(timeout=30) == 1
    assert time.monotonic() - t0 < 20
    err = node0.stderr()
    assert "ranks 2, 3 of 4 did not connect to rank 0 (port %d) within 2000 ms" % port in err, err


def test_a_node_with_another_tp_is_refused_naming_both():
    port = free_port()
    common = ["--nnodes", "2", "--master-port", str(port), "--rank-timeout-s", "10", *MP]
    node1 = Node(["-tp", "4", *common, "--node-rank", "1", "--master-addr", "127.0.0.1"])
    node0 = Node(["-tp", "2", *common, "--node-rank", "0"])
    assert node0.wait(timeout=30) == 1
    err = node0.stderr()
    assert "was started in a run of 4 ranks, but rank 0 serves -tp 2" in err, err
    assert node1.wait(timeout=30) != 0  # its ranks lost rank 0


def test_an_unreachable_master_is_a_startup_error():
    port = free_port()  # nobody listens there
    t0 = time.monotonic()
    rank1 = Node(["-tp", "2", "--rank-timeout-s", "2", *MP],
                 env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)})
    assert rank1.wait(timeout=30) == 1
    assert time.monotonic() - t0 < 20
    err = rank1.stderr()
    assert "rank 1 could not reach rank 0 at 127.0.0.1:%d within 2000 ms" % port in err, err


def test_bad_launch_values_are_named():
    cases = [
        (["-tp", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h", *MP], {}, ["--node-rank 2"]),
        (["-tp", "3", "--nnodes", "2", "--node-rank", "0", *MP], {}, ["--nnodes 2"]),
        (["-tp", "2", *MP], {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                             "MASTER_PORT": "1234"}, ["WORLD_SIZE=4"]),
        (["-tp", "2", "--nnodes", "2", "--node-rank", "1"], {}, ["--nnodes", "-tp 2 or more with "
                                                                 "--distributed-executor-backend mp"]),
    ]
    for args, env, needles in cases:
        node = Node(args, env=env)
        assert node.wait(timeout=30) == 2, (args, node.stderr())
        err = node.stderr()
        for n in needles:
            assert n in err, (args, err)
