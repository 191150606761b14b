#!/usr/bin/env python3
"""Greedy completions of one model served at two tensor-parallel sizes, compared (issue 17 item 3).

Starts `kimirt serve --config CONFIG --random-weights` at -tp A, takes greedy completions with
token logprobs for a few prompts, stops it, does the same at -tp B, and compares: the texts must
be identical and every token logprob within --tol (TP changes only the order of the all-reduce's
sums). At -tp B it also checks batch invariance: the first prompt alone and among --crowd
concurrent requests must give the same bits (text and logprobs exactly).

  python3 scripts/tp_compare.py --kimirt build-cuda/kimirt --config bench/configs/kimi-k3-2layer.json \
      --tp 1 8 --out /tmp/tp-compare.json -- --device cuda --gpu-memory-utilization 0.5
"""
import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In 1969, the first humans",
    "Water boils at a temperature of",
]


def complete(port, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "logprobs": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        c = json.load(r)["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"]


def serve(args, tp, log):
    cmd = [args.kimirt, "serve", "--config", args.config, "--random-weights", "--seed", str(args.seed),
           "-tp", str(tp), "--port", str(args.port)] + args.serve_args
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + args.load_timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve -tp {tp} exited with {proc.returncode} while loading (log: {log.name})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"serve -tp {tp} did not answer /health within {args.load_timeout_s} s (log: {log.name})")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kimirt", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--tp", type=int, nargs=2, default=[1, 8])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--crowd", type=int, default=63, help="requests sent with the first prompt at the second -tp")
    p.add_argument("--tol", type=float, default=1e-3, help="largest |logprob difference| between the two sizes")
    p.add_argument("--load-timeout-s", type=int, default=1800)
    p.add_argument("--out", required=True)
    p.add_argument("serve_args", nargs="*", help="more `kimirt serve` flags, after --")
    args = p.parse_args()

    results = {}
    for tp in args.tp:
        with open(f"{args.out}.serve-tp{tp}.log", "w") as log:
            proc = serve(args, tp, log)
            try:
                results[tp] = [complete(args.port, q, args.max_tokens) for q in PROMPTS]
                if tp == args.tp[1]:
                    # The first prompt among a crowd of other requests in flight at once.
                    with concurrent.futures.ThreadPoolExecutor(max_workers=args.crowd + 1) as ex:
                        others = [ex.submit(complete, args.port, PROMPTS[1 + i % (len(PROMPTS) - 1)] + f" {i}",
                                            args.max_tokens) for i in range(args.crowd)]
                        crowded = ex.submit(complete, args.port, PROMPTS[0], args.max_tokens).result()
                        for f in others:
                            f.result()
            finally:
                stop(proc)
    a, b = (results[t] for t in args.tp)
    same_text = all(x[0] == y[0] for x, y in zip(a, b))
    max_diff = max(abs(u - v) for x, y in zip(a, b) for u, v in zip(x[1], y[1]))
    invariant = crowded == b[0]
    report = {"config": args.config, "tp": args.tp, "prompts": len(PROMPTS), "max_tokens": args.max_tokens,
              "texts_identical": same_text, "max_abs_logprob_diff": max_diff, "tol": args.tol,
              "batch_invariant_at_tp": args.tp[1], "crowd": args.crowd, "batch_invariant": invariant}
    json.dump(report, open(args.out, "w"), indent=1)
    print(json.dumps(report))
    ok = same_text and max_diff <= args.tol and invariant
    print(f"-tp {args.tp[0]} vs -tp {args.tp[1]}: texts {'identical' if same_text else 'DIFFER'}, "
          f"max |dlogprob| {max_diff:.2e} (tol {args.tol:g}); alone vs among {args.crowd}: "
          f"{'bit-identical' if invariant else 'DIFFER'} -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
