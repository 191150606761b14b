#!/usr/bin/env python3
"""Serving throughput of `kimirt serve -pp 2` with steps in flight against one step at a time, on
CPU thread ranks (docs/distributed.md "Steps in flight").

With one step at a time, every step ends with a drain: stage 0 waits for the step's logits while
the engine samples and schedules, and each stage idles for the other's part. With steps in flight
the engine submits the next step while the later stage runs this one. The stages overlap only
where there are cores for both, so, as bench/pp_cpu_overlap.py does, each repetition is bracketed
by a check of the cores actually free and the summary keeps the repetitions with two free cores
(every repetition is in the JSON). `--threads 1` gives each stage one core.

  python3 bench/pp_steps_in_flight_cpu.py --kimirt build/kimirt --reps 6 --json OUT
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pp_cpu_overlap import bracketed  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, seconds=120):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"serve on port {port} not healthy within {seconds} s")


def run(kimirt, steps_in_flight, args):
    """One serve -pp 2 --steps-in-flight N and one bench serve against it: its run's metrics."""
    port = free_port()
    serve = subprocess.Popen([kimirt, "serve", "-pp", "2", "--threads", str(args.threads), "--port", str(port),
                              "--steps-in-flight", str(steps_in_flight)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, serve)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([kimirt, "bench", "serve", "--url", f"http://127.0.0.1:{port}", "--input-len",
                            str(args.input_len), "--output-len", str(args.output_len), "--num-prompts",
                            str(args.num_prompts), "--max-concurrency", str(args.concurrency), "--json", out.name],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r = json.load(open(out.name))["runs"][0]
    finally:
        serve.terminate()
        serve.wait(30)
    if r["failed"]:
        raise RuntimeError(f"{r['failed']} requests failed: {r.get('errors')}")
    return {"output_throughput": r["output_throughput"], "mean_tpot_ms": r["mean_tpot_ms"],
            "mean_ttft_ms": r["mean_ttft_ms"], "duration_s": r["duration"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kimirt", required=True)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    modes = [("one_step_at_a_time", 1), ("steps_in_flight", 0)]
    reps = []
    for i in range(args.reps):
        order = modes if i % 2 == 0 else modes[::-1]
        rep = bracketed(lambda: {name: run(args.kimirt, n, args) for name, n in order})
        reps.append(rep)
        print(f"rep {i}: {rep}", file=sys.stderr)
    clean = [rep for rep in reps if rep["two_cores_free"]]
    summary = {}
    print(f"serve -pp 2 (medians over {len(clean)} of {len(reps)} repetitions with two free cores)")
    for name, _ in modes:
        summary[name] = {k: statistics.median([rep[name][k] for rep in clean]) if clean else None
                         for k in ("output_throughput", "mean_tpot_ms", "mean_ttft_ms")}
        print(f"  {name:20s} " + "  ".join(f"{k} {v:.2f}" if v is not None else f"{k} -"
                                           for k, v in summary[name].items()))
    if clean:
        a, b = summary["steps_in_flight"]["output_throughput"], summary["one_step_at_a_time"]["output_throughput"]
        summary["throughput_ratio"] = a / b
        print(f"  output tokens/s, steps in flight / one step at a time: {a / b:.3f}")
    if args.json:
        json.dump({"command": " ".join(sys.argv), "threads": args.threads, "input_len": args.input_len,
                   "output_len": args.output_len, "num_prompts": args.num_prompts,
                   "max_concurrency": args.concurrency, "summary_two_cores_free": summary, "repetitions": reps},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
