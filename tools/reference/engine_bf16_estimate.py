"""Estimates how far kimirt's BF16 mode should land from a fixture's `logits_fp32`, by running
the reference with only the roundings docs/numerics.md lists for that mode: on calls of more than
64 rows (the CUDA decode kernels' limit; shorter calls are near-F32) every GEMM's activation input
is rounded to BF16 (PrefillGemm, MoE prefill experts, the router's GEMM); the MLA layer takes its
BF16 path (q, k, v, P rounded; modelled by the reference's own BF16 MLA, which rounds a little
more); KDA runs the chunked form (spec §5.5, 64-token chunks) with what docs/cuda.md says the
BF16-mode kernels store as BF16 rounded: W, Q̃, U, K̃ᵀ, Aqk, the state's operand copy and V'.
Everything else is float64. An estimate for choosing a bar, not a golden.

usage: python3 tools/reference/engine_bf16_estimate.py FIXTURE_DIR
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_reference import Model  # noqa: E402
from safetensors_io import read_file, round_bf16  # noqa: E402

PREFILL_ROWS = 64
CHUNK = 64


def chunked_kda(qh, kh, v, alpha, beta, rnd):
    """Spec §5.5, one sequence from position 0; `rnd` rounds the values the kernels hold in BF16
    (identity gives the exact chunked form, equal to §5.4 up to float64 rounding)."""
    T, H, K = qh.shape
    S = np.zeros((H, K, v.shape[-1]))
    o = np.empty((T, H, v.shape[-1]))
    for c0 in range(0, T, CHUNK):
        c1 = min(T, c0 + CHUNK)
        for h in range(H):
            q, k, vv, b = qh[c0:c1, h], kh[c0:c1, h], v[c0:c1, h], beta[c0:c1, h]
            G = np.cumsum(alpha[c0:c1, h], axis=0)  # Γ [C, K]
            n = c1 - c0
            E = np.exp(G[:, None, :] - G[None, :, :])  # e^{Γ_r - Γ_c} [r, c, K]
            kk = np.einsum("rd,cd,rcd->rc", k, k, np.where(np.tril(np.ones((n, n)), -1)[:, :, None] > 0, E, 0))
            A = -b[:, None] * kk  # strictly lower
            Tm = np.linalg.solve(np.eye(n) - A, np.diag(b))  # (I - A)^-1 diag(β)
            W = rnd(Tm @ (k * np.exp(G)))
            U = rnd(Tm @ vv)
            Qt = rnd(q * np.exp(G))
            Kt = rnd(k * np.exp(G[-1] - G))
            Aqk = rnd(np.einsum("rd,cd,rcd->rc", q, k, np.where(np.tril(np.ones((n, n)))[:, :, None] > 0, E, 0)))
            Sb = rnd(S[h])
            Vp = rnd(U - W @ Sb)
            o[c0:c1, h] = Qt @ Sb + Aqk @ Vp
            S[h] = np.exp(G[-1])[:, None] * S[h] + Kt.T @ Vp
    return o


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

    def kda_core(self, qh, kh, v, alpha, beta):
        if qh.shape[0] <= PREFILL_ROWS:
            return super().kda_core(qh, kh, v, alpha, beta)
        return chunked_kda(qh, kh, v, alpha, beta, round_bf16)

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
