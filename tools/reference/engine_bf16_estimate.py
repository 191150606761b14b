"""Estimates how far kimirt's BF16 mode should land from a fixture's `logits_fp32`, by running
the reference with only the roundings docs/numerics.md lists for that mode: on calls of more than
64 rows (the CUDA decode kernels' limit; shorter calls are near-F32) every GEMM's activation input
is rounded to BF16 (PrefillGemm, MoE prefill experts, the router's GEMM) and the MLA layer takes
its BF16 path (q, k, v, P rounded; modelled by the reference's own BF16 MLA, which rounds a little
more). Everything else is float64. An estimate for choosing a bar, not a golden.

usage: python3 tools/reference/engine_bf16_estimate.py FIXTURE_DIR
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_reference import Model  # noqa: E402
from safetensors_io import read_file, round_bf16  # noqa: E402

PREFILL_ROWS = 64


class EngineBf16Estimate(Model):
    def __init__(self, directory):
        super().__init__(directory, "f64")
        self.rounding = False

    def r(self, x):
        return round_bf16(x) if self.rounding else x

    def linear(self, x, w):
        return self.r((round_bf16(x) if x.shape[0] > PREFILL_ROWS else x) @ w.T)

    def route(self, y, p):
        return super().route(round_bf16(y) if y.shape[0] > PREFILL_ROWS else y, p)

    def mla(self, i, x):
        self.rounding = x.shape[0] > PREFILL_ROWS
        try:
            return super().mla(i, x)
        finally:
            self.rounding = False


def main(directory):
    g = read_file(os.path.join(directory, "goldens.safetensors"))
    m = EngineBf16Estimate(directory)
    p = 0
    while f"prompt{p}.ids" in g:
        want, ref = g[f"prompt{p}.logits_fp32"], g[f"prompt{p}.logits_bf16"]
        got = m.forward(g[f"prompt{p}.ids"])
        rl = lambda a: np.linalg.norm(a - want) / np.linalg.norm(want)  # noqa: E731
        print(f"prompt{p} T={len(want)}: estimate vs fp32 rel-L2 {rl(got):.4f}; reference bf16 vs fp32 {rl(ref):.4f}")
        p += 1


if __name__ == "__main__":
    main(sys.argv[1])
