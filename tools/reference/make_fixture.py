"""Writes a fixture's goldens from the reference (goldens.safetensors, debug.safetensors,
stats.json), for a checkpoint already in the fixture directory (made by
`kimirt make-checkpoint --random`; see tests/fixtures/kimi-linear-realheads/README.md).

goldens.safetensors (the layout of the other fixtures' goldens):
  prompt{i}.ids I32 [T]; prompt{i}.logits_fp32 F32 [T, vocab] (float64 mode, stored F32);
  prompt{i}.logits_bf16 F32 [T, vocab] (the reference's BF16 policy; BF16 values);
  prompt1.greedy_{fp32,bf16} I32 [steps] and _margin F32 (full re-prefill each step);
  prompt2.layer{l}.attn_out / .ffn_out F32 [T, hidden] (float64 mode).
debug.safetensors: prompt{i}.layer{l}.route_idx_{fp32,bf16} I32 [T, k] (sorted expert ids) and
  route_margin_{fp32,bf16} F32 [T] (k-th minus (k+1)-th of sigmoid(logits) + bias).

usage: python3 tools/reference/make_fixture.py DIR [--lengths 1,7,70,200] [--seed 1] [--greedy 24]
       [--decisive MARGIN]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_reference import Model  # noqa: E402
from safetensors_io import write_file  # noqa: E402


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def decisive_ids(model, T, rng, margin):
    """T token ids drawn uniformly one position at a time, each redrawn until every MoE layer's
    top-k selection margin at that position (float64 mode) exceeds `margin`. The model is causal,
    so a position's routing depends only on the ids up to it: earlier choices stay valid. With
    no decision near a tie, BF16 rounding (~1e-2 relative) cannot flip a routing decision, and the
    prompt's bf16-vs-fp32 spread measures rounding rather than routing chaos."""
    ids = []
    while len(ids) < T:
        for _ in range(1000):
            cand = ids + [int(rng.integers(0, model.cfg.vocab))]
            model.trace = {}
            model.forward(cand)
            if all(v[-1] > margin for k, v in model.trace.items() if k.endswith("route_margin")):
                ids = cand
                break
        else:
            raise RuntimeError(f"no token keeps every routing margin above {margin} at position {len(ids)}")
    return np.array(ids, dtype=np.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--lengths", default="1,7,70,200")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--greedy", type=int, default=24)
    ap.add_argument("--decisive", type=float, default=0.0,
                    help="draw each prompt token until every routing margin there exceeds this (0: plain uniform ids)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    f64, b16 = Model(a.dir, "f64"), Model(a.dir, "bf16")
    vocab = f64.cfg.vocab
    rng = np.random.default_rng(a.seed)
    gold, dbg, stats = {}, {}, {"prompts": []}
    for p, T in enumerate(lengths):
        if a.decisive > 0:
            ids = decisive_ids(f64, T, rng, a.decisive)
        else:
            ids = rng.integers(0, vocab, size=T).astype(np.int32)
        f64.trace, b16.trace = {}, {}
        lf, lb = f64.forward(ids), b16.forward(ids)
        gold[f"prompt{p}.ids"] = ("I32", ids)
        gold[f"prompt{p}.logits_fp32"] = ("F32", lf)
        gold[f"prompt{p}.logits_bf16"] = ("F32", lb)
        same_route = np.ones(T, dtype=bool)
        for mode, tr in (("fp32", f64.trace), ("bf16", b16.trace)):
            for k, v in tr.items():
                layer, kind = k.split(".")
                if kind in ("route_idx", "route_margin"):
                    dt = "I32" if kind == "route_idx" else "F32"
                    dbg[f"prompt{p}.{layer}.{kind}_{mode}"] = (dt, v)
                elif p == 2 and mode == "fp32":
                    gold[f"prompt2.{k}"] = ("F32", v)
        bf16_margin_small = np.zeros(T, dtype=bool)
        for k, v in f64.trace.items():
            if k.endswith("route_idx"):
                same_route &= np.all(v == b16.trace[k], axis=-1)
                bf16_margin_small |= b16.trace[k.replace("idx", "margin")] < 2e-3
        stats["prompts"].append({
            "T": T,
            "max_abs_logit_fp32": float(np.abs(lf).max()),
            "bf16_vs_fp32_rel_l2": rel_l2(lb, lf),
            "bf16_vs_fp32_max_abs": float(np.abs(lb - lf).max()),
            "argmax_agree": int(np.sum(lb.argmax(-1) == lf.argmax(-1))),
            "fp32_top1_top2_min_gap": float(np.min(np.diff(np.sort(lf, axis=-1)[:, -2:], axis=-1))),
            "tokens_routed_identically": int(same_route.sum()),
            "tokens_with_bf16_margin_below_2e-3": int(bf16_margin_small.sum()),
        })
        print(f"prompt{p} T={T}: bf16 vs fp32 rel-L2 {stats['prompts'][-1]['bf16_vs_fp32_rel_l2']:.4f}, "
              f"routed identically {same_route.sum()}/{T}", flush=True)
    margins = {}
    for k, (_, v) in dbg.items():
        if k.endswith("route_margin_fp32"):
            layer = k.split(".")[1]
            margins[layer] = min(margins.get(layer, np.inf), float(v.min()))
    stats["min_fp32_route_margin_per_moe_layer"] = margins
    if a.greedy:
        ids1 = gold["prompt1.ids"][1]
        for mode, m in (("fp32", f64), ("bf16", b16)):
            m.trace = None
            toks, marg = m.greedy(ids1, a.greedy)
            gold[f"prompt1.greedy_{mode}"] = ("I32", np.array(toks, dtype=np.int32))
            gold[f"prompt1.greedy_{mode}_margin"] = ("F32", np.array(marg))
        stats["greedy_fp32_min_margin"] = float(np.min(gold["prompt1.greedy_fp32_margin"][1]))
        stats["greedy_bf16_equal_steps"] = int(np.sum(gold["prompt1.greedy_fp32"][1] == gold["prompt1.greedy_bf16"][1]))
    meta = {"producer": "tools/reference/make_fixture.py (float64 reference, NumPy " + np.__version__ + ")"}
    write_file(os.path.join(a.dir, "goldens.safetensors"), gold, meta)
    write_file(os.path.join(a.dir, "debug.safetensors"), dbg, meta)
    with open(os.path.join(a.dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
