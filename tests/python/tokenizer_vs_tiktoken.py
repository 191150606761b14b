#!/usr/bin/env python3
"""Reference token ids from the PyPI `tiktoken` library, for the C++ tokenizer to match
(src/kimirt/tokenizer/tokenizer_test.cpp, TokenizerVsTiktoken.*; spec §10.1).

  tokenizer_vs_tiktoken.py --out DIR [--gsm8k GSM8K_DIR] [--builtin ASSETS_DIR]
                           [--large-ranks 20000] [--no-probes]

Builds the corpus (tokenizer_corpus.py) and encodes it the way NeMo's tokenization_kimi.py drives
tiktoken: each segment cut into <= 400,000-character chunks and at runs of more than 25,000
whitespace / non-whitespace characters, each slice encoded with `encode_ordinary` (plain text, as
the chat renderer encodes user text) and with `encode(allowed_special="all")` (markers), using the
K3 pattern string (with its `&&` intersections) and these vocabularies:
  builtin  assets/builtin (the demo model's 4,096 ranks);
  large    ~20,000 ranks learned here by scripts/train_builtin_bpe.py from the multilingual part
           of the corpus and GSM8K test (multi-byte merges in many scripts);
  probes   every code point of planes 0-3 and 14 in contexts that reveal its class in the pattern
           (tokenizer_corpus.py), ordinary encoding only: checks the PCRE2 rewrite's Unicode
           tables against tiktoken's.
Writes into DIR (little-endian):
  manifest.json              suites, files and sizes
  corpus.bin                 u32 count, then per segment: u32 label length, label, u32 length, UTF-8
  <suite>.<mode>.bin         u32 count, then per segment: u32 n, n x i32 ids
  large/, probes/            tiktoken.model + tokenizer_config.json
  probes.txt, probes.ids     all probes joined by a separator special token; its ids (u16)
"""

import argparse
import array
import base64
import json
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import tiktoken  # noqa: E402

import tokenizer_corpus  # noqa: E402
import train_builtin_bpe as bpe  # noqa: E402

MAX_ENCODE_CHARS = 400_000
MAX_CONSECUTIVE = 25_000
PROBE_SEPARATOR = "<|s|>"


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def special_tokens(vocab_dir, num_base):
    """NeMo's naming: added_tokens_decoder content for ids in the reserved range, else
    <|reserved_token_{id}|>."""
    named = {}
    path = os.path.join(vocab_dir, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for key, entry in json.load(f).get("added_tokens_decoder", {}).items():
                named[int(key)] = entry["content"]
    ids = range(num_base, num_base + bpe.NUM_RESERVED)
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in ids}


def make_encoding(name, vocab_dir):
    ranks = load_ranks(os.path.join(vocab_dir, "tiktoken.model"))
    specials = special_tokens(vocab_dir, len(ranks))
    return tiktoken.Encoding(name=name, pat_str=bpe.K3_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials), specials


def nemo_slices(text):
    """The substrings NeMo's _encode_text_piece passes to tiktoken (our own implementation of its
    400,000-character chunks and 25,000-character run limit)."""
    for start in range(0, len(text), MAX_ENCODE_CHARS):
        chunk = text[start:start + MAX_ENCODE_CHARS]
        slice_start, run, run_is_space = 0, 0, chunk[0].isspace()
        for i, ch in enumerate(chunk):
            space = ch.isspace()
            if space != run_is_space:
                run, run_is_space = 1, space
            else:
                run += 1
                if run > MAX_CONSECUTIVE:
                    yield chunk[slice_start:i]
                    slice_start, run = i, 1
        yield chunk[slice_start:]


def encode(enc, text, mode):
    ids = []
    for s in nemo_slices(text):
        if mode == "ordinary":
            ids.extend(enc.encode_ordinary(s))
        else:
            ids.extend(enc.encode(s, allowed_special="all"))
    return ids


def write_segments(path, segments):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(segments)))
        for label, text in segments:
            lb, tb = label.encode(), text.encode("utf-8")
            f.write(struct.pack("<I", len(lb)) + lb + struct.pack("<I", len(tb)) + tb)


def write_ids(path, all_ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(all_ids)))
        for ids in all_ids:
            f.write(struct.pack("<I", len(ids)))
            f.write(array.array("i", ids).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gsm8k", default=os.path.join(ROOT, "data", "gsm8k"))
    ap.add_argument("--builtin", default=os.path.join(ROOT, "assets", "builtin"))
    ap.add_argument("--large-ranks", type=int, default=20000)
    ap.add_argument("--no-probes", action="store_true")
    args = ap.parse_args()
    assert sys.byteorder == "little"
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()

    builtin_base = len(load_ranks(os.path.join(args.builtin, "tiktoken.model")))
    names = set(special_tokens(args.builtin, builtin_base)) | set(bpe.special_names(args.large_ranks).values())
    segments = tokenizer_corpus.build_corpus(args.gsm8k, names)
    write_segments(os.path.join(args.out, "corpus.bin"), segments)

    # The large vocabulary: learned from the multilingual segments and GSM8K test.
    large_dir = os.path.join(args.out, "large")
    os.makedirs(large_dir, exist_ok=True)
    train_texts = [t for label, t in segments
                   if label in ("synthetic", "handwritten", "handwritten-joined")]
    with open(os.path.join(args.gsm8k, "test.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            train_texts += [rec["question"], rec["answer"]]
    vocab = bpe.train_bpe(train_texts, args.large_ranks)
    if len(vocab) != args.large_ranks:
        sys.exit(f"learned only {len(vocab)} of {args.large_ranks} ranks")
    bpe.write_tiktoken_model(os.path.join(large_dir, "tiktoken.model"), vocab)
    bpe.write_tokenizer_config(os.path.join(large_dir, "tokenizer_config.json"), len(vocab))
    t_train = time.time()

    suites = []
    for name, vocab_dir in (("builtin", args.builtin), ("large", large_dir)):
        enc, _ = make_encoding(name, vocab_dir)
        suite = {"name": name, "vocab_dir": os.path.abspath(vocab_dir), "segments": "corpus.bin",
                 "expected": {}}
        for mode in ("ordinary", "special"):
            file = f"{name}.{mode}.bin"
            write_ids(os.path.join(args.out, file), [encode(enc, t, mode) for _, t in segments])
            suite["expected"][mode] = file
        suites.append(suite)
    t_corpus = time.time()

    manifest = {
        "tiktoken_version": tiktoken.__version__,
        "pattern": bpe.K3_PATTERN,
        "corpus_segments": len(segments),
        "corpus_bytes": sum(len(t.encode("utf-8")) for _, t in segments),
        "suites": suites,
    }

    if not args.no_probes:
        probes_dir = os.path.join(args.out, "probes")
        os.makedirs(probes_dir, exist_ok=True)
        vocab = tokenizer_corpus.probe_vocab()
        bpe.write_tiktoken_model(os.path.join(probes_dir, "tiktoken.model"), vocab)
        bpe.write_tokenizer_config(os.path.join(probes_dir, "tokenizer_config.json"), len(vocab),
                                   {0: PROBE_SEPARATOR})
        enc, specials = make_encoding("probes", probes_dir)
        cps = tokenizer_corpus.probe_code_points()
        probes = [pre + chr(c) + post for _, pre, post in tokenizer_corpus.PROBE_CONTEXTS
                  for c in cps]
        joined = PROBE_SEPARATOR.join(probes)
        with open(os.path.join(args.out, "probes.txt"), "wb") as f:
            f.write(joined.encode("utf-8"))
        # A special token ends the regex's view, so each probe is pre-tokenized on its own.
        ids = enc.encode(joined, allowed_special={PROBE_SEPARATOR})
        assert enc.n_vocab <= 65536
        with open(os.path.join(args.out, "probes.ids"), "wb") as f:
            f.write(array.array("H", ids).tobytes())  # u16: the probe vocabulary is small
        manifest["probes"] = {
            "vocab_dir": os.path.abspath(probes_dir),
            "text": "probes.txt",
            "ids": "probes.ids",
            "separator": PROBE_SEPARATOR,
            "separator_id": specials[PROBE_SEPARATOR],
            "contexts": [[n, pre, post] for n, pre, post in tokenizer_corpus.PROBE_CONTEXTS],
            "code_points": len(cps),
            "count": len(probes),
        }
    t_probes = time.time()
    manifest["seconds"] = {"corpus_and_training": round(t_train - t0, 2),
                           "corpus_ids": round(t_corpus - t_train, 2),
                           "probes": round(t_probes - t_corpus, 2)}
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
    print(json.dumps({k: v for k, v in manifest.items() if k not in ("suites", "pattern")}))


if __name__ == "__main__":
    main()
