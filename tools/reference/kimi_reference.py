"""An independent float64 forward pass of Kimi-K3 and Kimi-Linear-48B, written from the model
specification (../shared/docs/k3-model-spec.md; section numbers below are that file's), not
from kimirt's C++. Two numeric modes:

- "f64": every operation in float64 on the checkpoint's stored values (the math the FP32 goldens
  approximate; float64 makes the rounding of this implementation negligible).
- "bf16": the reference's BF16 dtype policy (spec §3, §4.2, §6.4, §7.2, §12): every GEMM output,
  norm output, conv output, KDA core output, MLA score/probability/output, residual add and the
  logits rounded to BF16 where the spec says; the FP32 islands (router, SiTU, KDA gate and
  recurrence, RMSNorm interior, AttnRes, MoE combine sum, softmax) computed in float64 and
  rounded where the spec rounds their result. GEMMs take BF16 inputs and sum exactly (float64)
  before the one BF16 rounding of the output — the F32 accumulation of a tensor-core GEMM differs
  from that by far less than the rounding.
"""
import json
import os

import numpy as np

from safetensors_io import read_checkpoint, round_bf16

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def dequant_mxfp4(packed, scale):
    """§2.9: byte j of a row holds element 2j (low nibble) and 2j+1 (high nibble); bit 3 of a
    nibble is the sign, bits 0-2 index E2M1; one E8M0 scale 2^(s-127) per 32 inputs."""
    packed = packed.astype(np.int64)
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.int64)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    vals = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    exps = np.repeat(scale.astype(np.float64) - 127.0, 32, axis=1)
    return vals * np.exp2(exps)


class Config:
    """§1.1-§1.4: the fields the forward pass reads, from config.json (K3 wrapper with
    `text_config`, or a top-level `kimi_linear` config for Kimi-Linear-48B)."""

    def __init__(self, path):
        with open(path) as f:
            top = json.load(f)
        self.is_k3 = "text_config" in top  # K3 wrapper: names under language_model.
        c = top.get("text_config", top)
        la = c["linear_attn_config"]
        self.vocab = c["vocab_size"]
        self.hidden = c["hidden_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora = c["kv_lora_rank"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.mla_gate = bool(c.get("mla_use_output_gate", False))
        self.kda_heads, self.kda_dim = la["num_heads"], la["head_dim"]
        self.conv = la.get("short_conv_kernel_size", 4)
        self.full_rank_gate = bool(la.get("use_full_rank_gate", False))
        self.lower_bound = la.get("gate_lower_bound")
        kda = set(la["kda_layers"])
        full = set(la["full_attn_layers"])
        if kda | full != set(range(1, self.layers + 1)) or kda & full:
            raise ValueError("kda_layers and full_attn_layers must partition 1..num_hidden_layers (§1.2)")
        self.is_kda = [(i + 1) in kda for i in range(self.layers)]  # §1.2: lists are 1-indexed
        self.first_dense = c.get("first_k_dense_replace", 0)
        self.moe_freq = c.get("moe_layer_freq", 1)
        self.experts, self.topk = c["num_experts"], c["num_experts_per_token"]
        self.shared_mult = c.get("num_shared_experts", 0)
        self.latent = c.get("routed_expert_hidden_size")
        self.latent_norm = bool(c.get("latent_moe_use_norm", False))
        self.act = c["hidden_act"]
        self.beta1 = c.get("activation_situ_beta") or 1.0
        self.beta2 = c.get("activation_situ_linear_beta")
        self.renorm = bool(c.get("moe_renormalize", True))
        self.scaling = c.get("routed_scaling_factor", 1.0)
        self.eps = c["rms_norm_eps"]
        self.attn_res = c.get("attn_res_block_size")
        # §1.4: the 48B release gathers the combine weights from the BIASED scores (in-place
        # add on an alias); K3's code takes them from the unbiased scores (§7.2 step 1).
        self.biased_combine = not self.is_k3
        if c.get("moe_router_activation_func", "sigmoid") != "sigmoid":
            raise ValueError("only sigmoid routing is specified (§7.2)")
        if c.get("num_expert_group", 1) != 1 or c.get("topk_group", 1) != 1:
            raise ValueError("grouped top-k with more than one group is not specified here")

    def is_moe(self, i):
        return i >= self.first_dense and i % self.moe_freq == 0


class Weights:
    def __init__(self, directory, cfg):
        self.t = read_checkpoint(directory)
        self.model = "language_model.model." if cfg.is_k3 else "model."
        self.head = "language_model.lm_head.weight" if cfg.is_k3 else "lm_head.weight"

    def __call__(self, name):
        """A model tensor by its name below `model.` (float64)."""
        key = self.model + name
        if key not in self.t:
            raise KeyError(f"checkpoint has no tensor {key}")
        return self.t[key].astype(np.float64)

    def has(self, name):
        return self.model + name in self.t

    def expert(self, prefix):
        """A routed expert matrix: MXFP4 (weight_packed + weight_scale, §2.9) or plain weight."""
        if self.has(prefix + ".weight_packed"):
            return dequant_mxfp4(self.t[self.model + prefix + ".weight_packed"],
                                 self.t[self.model + prefix + ".weight_scale"])
        return self(prefix + ".weight")


class Model:
    def __init__(self, directory, mode="f64"):
        if mode not in ("f64", "bf16"):
            raise ValueError("mode must be f64 or bf16")
        self.cfg = Config(os.path.join(directory, "config.json"))
        self.w = Weights(directory, self.cfg)
        self.mode = mode
        self.trace = None  # dict filled by forward() when set

    # -- rounding policy --------------------------------------------------------------------------
    def r(self, x):
        """A value the reference holds in BF16 (identity in f64 mode)."""
        return round_bf16(x) if self.mode == "bf16" else x

    def linear(self, x, w):
        """§3 GEMM: BF16 x and W, F32 accumulation, BF16 output; y = x · Wᵀ."""
        return self.r(x @ w.T)

    # -- primitives (§3) ----------------------------------------------------------------------------
    def rmsnorm(self, x, w, eps):
        """§3.1 KimiRMSNorm: FP32 interior; the normalized value is rounded to BF16 before the gain."""
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return self.r(w * self.r(y))

    def gated_rmsnorm(self, x, g, w, eps):
        """§3.2: per head, all FP32: x̂ · w · σ(g), one BF16 rounding."""
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w * sigmoid(g)
        return self.r(y)

    def glu(self, a, u):
        """§3.3 SiTU-GLU (FP32, one rounding) or the 48B SiLU-GLU (§1.4: silu(gate) · up)."""
        c = self.cfg
        if c.act == "situ":
            s = c.beta1 * np.tanh(a / c.beta1) * sigmoid(a)
            cu = u if c.beta2 is None else c.beta2 * np.tanh(u / c.beta2)
            return self.r(s * cu)
        if c.act == "silu":
            return self.r(self.r(a * sigmoid(a)) * u)  # PyTorch: act_fn(gate) * up, two BF16 ops
        raise ValueError(f"unsupported hidden_act {c.act}")

    def mlp(self, y, gate, up, down):
        return self.linear(self.glu(self.linear(y, gate), self.linear(y, up)), down)

    def conv_silu(self, x, w):
        """§3.5: y_t = silu(Σ_j w[j] · x_{t-W+1+j}), zeros before the start; FP32, BF16 out."""
        T, P = x.shape
        W = w.shape[-1]
        w = w.reshape(P, W)
        xp = np.concatenate([np.zeros((W - 1, P)), x], axis=0)
        acc = np.zeros((T, P))
        for j in range(W):
            acc += w[:, j] * xp[j:j + T]
        return self.r(acc * sigmoid(acc))

    # -- KDA (§5) -----------------------------------------------------------------------------------
    def kda(self, i, x):
        c, w = self.cfg, self.w
        p = f"layers.{i}.self_attn."
        H, K = c.kda_heads, c.kda_dim
        T = x.shape[0]
        q = self.conv_silu(self.linear(x, w(p + "q_proj.weight")), w(p + "q_conv1d.weight"))  # §5.1-5.2
        k = self.conv_silu(self.linear(x, w(p + "k_proj.weight")), w(p + "k_conv1d.weight"))
        v = self.conv_silu(self.linear(x, w(p + "v_proj.weight")), w(p + "v_conv1d.weight"))
        f = self.linear(self.linear(x, w(p + "f_a_proj.weight")), w(p + "f_b_proj.weight"))
        beta = sigmoid(self.linear(x, w(p + "b_proj.weight")))  # [T, H], §5.3
        a_log = w(p + "A_log").reshape(-1)[:H]  # §2.11: entries past H are padding
        dt = w(p + "dt_bias").reshape(H, K)
        f = f.reshape(T, H, K) + dt
        A = np.exp(a_log)[None, :, None]
        if c.lower_bound is not None:  # §5.3 bounded-sigmoid decay
            alpha = c.lower_bound * sigmoid(A * f)
        else:  # §1.4 / §5.3: Kimi-Linear-48B softplus decay
            alpha = -A * softplus(f)
        q = q.reshape(T, H, K)
        k = k.reshape(T, H, K)
        v = v.reshape(T, H, K)
        qh = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) / np.sqrt(K)  # §3.4
        kh = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
        o = self.r(self.kda_core(qh, kh, v, alpha, beta))
        if c.full_rank_gate:  # §5.1 g_proj; §1.4 low-rank g_a/g_b for the 48B
            g = self.linear(x, w(p + "g_proj.weight"))
        else:
            g = self.linear(self.linear(x, w(p + "g_a_proj.weight")), w(p + "g_b_proj.weight"))
        on = self.gated_rmsnorm(o, g.reshape(T, H, K), w(p + "o_norm.weight"), c.eps)  # §5.6
        return self.linear(on.reshape(T, H * K), w(p + "o_proj.weight"))

    def kda_core(self, qh, kh, v, alpha, beta):
        """§5.4 recurrence, per head, token by token; S[d, j]: key channel d, value channel j.
        qh, kh, v, alpha: [T, H, K]; beta: [T, H]. Returns o [T, H, K]."""
        T, H, K = qh.shape
        S = np.zeros((H, K, v.shape[-1]))
        o = np.empty((T, H, v.shape[-1]))
        for t in range(T):
            S *= np.exp(alpha[t])[:, :, None]
            pred = np.einsum("hd,hdj->hj", kh[t], S)
            delta = beta[t][:, None] * (v[t] - pred)
            S += kh[t][:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hd,hdj->hj", qh[t], S)
        return o

    # -- MLA (§6) -----------------------------------------------------------------------------------
    def mla(self, i, x):
        c, w = self.cfg, self.w
        p = f"layers.{i}.self_attn."
        H, dn, dr, dv, R = c.heads, c.dn, c.dr, c.dv, c.kv_lora
        T = x.shape[0]
        if c.q_lora:  # §6.1
            cq = self.rmsnorm(self.linear(x, w(p + "q_a_proj.weight")), w(p + "q_a_layernorm.weight"), 1e-6)
            q = self.linear(cq, w(p + "q_b_proj.weight"))
        else:  # §1.4: single q_proj
            q = self.linear(x, w(p + "q_proj.weight"))
        q = q.reshape(T, H, dn + dr)
        a = self.linear(x, w(p + "kv_a_proj_with_mqa.weight"))  # §6.2
        lat = self.rmsnorm(a[:, :R], w(p + "kv_a_layernorm.weight"), 1e-6)
        ks = a[:, R:]  # not normalized, never rotated (§6.3)
        kv = self.linear(lat, w(p + "kv_b_proj.weight")).reshape(T, H, dn + dv)
        kn, v = kv[:, :, :dn], kv[:, :, dn:]
        k = np.concatenate([kn, np.broadcast_to(ks[:, None, :], (T, H, dr))], axis=-1)
        scale = (dn + dr) ** -0.5
        s = np.einsum("thd,shd->hts", q, k)  # §6.4
        s = self.r(self.r(s) * scale)  # eager reference: BF16 QKᵀ, scaled in BF16
        s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        prob = self.r(s / s.sum(axis=-1, keepdims=True))  # FP32 softmax, probabilities to BF16
        o = self.r(np.einsum("hts,shd->thd", prob, v)).reshape(T, H * dv)
        if c.mla_gate:  # §6.4 output gate, in BF16
            o = self.r(o * self.r(sigmoid(self.linear(x, w(p + "g_proj.weight")))))
        return self.linear(o, w(p + "o_proj.weight"))

    # -- FFN (§7) -----------------------------------------------------------------------------------
    def route(self, y, p):
        """§7.2 step 1 (all FP32): sigmoid scores, top-k of score + correction bias, combine
        weights from the unbiased (K3) or biased (48B, §1.4) scores, renormalized, scaled.
        Ties at the selection boundary go to the lower expert id (a stable sort); the spec leaves
        torch.topk's order unspecified (§12), and the fixtures' margins are far from ties."""
        c, w = self.cfg, self.w
        logits = y @ w(p + "gate.weight").T
        s = sigmoid(logits)
        choice = s + w(p + "gate.e_score_correction_bias")
        idx = np.argsort(-choice, axis=-1, kind="stable")[:, :c.topk]
        src = choice if c.biased_combine else s
        wt = np.take_along_axis(src, idx, axis=-1)
        if c.renorm and c.topk > 1:
            wt = wt / (wt.sum(axis=-1, keepdims=True) + 1e-20)
        srt = np.sort(choice, axis=-1)[:, ::-1]
        margin = srt[:, c.topk - 1] - srt[:, c.topk] if c.experts > c.topk else np.full(len(y), np.inf)
        return idx, wt * c.scaling, margin

    def moe(self, i, y):
        c, w = self.cfg, self.w
        p = f"layers.{i}.block_sparse_moe."
        idx, wt, margin = self.route(y, p)
        if self.trace is not None:
            self.trace[f"layer{i}.route_idx"] = np.sort(idx, axis=-1)
            self.trace[f"layer{i}.route_margin"] = margin
        z = self.linear(y, w(p + "routed_expert_down_proj.weight")) if c.latent else y  # §7.2 step 2
        acc = np.zeros((y.shape[0], z.shape[1]))
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            ep = p + f"experts.{e}."
            out = self.mlp(z[rows], w.expert(ep + "w1"), w.expert(ep + "w3"), w.expert(ep + "w2"))  # step 3
            acc[rows] += wt[rows, slot][:, None] * out  # step 4: FP32 sum of BF16 outputs
        r = self.r(acc)
        if c.latent:
            if c.latent_norm:  # step 5
                r = self.rmsnorm(r, w(p + "routed_expert_norm.weight"), c.eps)
            r = self.linear(r, w(p + "routed_expert_up_proj.weight"))  # step 6
        if c.shared_mult:  # step 7
            sp = p + "shared_experts."
            r = self.r(r + self.mlp(y, w(sp + "gate_proj.weight"), w(sp + "up_proj.weight"),
                                    w(sp + "down_proj.weight")))
        return r

    def ffn(self, i, y):
        if self.cfg.is_moe(i):
            return self.moe(i, y)
        p = f"layers.{i}.mlp."  # §7.1
        w = self.w
        return self.mlp(y, w(p + "gate_proj.weight"), w(p + "up_proj.weight"), w(p + "down_proj.weight"))

    # -- AttnRes (§8) -------------------------------------------------------------------------------
    def attn_res_mix(self, bank, prefix, proj, norm):
        """§8.2: candidates [bank..., prefix]; keys RMS-normalized without gain; pseudo-query
        norm.weight ⊙ proj[0]; softmax over candidates; mix of the unnormalized candidates."""
        cands = np.stack(bank + [prefix])  # [n, T, D]
        q = self.w(norm).reshape(-1) * self.w(proj).reshape(-1)
        kh = cands / np.sqrt(np.mean(cands * cands, axis=-1, keepdims=True) + self.cfg.eps)
        sc = kh @ q  # [n, T]
        sc = np.exp(sc - sc.max(axis=0, keepdims=True))
        pr = sc / sc.sum(axis=0, keepdims=True)
        return self.r(np.einsum("nt,ntd->td", pr, cands))

    # -- whole model (§4) ---------------------------------------------------------------------------
    def layer_io(self, i, kind, out):
        if self.trace is not None:
            self.trace[f"layer{i}.{kind}"] = out

    def forward(self, ids):
        """Logits [T, vocab] of every position of one prompt (float64; BF16 values in bf16 mode)."""
        c, w = self.cfg, self.w
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= c.vocab:
            raise ValueError("token id out of range")
        h = w("embed_tokens.weight")[ids]  # §4 step 1
        attn = lambda i, x: self.kda(i, x) if c.is_kda[i] else self.mla(i, x)
        if c.attn_res:
            prefix, bank = h, []  # §4 steps 2-4, §4.1, §8
            for i in range(c.layers):
                lp = f"layers.{i}."
                a = self.attn_res_mix(bank, prefix, lp + "self_attention_res_proj.weight",
                                      lp + "self_attention_res_norm.weight") if bank else prefix
                if i % c.attn_res == 0:
                    bank.append(prefix)
                    prefix = None
                o = attn(i, self.rmsnorm(a, w(lp + "input_layernorm.weight"), c.eps))
                self.layer_io(i, "attn_out", o)
                prefix = o if prefix is None else self.r(prefix + o)
                b = self.attn_res_mix(bank, prefix, lp + "mlp_res_proj.weight", lp + "mlp_res_norm.weight")
                f = self.ffn(i, self.rmsnorm(b, w(lp + "post_attention_layernorm.weight"), c.eps))
                self.layer_io(i, "ffn_out", f)
                prefix = self.r(prefix + f)
            m = self.attn_res_mix(bank, prefix, "output_attn_res_proj.weight", "output_attn_res_norm.weight")
        else:  # §1.3 / §1.4: plain pre-norm residual
            for i in range(c.layers):
                lp = f"layers.{i}."
                o = attn(i, self.rmsnorm(h, w(lp + "input_layernorm.weight"), c.eps))
                self.layer_io(i, "attn_out", o)
                h = self.r(h + o)
                f = self.ffn(i, self.rmsnorm(h, w(lp + "post_attention_layernorm.weight"), c.eps))
                self.layer_io(i, "ffn_out", f)
                h = self.r(h + f)
            m = h
        hn = self.rmsnorm(m, w("norm.weight"), c.eps)  # §4 step 5
        return self.r(hn @ w.t[w.head].astype(np.float64).T)  # step 6: BF16 logits in bf16 mode

    def greedy(self, ids, steps):
        """Greedy continuation, each step a full prefill of prompt + generated; returns the
        tokens and the top1 - top2 logit gap of each step."""
        seq, toks, margins = list(ids), [], []
        for _ in range(steps):
            last = self.forward(seq)[-1]
            top = np.argsort(-last, kind="stable")
            toks.append(int(top[0]))
            margins.append(float(last[top[0]] - last[top[1]]))
            seq.append(int(top[0]))
        return toks, margins
