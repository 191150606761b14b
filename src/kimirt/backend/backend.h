// Backend: the op interface the model is written against once (DESIGN.md principle 2). Ops are
// coarse — a whole KDA core, an MLA attention over the latent cache, the routed experts of a
// MoE layer — so each backend can fuse freely behind them and dispatch cost does not matter.
//
// Shapes use T = tokens of the call. All tensors are contiguous row-major on the backend's
// device; outputs are preallocated by the caller with Empty() and fully overwritten (the CUDA
// tests poison them first to check that).
// The CPU backend (cpu/cpu_backend.h) computes in FP32 and is the reference the tests pin.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/backend/tensor.h"
#include "kimirt/core/check.h"

namespace kimirt {

enum class GluKind : uint8_t {
  kSilu,  // silu(gate) * up (Kimi-Linear)
  kSitu,  // beta1*tanh(gate/beta1)*sigmoid(gate) * [beta2*tanh(up/beta2) | up] (K3, spec §3.3)
};

struct GluParams {
  GluKind kind = GluKind::kSilu;
  float beta = 1.0f;                 // SiTU gate-branch beta (activation_situ_beta)
  std::optional<float> linear_beta;  // SiTU up-branch soft cap; none: identity (spec §3.3)
};

enum class KdaForm : uint8_t { kRecurrent, kChunked };
enum class MlaForm : uint8_t { kExpanded, kAbsorbed };

struct RouteParams {
  int64_t top_k = 0;
  bool renormalize = true;
  float scaling = 1.0f;
  // Spec §15.6: Kimi-Linear-48B gathers the combine weights from the biased scores.
  bool combine_biased = false;
  // ≥ 0: every token's choices get this expert id appended after its k, with weight 1 (idx and
  // weights [T, k + 1]): the shared expert as one more expert (Backend::MoeSharedAsExpert).
  int32_t append_expert = -1;
};

// A dense MLP's weights as a backend sees them (spec §7.1): gate, up [I, D], down [D, I].
struct MlpTensors {
  const Tensor& gate;
  const Tensor& up;
  const Tensor& down;
};

// One MoE layer's routed experts as this rank holds them (TP: every expert, a slice of its
// intermediate width): [I_local, D_e] gate/up and [D_e, I_local] down per expert, either widened
// (F32; BF16 on CUDA) or, on CUDA, MXFP4 as the checkpoint stores them (spec §2.9): U8 codes
// [rows, cols/2] (two E2M1 per byte, the low nibble first) and U8 E8M0 scales [rows, cols/32].
// The CPU takes F32 only.
struct ExpertWeights {
  std::vector<Tensor> gate;  // w1
  std::vector<Tensor> up;    // w3
  std::vector<Tensor> down;  // w2
  std::vector<Tensor> gate_scales, up_scales, down_scales;  // MXFP4 only
  // The model's routed load is light (LightRoutedLoad: K3's 16 of 896), set at load from the
  // config: the CUDA decode then puts 2 tokens in a tile where it put 8 (part columns,
  // docs/cuda.md), another fixed order of the same sums. Never set by the batch, so a token's bits
  // stay the same at every batch size; the CPU ignores it.
  bool light_load = false;
  bool mxfp4() const { return !gate.empty() && gate.front().dtype() == DType::kU8; }
};

// Whether k of E routed experts a token make a light load: a decode step's mean group at the
// decode range's top (64 tokens) is at most 1.5 tokens (K3: 16 of 896, 1.14; Kimi-Linear-48B: 8
// of 256, 2). Measured on an H100 (docs/cuda.md "Part columns"): part columns gained 1.13x at
// K3's batch 32 and lost 0.90x / 0.72x on Kimi-Linear's routed experts at 32 / 64, whose groups
// of 3+ tokens take more passes over their weights.
inline bool LightRoutedLoad(int64_t k, int64_t E) { return E > 0 && 128 * k <= 3 * E; }

// One KDA layer's per-sequence state for `slots` sequences, indexed by slot (spec §5.7, §9): the
// short-conv windows of q, k, v and the recurrent state. A new pool is all zeros (Zeros()).
struct KdaStatePool {
  Tensor conv_q, conv_k, conv_v;  // [slots, W-1, P_l] the last W-1 pre-conv projections
  Tensor recurrent;               // [slots, H, K, K] FP32 state S (spec §5.4)
};

// What KdaDecode needs of a KDA layer's weights besides its projections (spec §5.2-5.3, §5.6).
struct KdaDecodeWeights {
  const Tensor* conv_q = nullptr;   // [P_l, W] short-conv taps
  const Tensor* conv_k = nullptr;
  const Tensor* conv_v = nullptr;
  const Tensor* a_log = nullptr;    // [H]
  const Tensor* dt_bias = nullptr;  // [H*K]
  std::optional<float> lower_bound; // K3's bounded-sigmoid gate; none: softplus (Kimi-Linear)
  const Tensor* o_norm = nullptr;   // [K] gated RMSNorm gain
  float norm_eps = 1e-5f;
};

struct MlaShape {
  int64_t heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0, latent_dim = 0;
};

// The bytes of the paged MLA latent cache (model/latent_kv_cache.h owns the block accounting):
// `blocks` blocks of `block_size` token rows for each of `layers` layers, a row being the normed
// latent c [latent_dim] ‖ the shared key k_s [rope_dim], stored as `dtype`: F32 (exact), BF16
// (round to nearest even), or F8E4M3 with one F32 scale per token, layer and part (c, k_s):
// scale = amax / 448 (1 when amax is 0), code = RNE-saturating E4M3 of value / scale. Every
// backend stores the same codes, so a cache written on one reads back identically on another.
struct KvStorageShape {
  int layers = 0;
  int block_size = 0;
  int64_t latent_dim = 0, rope_dim = 0;
  DType dtype = DType::kF32;
  // Bytes a storage may keep of prefilling sequences' expanded history between their chunks
  // (expanded_history.h; CUDA only). -1: the backend's default; 0: none (every chunk expands its
  // whole history, as before).
  int64_t prefill_history_bytes = -1;
};

// One decode step over the paged latent cache, as the MLA decode ops read it: sequence b owns
// row b of the step's activations, has one new token at position context[b] - 1 (so it attends
// over context[b] positions), and its block table is tables[table_begin[b], table_begin[b+1]).
// The model builds it on the host once per step; KvStorage::SetDecodeStep hands it to the
// storage once (the CUDA storage uploads it in one copy), and every MLA layer then reads it.
struct PagedDecodeStep {
  std::vector<int64_t> context;
  std::vector<int32_t> table_begin{0};  // B + 1 offsets into tables
  std::vector<int32_t> tables;
  void Add(std::span<const int32_t> table, int64_t context_len) {
    context.push_back(context_len);
    tables.insert(tables.end(), table.begin(), table.end());
    table_begin.push_back(static_cast<int32_t>(tables.size()));
  }
  int64_t size() const { return static_cast<int64_t>(context.size()); }
  std::span<const int32_t> table(int64_t b) const {
    return std::span<const int32_t>(tables).subspan(static_cast<size_t>(table_begin[static_cast<size_t>(b)]),
                                                    static_cast<size_t>(table_begin[static_cast<size_t>(b) + 1] -
                                                                        table_begin[static_cast<size_t>(b)]));
  }
};

// One prefill call over the paged latent cache (issue 14): sequence b has count[b] new tokens at
// positions start[b] .. start[b] + count[b] - 1, already written to its blocks; their queries
// and outputs are rows [row[b], row[b] + count[b]) of the call's q and o; its block table
// tables[table_begin[b], table_begin[b+1]) covers start[b] + count[b] positions.
struct PagedPrefill {
  std::vector<int64_t> start, count, row;
  std::vector<int32_t> table_begin{0};  // B + 1 offsets into tables
  std::vector<int32_t> tables;
  void Add(std::span<const int32_t> table, int64_t start_pos, int64_t tokens, int64_t first_row) {
    start.push_back(start_pos);
    count.push_back(tokens);
    row.push_back(first_row);
    tables.insert(tables.end(), table.begin(), table.end());
    table_begin.push_back(static_cast<int32_t>(tables.size()));
  }
  int64_t size() const { return static_cast<int64_t>(start.size()); }
  std::span<const int32_t> table(int64_t b) const {
    return std::span<const int32_t>(tables).subspan(static_cast<size_t>(table_begin[static_cast<size_t>(b)]),
                                                    static_cast<size_t>(table_begin[static_cast<size_t>(b) + 1] -
                                                                        table_begin[static_cast<size_t>(b)]));
  }
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  // Room for `blocks` blocks (never less than before), keeping the rows already written.
  virtual void Resize(int64_t blocks) = 0;
  // Rows [pos, pos + T) of `layer`, through the block table, := c [T, r] ‖ ks [T, dr] (tensors of
  // the backend's device).
  virtual void Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c, const Tensor& ks) = 0;
  // c [≥len, r], ks [≥len, dr] rows [0, len) := rows [0, len) of `layer`, widened to F32.
  virtual void Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) = 0;

  // The batched, paged decode ops (issue 12): the step's sequences in one call each, reading
  // and writing the stored codes where they lie through the block tables (no gather, no F32
  // copy of the history). `step` stays in force until the next SetDecodeStep; its block tables
  // must cover every context.
  virtual void SetDecodeStep(const PagedDecodeStep& step) = 0;
  // Row b of c [B, r], ks [B, dr] := position context[b] - 1 of sequence b, `layer`.
  virtual void WriteDecode(int layer, const Tensor& c, const Tensor& ks) = 0;
  // Absorbed MLA decode (spec §6.6) of the step's B sequences over `layer`: q [B, H*(dn+dr)],
  // w_kvb [H*(dn+dv), r] (F32, or BF16-held where the backend allows it), o [B, H*dv]. Row b
  // depends on sequence b alone (batch invariance): the CPU computes each sequence exactly as
  // MlaAttention's absorbed form over its gathered rows (same bits); CUDA splits a long context
  // across thread blocks and combines the pieces in an order fixed by that context length alone.
  virtual void AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o) = 0;
  // What the decode ops bake into a captured graph (Backend::CaptureBegin): the addresses and
  // layout of the step's buffers as the last SetDecodeStep left them. Empty: no graphs.
  virtual std::string GraphKey() const { return {}; }

  // Expanded MLA prefill (spec §6.2, §6.4) of the sequences of `batch` over `layer`, reading
  // their latent rows through the block tables: q [rows, H*(dn+dr)], w_kvb [H*(dn+dv), r],
  // o [rows, H*dv]; rows no sequence names are left as they are. The CPU computes each sequence
  // exactly as Gather + MlaAttention's expanded form (the same bits); CUDA, at the models' head
  // widths (dn = dv = 128, dr = 64 or 0), runs the expansion GEMM per sequence and a flash-
  // attention kernel on tensor cores with BF16 operands and F32 accumulation (the model calls
  // this only in Backend::bf16_prefill mode), other widths as the CPU does. Either way a row's
  // bits depend on its own sequence alone, never on the others of the call. CUDA keeps a
  // one-sequence call's expanded rows for the sequence's next chunk (expanded_history.h; the
  // bits of expanding them again).
  virtual void AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb,
                             const MlaShape& shape, Tensor* o) = 0;
  // Blocks whose last reference was dropped (LatentKvCache::FreeBlocks): their rows may be
  // rewritten, so whatever the storage derived from them (expanded prefill history) is stale.
  virtual void Released(std::span<const int32_t> /*blocks*/) {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // Memory. Empty() returns a tensor whose contents are unspecified (every op overwrites all of
  // its output); Zeros() one filled with zeros (recurrent state, conv windows). Upload/Download
  // move host tensors to/from the device (the CPU backend returns its argument).
  virtual Tensor Empty(Shape shape, DType dtype = DType::kF32) = 0;
  virtual Tensor Zeros(Shape shape, DType dtype = DType::kF32) = 0;
  virtual Tensor Upload(const Tensor& host) = 0;
  virtual Tensor Download(const Tensor& t) = 0;
  // Greedy decoding's pick for each row of F32 logits [R, V], taken where they lie so that only
  // R ids cross to the host (a decode batch's rows are 42 MB at R = 64 and a 163,840 vocabulary):
  // row r's ArgmaxOf (core/argmax.h: lowest index of the largest value, NaN as -inf; -1 when
  // there is none) — the token the sampler would pick from the downloaded row.
  virtual std::vector<int32_t> ArgmaxRows(const Tensor& logits) = 0;
  // y [T, count] := x [T, :][begin, begin + count)
  virtual void CopyColumns(const Tensor& x, int64_t begin, int64_t count, Tensor* y) = 0;
  // y [T, :][begin, begin + C) := x [T, C]: the other way (a TP all-gather's rank blocks into
  // their columns).
  virtual void CopyColumnsTo(const Tensor& x, int64_t begin, Tensor* y) = 0;
  // Up to how many rows every per-token op computes each row exactly as it would alone (same
  // bits whatever the other rows are): the engine batches decode steps of up to this many
  // sequences into one forward without giving up batch invariance. 1: never batch.
  virtual int64_t RowInvariantRows() const { return 1; }
  // Prefill math (issue 14, docs/numerics.md). Off (the default): F32 throughout, the mode the
  // F32 goldens pin. On: a backend may run prefill (calls of more than RowInvariantRows() rows)
  // on tensor cores with BF16 inputs and F32 accumulation — GEMMs, the chunked KDA core, MLA
  // prefill attention. Model::Load turns it on when the weights are held as BF16 (`--dtype
  // bfloat16`). Either way a row's bits never depend on the other rows of the call.
  void set_bf16_prefill(bool on) { bf16_prefill_ = on; }
  bool bf16_prefill() const { return bf16_prefill_; }

  // Graphs of the decode step (issue 12; docs/cuda.md "Decode graphs"). A backend that has them
  // records the launches between CaptureBegin and CaptureEnd into a graph under `key`, which
  // names everything the launches bake in (row count, buffer addresses, layouts), and Replay
  // runs them again. What changes from step to step must come through buffers of fixed address:
  // SetDecodeInputs (token ids, KDA slots) and KvStorage::SetDecodeStep. Tensors allocated while
  // capturing live in the graph's own memory; `output` becomes the graph's, and Replay returns
  // it (valid until the next replay of that graph). No uploads, downloads or host waits may
  // happen while capturing. CaptureEnd returns false when the capture failed (nothing ran; run
  // the step eagerly).
  virtual bool SupportsGraphs() const { return false; }
  virtual bool HasGraph(const std::string& /*key*/) const { return false; }
  virtual void CaptureBegin(const std::string& /*key*/) {}
  virtual bool CaptureEnd(const Tensor& /*output*/) { return false; }
  // A capture whose launches threw (a collective aborted by a dead peer): ended and thrown away,
  // its errors with it, so the backend runs eagerly again and no later call inherits an error
  // from it. Nothing when not capturing.
  virtual void CaptureAbandon() {}
  virtual Tensor Replay(const std::string& /*key*/) { return {}; }
  // Forgets the graph under `key`, if any (tensor-parallel ranks whose peers' capture failed).
  virtual void DropGraph(const std::string& /*key*/) {}
  // The decode step's token ids and KDA slots, put once into buffers of fixed address that
  // Embedding and KdaDecode read when called with the same values (CUDA; a no-op elsewhere).
  virtual void SetDecodeInputs(std::span<const int32_t> /*ids*/, std::span<const int32_t> /*slots*/) {}
  // The device's free and total bytes (cudaMemGetInfo), or nothing for host memory.
  struct MemoryInfo {
    uint64_t free = 0, total = 0;
  };
  virtual std::optional<MemoryInfo> DeviceMemory() { return std::nullopt; }
  // Between BeginWeights and EndWeights the tensors this backend makes are a model's weights:
  // held as long as the model, never one step's scratch, so a device backend may place them
  // densely instead of in its caching pool's size classes (CUDA: slabs, KIMIRT_WEIGHT_SLABS).
  // LoadModelWeights brackets its loading with them (WeightAllocationScope).
  virtual void BeginWeights() {}
  virtual void EndWeights() {}
  // Latent cache storage on this backend's device, initially for 0 blocks.
  virtual std::unique_ptr<KvStorage> MakeKvStorage(const KvStorageShape& shape) = 0;

  // y [T, N] = x [T, K] · w [N, K]ᵀ
  virtual void Linear(const Tensor& x, const Tensor& w, Tensor* y) = 0;
  // Several Linears with the same row count T (x may be one tensor for all or differ; the
  // outputs are distinct and none is an input): each y gets exactly the bits Linear would give
  // it (issue 12: the projections a KDA layer, an MLA layer or an MLP reads from one input).
  // The base version calls Linear in turn; CUDA runs a decode group as one grouped kernel
  // (docs/cuda.md "Grouped decode GEMMs").
  struct LinearProblem {
    const Tensor* x = nullptr;
    const Tensor* w = nullptr;
    Tensor* y = nullptr;
  };
  virtual void LinearGroup(std::span<const LinearProblem> problems);
  // Row-wise RMSNorm with gain (spec §3.1): y = w * x * rsqrt(mean(x²) + eps). x, y [T, n].
  // A hint that these weights are read soon (a decode step's next GEMMs, in order): a backend may
  // start bringing them toward its caches now, while the kernels before them are latency-bound and
  // leave memory idle. Changes no result; the CPU backend ignores it.
  virtual void PrefetchWeights(std::span<const Tensor* const> /*weights*/) {}
  // `w` is read by Linear (and LinearGroup) alone from now on: no other op, no Download. A backend
  // may re-lay it out for its GEMMs, with the same results to the bit. CUDA: BF16 weights tiled for
  // the decode GEMM (docs/cuda.md "Weights tiled for the decode GEMM"); the CPU keeps them.
  virtual void HoldForLinearOnly(Tensor* /*w*/) {}
  // A MoE layer's routed experts and its shared expert (null where it has none), from now on read
  // only by MoeExperts / MoeExpertsWithShared / MoeRouteExpertsWithShared and, the shared one, by
  // Linear: likewise re-laid out as the backend likes, with the same results. Never offered expert
  // stand-ins (views that alias one buffer). CUDA: BF16 experts decode-tiled, the shared expert
  // with them.
  virtual void HoldExpertWeights(ExpertWeights* /*experts*/, Tensor* /*shared_gate*/, Tensor* /*shared_up*/,
                                 Tensor* /*shared_down*/) {}
  virtual void RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor* y) = 0;
  // y = a + b (y may be a).
  virtual void Add(const Tensor& a, const Tensor& b, Tensor* y) = 0;
  // h = a + b, then y = RmsNorm(h; w, eps): a residual add and the norm that reads its sum (spec
  // §4.1), with exactly the bits of Add then RmsNorm. h and y are new tensors (neither is a
  // nor b). The base version calls the two; CUDA runs one kernel (one launch and one pass over
  // the row fewer a sub-layer in a decode step).
  virtual void AddRmsNorm(const Tensor& a, const Tensor& b, const Tensor& w, float eps, Tensor* h, Tensor* y);
  // y = x * sigmoid(g) (the MLA output gate, spec §6.4; y may be x).
  virtual void SigmoidMul(const Tensor& x, const Tensor& g, Tensor* y) = 0;
  // y [T, I] = GLU(gate [T, I], up [T, I]) (spec §3.3).
  virtual void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y) = 0;
  // y [T, D]: rows of table [V_local, D] for ids in [row_begin, row_begin + V_local), zero
  // otherwise (vocab-parallel embedding; the caller all-reduces).
  virtual void Embedding(std::span<const int32_t> ids, const Tensor& table, int64_t row_begin,
                         Tensor* y) = 0;
  // Block AttnRes mix (spec §8.2): candidates n × [T, D] (prefix last), pseudo-query proj [D],
  // key-norm gain norm_w [D]; y [T, D] = Σ softmax_i(q·rmsnorm(v_i)) v_i.
  virtual void AttnResMix(std::span<const Tensor* const> candidates, const Tensor& proj,
                          const Tensor& norm_w, float eps, Tensor* y) = 0;
  // y = RmsNorm(AttnResMix(candidates; proj, norm_w, eps); out_w, out_eps), the mix itself not
  // kept (a sub-layer's normalized input, spec §4.1). By default the two calls; a backend may
  // run them as one kernel (CUDA: with the two kernels' bits; cuda_backend.cu says when not).
  virtual void AttnResMixNorm(std::span<const Tensor* const> candidates, const Tensor& proj, const Tensor& norm_w,
                              float eps, const Tensor& out_w, float out_eps, Tensor* y);

  // KDA (spec §5). x [T, C], w [C, W], window [W-1, C] carried in place; y [T, C].
  virtual void CausalConvSilu(const Tensor& x, const Tensor& w, Tensor* window, Tensor* y) = 0;
  // alpha [T, H*K] from f [T, H*K]; a_log [H], dt_bias [H*K] (spec §5.3).
  virtual void KdaLogDecay(const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                           std::optional<float> lower_bound, Tensor* alpha) = 0;
  // q, k, v, alpha [T, H*K]; beta_logits [T, H]; state [H, K, K] in place; o [T, H*K].
  virtual void KdaCore(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta_logits,
                       const Tensor& alpha, int64_t heads, KdaForm form, Tensor* state, Tensor* o) = 0;
  // Per-head gated RMSNorm (spec §3.2): x, g, y [T, H*K]; w [K].
  virtual void GatedRmsNorm(const Tensor& x, const Tensor& g, const Tensor& w, float eps, Tensor* y) = 0;
  // KDA decode (spec §5.2-5.6) of B sequences, one token each; row b reads and updates slot
  // slots[b] of `pool` (distinct slots): short conv + SiLU of the pre-conv projections q_raw,
  // k_raw, v_raw [B, P_l] with the slot's windows, the log-decay of f [B, P_l], the recurrent
  // delta rule with beta_logits [B, H] on the slot's state, and the gated RMSNorm with the
  // output-gate logits gate [B, P_l]; o [B, P_l] is what o_proj takes. The base version
  // (backend.cpp) runs CausalConvSilu, KdaLogDecay, KdaCore and GatedRmsNorm row by row on slot
  // views, the same bits as those ops on one sequence; CUDA runs the fused kernel
  // (kda_decode_kernels.cu) where it applies. Row b depends on row b alone.
  virtual void KdaDecode(std::span<const int32_t> slots, const Tensor& q_raw, const Tensor& k_raw, const Tensor& v_raw,
                         const Tensor& f, const Tensor& beta_logits, const Tensor& gate, const KdaDecodeWeights& w,
                         KdaStatePool* pool, Tensor* o);

 protected:
  bool bf16_prefill_ = false;

  // KdaDecode's slots: each in [0, slot_count), none twice (rows update their slots in place).
  static void CheckDecodeSlots(std::span<const int32_t> slots, int64_t slot_count);

 public:

  // MLA attention (spec §6.4/§6.6) of T new tokens at positions start.. over the cache rows
  // [0, start + T) (the new tokens already appended). q [T, H*(dn+dr)]; cache_c [≥start+T, r];
  // cache_ks [≥start+T, dr]; w_kvb [H*(dn+dv), r]; o [T, H*dv].
  virtual void MlaAttention(const Tensor& q, const Tensor& cache_c, const Tensor& cache_ks,
                            const Tensor& w_kvb, const MlaShape& shape, int64_t start, MlaForm form,
                            Tensor* o) = 0;

  // Router (spec §7.2 step 1, FP32): y [T, D], w [E, D], bias [E] → idx [T, k] (I32),
  // weights [T, k] (F32), in top-k order.
  virtual void MoeRoute(const Tensor& y, const Tensor& w, const Tensor& bias, const RouteParams& p,
                        Tensor* idx, Tensor* weights) = 0;
  // Whether MoeRoute's router weight may be held as the checkpoint stores it (BF16 for K3 and
  // Kimi-Linear) rather than widened to F32 at load: the backend then widens it inside its F32
  // router math, the same logits bit for bit, from half the bytes (K3: 12.8 MB a layer on every
  // rank, ~1.2 GB a rank in all). Default: widened at load.
  virtual bool RouterAsStored() const { return false; }
  // Routed experts (spec §7.2 steps 3-4): out [T, D_e] = Σ_j weights[t,j] · expert_{idx[t,j]}(z[t]).
  virtual void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights,
                          const ExpertWeights& experts, const GluParams& p, Tensor* out) = 0;

  // Whether MoeExpertsWithShared should run, for T rows, the routed experts and the shared expert
  // `shared` (a dense MLP of the experts' widths; spec §7.2 steps 7-8) as one pass: the shared
  // one as expert E, chosen by every token with weight 1 after its k (MoeRoute with append_expert
  // = E). Its output then comes last in the combine's sum, Σ_j w_j·e_j + 1·shared: the Add of
  // steps 7-8 (×1 is exact), in one pass over the weights instead of the dense MLP's launches.
  // Under TP the output is the rank's partial sum of both, which the caller all-reduces once
  // (model/moe.cpp). Default: no.
  virtual bool MoeSharedAsExpert(const ExpertWeights& /*experts*/, const MlpTensors& /*shared*/, int64_t /*T*/) {
    return false;
  }
  // MoeExperts over the E routed experts and `shared` as expert E; idx, weights [T, k + 1].
  virtual void MoeExpertsWithShared(const Tensor& /*z*/, const Tensor& /*idx*/, const Tensor& /*weights*/,
                                    const ExpertWeights& /*experts*/, const MlpTensors& /*shared*/,
                                    const GluParams& /*p*/, Tensor* /*out*/) {
    KIMIRT_CHECK_MSG(false, "MoeExpertsWithShared on a backend that never offers it (MoeSharedAsExpert)");
  }
  // MoeRoute of y (p.append_expert = E: the shared expert after each token's k) then
  // MoeExpertsWithShared on y, as one call so that a backend can fuse the route chain (CUDA: the
  // top-k, the grouping by expert and the experts' split of y in one launch). The same bits.
  virtual void MoeRouteExpertsWithShared(const Tensor& y, const Tensor& router, const Tensor& bias,
                                         const RouteParams& p, const ExpertWeights& experts,
                                         const MlpTensors& shared, const GluParams& glu, Tensor* out) {
    const int64_t ks = p.top_k + 1;
    KIMIRT_CHECK(p.append_expert >= 0);
    Tensor idx = Empty({y.dim(0), ks}, DType::kI32);
    Tensor weights = Empty({y.dim(0), ks});
    MoeRoute(y, router, bias, p, &idx, &weights);
    MoeExpertsWithShared(y, idx, weights, experts, shared, glu, out);
  }
};

// BeginWeights / EndWeights for a scope (Backend::BeginWeights).
class WeightAllocationScope {
 public:
  explicit WeightAllocationScope(Backend& be) : be_(be) { be_.BeginWeights(); }
  ~WeightAllocationScope() { be_.EndWeights(); }
  WeightAllocationScope(const WeightAllocationScope&) = delete;
  WeightAllocationScope& operator=(const WeightAllocationScope&) = delete;

 private:
  Backend& be_;
};

}  // namespace kimirt
