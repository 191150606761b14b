#!/usr/bin/env python3
"""Decode step time of `kimirt bench model -pp 1` against `-pp 2` on CPU thread ranks, on a
machine shared with other work (docs/distributed.md "Micro-batches in flight").

Pipeline stages overlap only where there are cores for both: on the 2-core development machine,
shared with other builds, there often are not. So each repetition is bracketed by a check of the
cores actually free — two busy processes against one: "two free" when two take less than 1.2x
one's time, before and after — and the summary is over the repetitions with two free cores (all
repetitions are in the JSON). `--threads 1` gives each stage one core (its own thread, BLAS on the
caller), as each stage would have its own device; with more threads every stage's ops already
spread over the cores and there is nothing left for the other stage to use.

  python3 bench/pp_cpu_overlap.py --kimirt build/kimirt [--base OTHER/kimirt] --reps 12 --json OUT
"""
import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time


def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x


def busy_seconds(procs, n=10_000_000):
    t0 = time.monotonic()
    ps = [multiprocessing.Process(target=spin, args=(n,)) for _ in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return time.monotonic() - t0


def two_cores_free():
    one = busy_seconds(1)
    two = busy_seconds(2)
    return two / one < 1.2, two / one


def bracketed(measure):
    """measure() between two checks of the free cores: its dict, with two_cores_free and busy_ratio."""
    free_before, ratio_before = two_cores_free()
    rep = measure()
    free_after, ratio_after = two_cores_free()
    rep["two_cores_free"] = free_before and free_after
    rep["busy_ratio"] = [round(ratio_before, 3), round(ratio_after, 3)]
    return rep


def bench(kimirt, pp, args):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [kimirt, "bench", "model", "-pp", str(pp), "--threads", str(args.threads), "--batch-sizes",
               args.batch_sizes, "--prompt-len", str(args.prompt_len), "--decode-tokens", str(args.decode_tokens),
               "--json", out.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = json.load(open(out.name))
    return {str(p["batch"]): p["decode_step_ms_median"] for p in report["points"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kimirt", required=True)
    ap.add_argument("--base", help="another kimirt to run -pp 2 with (e.g. one stage after another)")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-sizes", default="8,32")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    runs = [("pp1", args.kimirt, 1), ("pp2", args.kimirt, 2)]
    if args.base:
        runs.append(("pp2-base", args.base, 2))
    reps = []
    for r in range(args.reps):
        rep = bracketed(lambda: {name: bench(binary, pp, args) for name, binary, pp in runs})
        reps.append(rep)
        print(f"rep {r}: {rep}", file=sys.stderr)
    clean = [rep for rep in reps if rep["two_cores_free"]]
    summary = {}
    print(f"decode step ms (median step; median over {len(clean)} of {len(reps)} repetitions with two free cores)")
    for name, _, _ in runs:
        summary[name] = {b: statistics.median([rep[name][b] for rep in clean]) if clean else None
                         for b in reps[0][name]}
        print(f"  {name:9s} " + "  ".join(f"batch {b}: {v:.2f}" if v else f"batch {b}: -"
                                         for b, v in summary[name].items()))
    if args.json:
        json.dump({"command": " ".join(sys.argv), "threads": args.threads, "prompt_len": args.prompt_len,
                   "decode_tokens": args.decode_tokens, "summary_two_cores_free": summary, "repetitions": reps},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
