// Model: the Kimi-K3 / Kimi-Linear text decoder, written once against the Backend op interface
// and the Communicator (spec §4–§9). One Model per rank; under tensor parallelism every rank
// runs the same Forward on its shard and the collectives sit where the math needs them.
//
// A forward call continues one sequence from its SequenceState: prefill a prompt at once or in
// chunks, then decode a token at a time; KDA state, conv windows and the paged MLA latent cache
// carry over (spec §5.7, §6.5, §9).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/model/config.h"
#include "kimirt/model/latent_kv_cache.h"
#include "kimirt/model/layout.h"
#include "kimirt/model/weights.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {

struct KdaLayerState {
  Tensor conv_q, conv_k, conv_v;  // [W-1, P_l] the last W-1 pre-conv projections (spec §5.7)
  Tensor recurrent;               // [H_l, K, K] FP32 state S (spec §5.4)
};

// Everything a sequence carries between forward calls (spec §9): KDA conv windows and
// recurrent states, and the block table of its MLA latents in a LatentKvCache. Move-only; its
// blocks go back to the cache when it is destroyed or Release()d. Not shareable across threads.
class SequenceState {
 public:
  SequenceState() = default;
  SequenceState(SequenceState&& o) noexcept { *this = std::move(o); }
  SequenceState& operator=(SequenceState&& o) noexcept;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
  ~SequenceState() { Release(); }
  // Frees the latent blocks and forgets the tokens (KDA state is left for the owner to reset).
  void Release();

  int64_t length = 0;              // tokens already processed
  std::vector<KdaLayerState> kda;  // one per KDA layer, in layer order
  std::vector<int32_t> blocks;     // latent block table (all MLA layers share it)
  LatentKvCache* kv = nullptr;     // where the blocks live; not owned
};

// Host copies of intermediate tensors, for golden and debugging comparisons.
struct ForwardTrace {
  std::vector<Tensor> attn_in, attn_out, ffn_in, ffn_out;  // per layer [T, D]
  std::vector<Tensor> route_idx;  // per layer [T, k] (empty for dense layers)
  Tensor final_norm;              // [T, D]
};

struct ForwardOptions {
  // Default: chunked for calls of more than 64 tokens, recurrent otherwise.
  std::optional<KdaForm> kda_form;
  // Default: expanded for prefill (T > 1), absorbed for decode (T = 1), as engines do.
  std::optional<MlaForm> mla_form;
  bool all_logits = true;  // false: logits of the last position only
  ForwardTrace* trace = nullptr;
};

class Model {
 public:
  // Loads DIR (config.json + checkpoint) as rank comm.rank() of comm.size().
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, Backend& backend, Communicator& comm,
                                              const LoadOptions& options = {});

  const ModelConfig& config() const { return layout_.config(); }
  Backend& backend() const { return be_; }
  const Layout& layout() const { return layout_; }

  // A fresh sequence whose latents live in `kv` (default: a growable F32 cache of the model's
  // own, for tools and tests; the engine passes its paged pool).
  SequenceState NewSequence(LatentKvCache* kv = nullptr);
  // A latent cache shaped for this model (all its MLA layers).
  std::unique_ptr<LatentKvCache> MakeKvCache(int64_t num_blocks, int block_size, KvCacheDType dtype,
                                             bool growable) const;
  // Runs `ids` as the next tokens of `state`. Returns F32 host logits [T, vocab] (or [1, vocab]
  // with all_logits = false). ids outside the vocabulary are an InvalidArgument.
  Result<Tensor> Forward(SequenceState* state, std::span<const int32_t> ids,
                         const ForwardOptions& options = {});
  // One decode step of several sequences at once: ids[b] is the next token of states[b]; returns
  // F32 host logits [B, vocab]. The sequences share every per-token op (projections, norms, MoE,
  // head); KDA and MLA run per sequence on its row. On a backend whose ops are row-invariant up
  // to B rows (Backend::RowInvariantRows) each row's logits equal, bit for bit, a Forward of that
  // sequence alone. States must be distinct.
  Result<Tensor> ForwardDecode(std::span<SequenceState* const> states, std::span<const int32_t> ids,
                               const ForwardOptions& options = {});

 private:
  Model(Layout layout, ModelWeights weights, Backend& backend, Communicator& comm);

  // The sequences of a call and their rows of the activations: one sequence owning all T rows
  // (Forward), or B sequences owning one row each (ForwardDecode).
  struct Rows {
    std::span<SequenceState* const> seqs;
    int64_t T = 0;
    int64_t count(size_t /*b*/) const { return seqs.size() == 1 ? T : 1; }
    int64_t begin(size_t b) const { return seqs.size() == 1 ? 0 : static_cast<int64_t>(b); }
  };
  Result<Tensor> Run(const Rows& rows, std::span<const int32_t> ids, const ForwardOptions& o);
  Tensor Attention(size_t layer, const Tensor& x, const Rows& rows, const ForwardOptions& o);
  Tensor Kda(const LayerWeights& w, const Tensor& x, int kda_layer, const Rows& rows, const ForwardOptions& o);
  Tensor Mla(const LayerWeights& w, const Tensor& x, int mla_layer, const Rows& rows, const ForwardOptions& o);
  Tensor Mlp(const MlpWeights& w, const Tensor& y);
  Tensor Moe(const MoeWeights& w, const Tensor& y, Tensor* route_idx);
  Tensor Mix(std::vector<const Tensor*> cands, const Tensor& proj, const Tensor& norm);
  Tensor Norm(const Tensor& x, const Tensor& w, float eps);
  void AllReduce(Tensor* t);

  Layout layout_;
  ModelWeights w_;
  Backend& be_;
  Communicator& comm_;
  GluParams glu_;
  std::vector<int> kda_slot_;  // layer -> index into SequenceState::kda (or -1)
  std::vector<int> mla_slot_;  // layer -> MLA layer index in the latent cache (or -1)
  std::unique_ptr<LatentKvCache> private_kv_;
};

}  // namespace kimirt
