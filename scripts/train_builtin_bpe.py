#!/usr/bin/env python3
"""Learns the built-in byte-level BPE tokenizer of the demo model (assets/builtin).

The real Kimi-K3 tiktoken.model (163,584 ranks) is not redistributable here, so the demo model
and the tokenizer tests use a small tokenizer in the same format (spec §10.1-10.2):

  tiktoken.model          one "<base64 of the token bytes> <rank>" line per token, ranks 0..N-1:
                          the 256 single bytes (rank = byte value), then one rank per merge in
                          the order the merges were learned.
  tokenizer_config.json   added_tokens_decoder naming K3's special tokens at the same offsets
                          from the base vocabulary as K3 (163584 + k  ->  N + k); the other
                          reserved ids stay unnamed ("<|reserved_token_{id}|>").

Training: the text is pre-tokenized with the K3 pattern (the `regex` module's VERSION1 syntax
reads its `&&` class intersections), pieces are counted, and the most frequent adjacent pair is
merged until the vocabulary has --ranks tokens (ties: the smallest (left bytes, right bytes)).
When a pair's concatenation is already a token the pieces are merged without a new rank. The
result is deterministic for a given input and `regex` version; encoding with it is defined by
tiktoken's rules (lowest rank first), which the C++ tokenizer reproduces, so how the merges were
found does not need to be bit-exact with anything.

  python3 scripts/train_builtin_bpe.py [--data GSM8K_TRAIN_JSONL] [--ranks 4096] [--out assets/builtin]

Also a module: tests/python/tokenizer_vs_tiktoken.py imports train_bpe() and the writers.
"""

import argparse
import base64
import collections
import heapq
import json
import os
import sys

# NeMo's _build_kimi_k3_pat_str (spec §10.1); "&&" is class intersection.
_AND = "&" * 2
_UPPER_OR_MARK = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}" + _AND + r"[^\p{Han}]]"
_LOWER_OR_MARK = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}" + _AND + r"[^\p{Han}]]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
K3_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?" + _UPPER_OR_MARK + "*" + _LOWER_OR_MARK + "+" + _CONTRACTION,
    r"[^\r\n\p{L}\p{N}]?" + _UPPER_OR_MARK + "+" + _LOWER_OR_MARK + "*" + _CONTRACTION,
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

NUM_RESERVED = 256

# K3's named special tokens as offsets from the base vocabulary (spec §10.2: id = 163584 + offset
# in K3). The three XTML markers are "special": false in K3's tokenizer_config.json.
SPECIAL_OFFSETS = {
    0: "[BOS]",                 # 163584 bos_token_id (never added automatically)
    1: "[EOS]",                 # 163585 secondary stop
    2: "<|end_of_msg|>",        # 163586 eos_token_id, primary stop
    3: "<|open|>",              # 163587 XTML open marker
    4: "<|close|>",             # 163588 XTML close marker
    5: "<|sep|>",               # 163589 XTML tag terminator
    6: "[start_header_id]",     # 163590
    7: "[end_header_id]",       # 163591
    9: "[EOT]",                 # 163593
    18: "<|media_begin|>",      # 163602
    19: "<|media_content|>",    # 163603
    20: "<|media_end|>",        # 163604
    21: "<|media_pad|>",        # 163605 media_placeholder_token_id
    65: "<osagent_mode>",       # 163649
    254: "[UNK]",               # 163838
    255: "[PAD]",               # 163839 pad_token_id
}
NOT_SPECIAL = {"<|open|>", "<|close|>", "<|sep|>"}


def pretokenize(text, compiled):
    return compiled.findall(text)


def compile_pattern():
    import regex  # pip install regex
    return regex.compile(K3_PATTERN, regex.VERSION1)


def gsm8k_texts(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                yield rec["question"]
                yield rec["answer"]


def train_bpe(texts, num_ranks, compiled=None):
    """Returns the token byte strings in rank order (len <= num_ranks)."""
    compiled = compiled or compile_pattern()
    counts = collections.Counter()
    for t in texts:
        counts.update(p.encode("utf-8") for p in compiled.findall(t))
    vocab = [bytes([b]) for b in range(256)]
    index = {v: i for i, v in enumerate(vocab)}
    words = [list(w) for w in sorted(counts)]  # sorted: deterministic word order
    freqs = [counts[w] for w in sorted(counts)]
    pair_count = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freqs[wi]
            where[(a, b)].add(wi)

    def key(pair):
        return (-pair_count[pair], vocab[pair[0]], vocab[pair[1]], pair)

    heap = [key(p) for p in pair_count]
    heapq.heapify(heap)
    while len(vocab) < num_ranks and heap:
        neg, _, _, pair = heapq.heappop(heap)
        count = pair_count.get(pair, 0)
        if -neg != count:
            continue  # stale heap entry
        if count < 2:
            break  # the most frequent pair occurs once: nothing worth merging
        a, b = pair
        merged = vocab[a] + vocab[b]
        new_id = index.get(merged)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            index[merged] = new_id
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            w, f = words[wi], freqs[wi]
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                touched.add(p)
                where[p].discard(wi)
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] += f
                touched.add(p)
                where[p].add(wi)
        for p in touched:
            if pair_count[p] <= 0:
                pair_count.pop(p, None)
                where.pop(p, None)
            elif p != pair:
                heapq.heappush(heap, key(p))
    return vocab


def write_tiktoken_model(path, vocab):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for rank, token in enumerate(vocab):
            f.write(base64.b64encode(token).decode("ascii") + " " + str(rank) + "\n")


def special_names(num_base, offsets=None):
    """The reserved-id names in NeMo's order: named ones from the offsets, the rest default."""
    offsets = SPECIAL_OFFSETS if offsets is None else offsets
    return {num_base + k: offsets.get(k, f"<|reserved_token_{num_base + k}|>")
            for k in range(NUM_RESERVED)}


def write_tokenizer_config(path, num_base, offsets=None):
    offsets = SPECIAL_OFFSETS if offsets is None else offsets
    decoder = {}
    for k in sorted(offsets):
        name = offsets[k]
        decoder[str(num_base + k)] = {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": name not in NOT_SPECIAL,
        }
    config = {
        "added_tokens_decoder": decoder,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "tokenizer_class": "TikTokenTokenizer",
        "model_max_length": 1048576,
    }
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(here, "..", "data", "gsm8k", "train.jsonl"))
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--out", default=os.path.join(here, "..", "assets", "builtin"))
    args = ap.parse_args()
    vocab = train_bpe(gsm8k_texts(args.data), args.ranks)
    if len(vocab) != args.ranks:
        sys.exit(f"only {len(vocab)} ranks could be learned from {args.data}")
    os.makedirs(args.out, exist_ok=True)
    write_tiktoken_model(os.path.join(args.out, "tiktoken.model"), vocab)
    write_tokenizer_config(os.path.join(args.out, "tokenizer_config.json"), len(vocab))
    print(f"{len(vocab)} ranks + {NUM_RESERVED} reserved ids -> {args.out}")


if __name__ == "__main__":
    main()
