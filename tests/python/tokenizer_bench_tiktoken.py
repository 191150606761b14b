#!/usr/bin/env python3
"""Encoding throughput of the PyPI tiktoken library with the same ranks, pattern and text as
bench/tokenizer_bench.cpp (one thread; best of --runs), for comparing MB/s.

  tokenizer_bench_tiktoken.py --model-dir DIR (--text FILE | --jsonl FILE) [--runs N]
                              [--json OUT.json] [--compare KIMIRT_BENCH.json]

--jsonl uses "question\\nanswer" per GSM8K record, documents joined by "\\n\\n" for the
whole-text measurement; --text splits documents at blank lines. --compare prints the ratio
against tokenizer_bench's --json output.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tiktoken  # noqa: E402

from tokenizer_vs_tiktoken import make_encoding  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument("--jsonl")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--compare")
    args = ap.parse_args()

    enc, _ = make_encoding("bench", args.model_dir)
    if args.jsonl:
        docs = []
        with open(args.jsonl, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    docs.append(rec["question"] + "\n" + rec["answer"])
        text = "\n\n".join(docs)
    else:
        with open(args.text, encoding="utf-8", newline="") as f:  # bytes as they are
            text = f.read()
        parts = text.split("\n\n")
        docs = [p + "\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])

    best_whole = best_docs = float("inf")
    for _ in range(max(1, args.runs)):
        t0 = time.perf_counter()
        tokens = len(enc.encode_ordinary(text))
        best_whole = min(best_whole, time.perf_counter() - t0)
        t0 = time.perf_counter()
        doc_tokens = sum(len(enc.encode_ordinary(d)) for d in docs)
        best_docs = min(best_docs, time.perf_counter() - t0)
    nbytes = len(text.encode("utf-8"))
    doc_bytes = sum(len(d.encode("utf-8")) for d in docs)
    whole = nbytes / 1e6 / best_whole
    per_doc = doc_bytes / 1e6 / best_docs
    print(f"tiktoken {tiktoken.__version__} ({args.model_dir}, {enc.n_vocab} ids): "
          f"{nbytes / 1e6:.2f} MB, {tokens} tokens")
    print(f"  whole text:      {whole:8.2f} MB/s ({best_whole:.3f} s)")
    print(f"  {len(docs):6d} documents: {per_doc:8.2f} MB/s ({best_docs:.3f} s, {doc_tokens} tokens)")
    result = {"bench": "tokenizer", "impl": "tiktoken " + tiktoken.__version__,
              "model_dir": args.model_dir, "text": args.text or args.jsonl, "bytes": nbytes,
              "tokens": tokens, "documents": len(docs), "document_tokens": doc_tokens,
              "whole_mb_per_s": whole, "documents_mb_per_s": per_doc, "runs": args.runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.compare:
        with open(args.compare) as f:
            ours = json.load(f)
        # Per-document ids must agree exactly. The whole-text counts may differ a little: kimirt
        # cuts texts over 400,000 characters into chunks as NeMo's tokenizer does (spec §10.1),
        # raw tiktoken does not.
        if ours["document_tokens"] != doc_tokens or ours["bytes"] != nbytes:
            print(f"  warning: kimirt saw {ours['bytes']} bytes / {ours['document_tokens']} "
                  "document tokens")
        print(f"  kimirt / tiktoken: whole text {ours['whole_mb_per_s'] / whole:.2f}x, "
              f"documents {ours['documents_mb_per_s'] / per_doc:.2f}x")


if __name__ == "__main__":
    main()
