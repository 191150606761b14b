"""Validates the reference against the fixtures' goldens (tests/fixtures/*/goldens.safetensors,
debug.safetensors): FP32 logits of every prompt, prompt 2's per-layer outputs, every routing
decision, the greedy continuation; then the BF16 mode against `logits_bf16` (routing first, as
the fixture READMEs explain). Prints one table; exits non-zero when an FP32 bar fails, or when a
fixture this reference made (goldens metadata `producer`) is no longer its output in BF16 mode.

usage: python3 tools/reference/check_fixtures.py [FIXTURE_DIR ...]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_reference import Model  # noqa: E402
from safetensors_io import read_file, read_metadata  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FP32_LOGIT_BAR = 1e-5  # max|diff| / max|logit|: the fixtures' README ("~1e-5")
FP32_LAYER_BAR = 5e-5  # rel-L2 per layer output (the READMEs' bar for an F32 engine)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prompts(g):
    n = 0
    while f"prompt{n}.ids" in g:
        n += 1
    return n


def check(fx_dir):
    name = os.path.basename(os.path.normpath(fx_dir))
    g = read_file(os.path.join(fx_dir, "goldens.safetensors"))
    # Goldens this reference made (make_fixture.py) must still be its output in both modes.
    ours = read_metadata(os.path.join(fx_dir, "goldens.safetensors")).get("producer", "").startswith("tools/reference")
    dbg_path = os.path.join(fx_dir, "debug.safetensors")
    dbg = read_file(dbg_path) if os.path.exists(dbg_path) else {}
    ok = True
    f64, b16 = Model(fx_dir, "f64"), Model(fx_dir, "bf16")
    print(f"== {name}")
    for p in range(prompts(g)):
        ids = g[f"prompt{p}.ids"]
        want, want_b = g[f"prompt{p}.logits_fp32"], g[f"prompt{p}.logits_bf16"]
        f64.trace, b16.trace = {}, {}
        got, got_b = f64.forward(ids), b16.forward(ids)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        ok &= err <= FP32_LOGIT_BAR
        # Routing: ours vs the goldens' decisions, both modes.
        route = {"fp32": [0, 0], "bf16": [0, 0]}
        first_flip = len(ids)
        for key, tr in (("fp32", f64.trace), ("bf16", b16.trace)):
            for k, idx in tr.items():
                if not k.endswith("route_idx"):
                    continue
                layer = k.split(".")[0]
                gk = f"prompt{p}.{layer}.route_idx_{key}"
                if gk not in dbg:
                    continue
                same = np.all(idx == dbg[gk], axis=-1)
                route[key][0] += int(same.sum())
                route[key][1] += same.size
                if key == "bf16" and not same.all():
                    first_flip = min(first_flip, int(np.argmin(same)))
        ok &= route["fp32"][0] == route["fp32"][1]
        if ours:
            ok &= rel_l2(got_b, want_b) <= 1e-6 and route["bf16"][0] == route["bf16"][1]
        pre = (f" | bf16 vs logits_bf16 rel-L2 {rel_l2(got_b, want_b):.2e}, before the first routing "
               f"difference (t<{first_flip}) {rel_l2(got_b[:first_flip], want_b[:first_flip]):.2e}"
               if first_flip > 0 else " | bf16: routing differs at t=0")
        print(f"prompt{p} T={len(ids)}: fp32 max|diff|/max {err:.2e} rel-L2 {rel_l2(got, want):.2e}; "
              f"routing fp32 {route['fp32'][0]}/{route['fp32'][1]} bf16 {route['bf16'][0]}/{route['bf16'][1]}"
              f"{pre}; spread bf16-vs-fp32: ours {rel_l2(got_b, got):.3f} goldens {rel_l2(want_b, want):.3f}")
        if p == 2:
            worst = 0.0
            for k, v in f64.trace.items():
                if k.endswith("attn_out") or k.endswith("ffn_out"):
                    worst = max(worst, rel_l2(v, g[f"prompt2.{k}"]))
            ok &= worst <= FP32_LAYER_BAR
            print(f"prompt2 per-layer attn_out/ffn_out: worst rel-L2 {worst:.2e}")
    if "prompt1.greedy_fp32" in g:
        toks, _ = f64.greedy(g["prompt1.ids"], len(g["prompt1.greedy_fp32"]))
        same = toks == list(g["prompt1.greedy_fp32"])
        ok &= same
        print(f"greedy_fp32 ({len(toks)} steps): {'identical' if same else 'DIFFERS'}")
    return ok


def main(argv):
    names = ("tiny-a", "tiny-b", "kimi-linear-tiny", "kimi-linear-realheads", "k3-realheads")
    dirs = argv or [os.path.join(ROOT, "tests", "fixtures", f) for f in names]
    ok = all([check(d) for d in dirs])
    print("FP32 bars (and this reference's own BF16 goldens):", "met" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
