// CPU reference kernels of gated NoPE MLA attention (spec §6.4–§6.6), in FP32, over a
// contiguous per-sequence latent cache. Plain functions over row-major float arrays.
#pragma once

#include <cstdint>
#include <functional>

namespace kimirt::cpu {

struct MlaAttentionArgs {
  int64_t tokens = 0;      // T new query tokens at positions start .. start+T-1
  int64_t start = 0;       // tokens already in the cache before these
  int64_t heads = 0;       // H (this rank's heads)
  int64_t nope_dim = 0;    // dn (128 in K3)
  int64_t rope_dim = 0;    // dr (64): the shared-key dims, used unrotated (spec §6.3)
  int64_t v_dim = 0;       // dv (128)
  int64_t latent_dim = 0;  // r (512)
  const float* q = nullptr;        // [T, H, dn + dr]   per head [q_nope ‖ q_shared]
  const float* cache_c = nullptr;  // [start + T, r]     normed latent (kv_a_layernorm output)
  const float* cache_ks = nullptr; // [start + T, dr]    raw shared key
  const float* w_kvb = nullptr;    // [H * (dn + dv), r] kv_b_proj rows of these heads: per head
                                   //   dn rows of W_UK then dv rows of W_UV (spec §2.5, §6.6)
  float scale = 0.0f;              // softmax scale, 1/sqrt(dn + dr)
};

// Expanded form (spec §6.2, §6.4): k_n, v = c · W_kvbᵀ per cached token; scores over
// [k_n ‖ k_s]; causal (query t sees cache positions 0 .. start+t); softmax in FP32.
//   o [T, H, dv]
void MlaAttentionExpanded(const MlaAttentionArgs& a, float* o);

// Weight-absorbed form (spec §6.6): q̄ = W_UKᵀ q_n, scores q̄·c + q_s·k_s, ō = Σ p c,
// o = W_UV ō. Same result as the expanded form up to rounding.
void MlaAttentionAbsorbed(const MlaAttentionArgs& a, float* o);

// Cache row s as F32: sets *c [r] and *ks [dr] to its values, either pointers into the cache
// itself or into `scratch` [r + dr] after widening stored codes (paged storage).
using LatentRowReader = std::function<void(int64_t s, float* scratch, const float** c, const float** ks)>;

// The absorbed form reading the cache through `rows` (a.cache_c, a.cache_ks unused): the same
// arithmetic in the same order as MlaAttentionAbsorbed, so the same bits for the same row values.
void MlaAttentionAbsorbedRows(const MlaAttentionArgs& a, const LatentRowReader& rows, float* o);

}  // namespace kimirt::cpu
