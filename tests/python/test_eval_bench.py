"""`kimirt eval gsm8k` and `kimirt bench serve` against `kimirt serve` with the built-in model
(issue "Correctness check and load generator"): both run end to end and their JSON outputs have
the documented schemas (docs/eval.md). The built-in model cannot do arithmetic, so the scores are
not asserted; scoring itself is tested in src/kimirt/eval/gsm8k_scoring_test.cpp.
"""
import json
import subprocess

import pytest

from conftest import kimirt_binary


def run(args, timeout=600):
    return subprocess.run([str(kimirt_binary()), *args], capture_output=True, text=True, timeout=timeout)


def check_keys(obj, keys, where):
    for key, types in keys.items():
        assert key in obj, f"{where}: missing {key}"
        assert isinstance(obj[key], types), f"{where}.{key}: {type(obj[key]).__name__}"


def test_eval_gsm8k_limit_20(server, tmp_path):
    out = tmp_path / "gsm8k.json"
    r = run(["eval", "gsm8k", "--url", server.base_url, "--limit", "20", "--max-tokens", "32",
             "--output", str(out)])
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    check_keys(report, {"schema": str, "task": str, "config": dict, "results": dict, "n_samples": int,
                        "failed_requests": int, "samples": list, "usage": dict}, "report")
    assert report["schema"] == "kimirt.eval.gsm8k.v1"
    assert report["n_samples"] == 20 and len(report["samples"]) == 20
    assert report["failed_requests"] == 0
    for name in ("strict-match", "flexible-extract"):
        check_keys(report["results"][name], {"exact_match": (int, float), "correct": int}, name)
    s = report["samples"][0]
    check_keys(s, {"doc_id": int, "fewshot_ids": list, "prompt": str, "output": str, "filters": dict}, "sample")
    assert len(s["fewshot_ids"]) == 5
    assert s["prompt"].endswith("Answer:") and s["prompt"].count("Question:") == 6
    # The server's usage agrees with what the report summed.
    assert report["usage"]["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in report["samples"])


def test_bench_serve_small(server, tmp_path):
    out = tmp_path / "bench.json"
    r = run(["bench", "serve", "--url", server.base_url, "--dataset", "random", "--input-len", "32",
             "--output-len", "8", "--num-prompts", "12", "--max-concurrency", "4", "--seed", "1",
             "--server-metrics", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["schema"] == "kimirt.bench.serve.v1"
    (run0,) = result["runs"]
    check_keys(run0, {"completed": int, "failed": int, "total_input_tokens": int, "total_output_tokens": int,
                      "mean_ttft_ms": (int, float), "p99_tpot_ms": (int, float), "mean_itl_ms": (int, float),
                      "request_throughput": (int, float)}, "run")
    assert run0["completed"] == 12 and run0["failed"] == 0
    assert run0["total_output_tokens"] == 12 * 8
    # The client's TTFT and the server's own histogram describe the same run (bucket resolution).
    sm = run0.get("server_metrics")
    if sm and sm.get("ttft"):
        lo, hi = sm["ttft"]["p90_ms_bucket"]
        assert run0["p90_ttft_ms"] >= lo * 0.5 and (hi is None or run0["p90_ttft_ms"] <= hi * 2), (run0, sm)


def test_bench_serve_save_result_is_vllm_shaped(server, tmp_path):
    """--save-result writes what `vllm bench serve --save-result` writes: flat keys, vLLM's names."""
    r = run(["bench", "serve", "--url", server.base_url, "--dataset", "random", "--input-len", "16",
             "--output-len", "4", "--num-prompts", "6", "--max-concurrency", "2", "--seed", "1",
             "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm.json",
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"])
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "vllm.json").read_text())
    expected = {"completed": int, "total_input_tokens": int, "total_output_tokens": int,
                "request_throughput": (int, float), "output_throughput": (int, float), "duration": (int, float)}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            expected[f"{stat}_{metric}_ms"] = (int, float)
    check_keys(result, expected, "vllm result")
    assert result["completed"] == 6 and result["total_output_tokens"] == 6 * 4
    assert result["max_concurrency"] == 2 and result["request_rate"] == "inf"
    assert result["p50_ttft_ms"] <= result["p99_ttft_ms"]
