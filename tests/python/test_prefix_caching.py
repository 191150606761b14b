"""Prefix caching end to end (docs/prefix-caching.md): `kimirt eval gsm8k` (5-shot) against
`kimirt serve` with the built-in model, caching on (the default) and off. With caching on the
suite runs twice, so the second pass resumes every prompt from the cache; all three passes give
identical per-sample outputs. The hit rate comes from the server's /metrics, and once every
request has finished no latent block is in use (what the cache keeps counts as evictable).
"""
import json
import subprocess
import time

from conftest import ServerProcess, kimirt_binary

LIMIT = "6"


def gsm8k_outputs(server, tmp_path, name):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([str(kimirt_binary()), "eval", "gsm8k", "--url", server.base_url, "--limit", LIMIT,
                        "--max-tokens", "24", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["failed_requests"] == 0
    return [(s["doc_id"], s["output"]) for s in report["samples"]]


def test_gsm8k_outputs_are_identical_with_and_without_prefix_caching(tmp_path):
    off = ServerProcess(["--no-enable-prefix-caching"])
    try:
        uncached = gsm8k_outputs(off, tmp_path, "off")
        m = off.metrics()
        assert m["vllm:prefix_cache_queries_total"] == 0
    finally:
        assert off.stop() == 0

    on = ServerProcess([])  # on by default
    try:
        cold = gsm8k_outputs(on, tmp_path, "cold")
        before = on.metrics()
        warm = gsm8k_outputs(on, tmp_path, "warm")
        # The engine publishes its stats after each step: the last release may show a step late.
        deadline = time.monotonic() + 10
        after = on.metrics()
        while after["kimirt_kv_cache_blocks_used"] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            after = on.metrics()
    finally:
        assert on.stop() == 0

    assert len(uncached) == int(LIMIT)
    assert cold == uncached
    assert warm == uncached
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    print(f"prefix-cache hit rate of the warm pass: {hits / queries:.3f} ({hits:.0f} of {queries:.0f} tokens)")
    assert queries > 0 and hits / queries > 0.5  # each prompt resumes at its last chunk boundary
    # Memory accounting back to zero: nothing in use; the cached blocks are evictable.
    assert after["vllm:num_requests_running"] == 0
    assert after["kimirt_kv_cache_blocks_used"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["kimirt_kv_cache_blocks_evictable"] > 0
    assert after["kimirt_kda_snapshot_bytes"] > 0
