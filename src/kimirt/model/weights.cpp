// Loads one rank's weights: walk the tensor table, read the rank's slice of each tensor (by the
// table's placement, spec §11) from the weight source, widen it to F32 (BF16/F32 as stored; a
// BF16 GEMM weight held BF16 goes up as stored), upload it into the field its role binds to
// (weight_binding.cpp). One tensor at a time is in host memory. MXFP4 experts (spec §2.9): on CUDA their codes and
// scales are kept as stored, each sliced as `kimirt plan` places it (a slice never cuts a scale
// group: Layout::CheckParallelism); on the CPU (the F32 reference) the pair is dequantized exactly
// and sliced after widening (only the scale groups the slice touches are read). Under expert parallelism a rank reads only its own routed experts,
// whole, and the others' entries become zero stand-ins (AddExpertStandIns).
#include "kimirt/model/weights.h"

#include <array>
#include <cstring>
#include <set>
#include <string>

#include "kimirt/core/dtype_convert.h"
#include "kimirt/model/pipeline_stages.h"
#include "kimirt/model/weight_binding.h"

namespace kimirt {
namespace {

// [outer, dim, inner] view of a shape around `dim`.
void SplitAround(const Shape& s, int dim, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < dim; ++i) *outer *= s[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < s.size(); ++i) *inner *= s[i];
}

// Entries [begin, begin + length) of `dim`, zero-padded to `allocated` entries (any dtype).
Tensor SliceAlong(const Tensor& full, int dim, int64_t begin, int64_t length, int64_t allocated) {
  Shape out_shape = full.shape();
  out_shape[static_cast<size_t>(dim)] = allocated;
  Tensor out = Tensor::Host(out_shape, full.dtype());  // zero-filled
  int64_t outer = 0, inner = 0;
  SplitAround(full.shape(), dim, &outer, &inner);
  const int64_t n = full.dim(dim);
  const size_t es = DTypeSize(full.dtype());
  uint8_t* dst = static_cast<uint8_t*>(out.raw());
  const uint8_t* src = static_cast<const uint8_t*>(full.raw());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + static_cast<size_t>(o * allocated * inner) * es, src + static_cast<size_t>((o * n + begin) * inner) * es,
                static_cast<size_t>(length * inner) * es);
  }
  return out;
}

// A host F32 tensor as BF16 (its values are BF16 values: exact).
Tensor ToBf16(const Tensor& f32) {
  Tensor t = Tensor::Host(f32.shape(), DType::kBF16);
  F32ToBf16(f32.f32(), static_cast<uint16_t*>(t.raw()), static_cast<size_t>(f32.numel()));
  return t;
}

// A fresh host F32 copy of stored F32 or BF16 values, or an error naming `name`. Always a copy:
// the CPU backend keeps what it is given, and the stored values may be a checkpoint's mapping.
Result<Tensor> ToF32(const Tensor& stored, const std::string& name) {
  Tensor t = Tensor::Host(stored.shape());
  const size_t n = static_cast<size_t>(t.numel());
  switch (stored.dtype()) {
    case DType::kF32:
      std::memcpy(t.f32(), stored.raw(), n * sizeof(float));
      return t;
    case DType::kBF16:
      Bf16ToF32(static_cast<const uint16_t*>(stored.raw()), t.f32(), n);
      return t;
    default:
      return Unsupported(name + ": stored as " + std::string(DTypeName(stored.dtype())) +
                         ", which the CPU loader does not widen");
  }
}

// One rank's part of a tensor along `dim`, in stored indices: [begin, begin + length) read,
// zero-padded to `allocated` (dim -1: the whole tensor).
struct Cut {
  int dim = -1;
  int64_t begin = 0, length = 0, allocated = 0;
};

class Loader {
 public:
  Loader(const Layout& layout, const WeightSource& source, int tp, int rank, Backend& backend, const LoadOptions& o,
         bool mxfp4_as_stored)
      : layout_(layout), source_(source), rank_(rank), backend_(backend), options_(o) {
    par_.tp = tp;
    par_.ep = o.ep;
    par_.shard_latent_moe = o.shard_latent_moe;
    par_.experts_dequantized = !mxfp4_as_stored;
  }

  Status Check() const { return layout_.CheckParallelism(par_); }
  const Parallelism& par() const { return par_; }
  // Whether this rank holds any of `spec` (false: another EP rank's expert, or the vision tower).
  bool Holds(const TensorSpec& spec) const { return layout_.SliceFor(spec, par_, rank_).loaded; }

  // The rank's slice of `spec` as a device tensor, held as `held`.
  Result<Tensor> Load(const TensorSpec& spec, HeldAs held) {
    const Cut c = CutOf(spec);
    KIMIRT_ASSIGN_OR_RETURN(Tensor part, Read(spec, c));
    return Hold(spec, std::move(part), held, source_.StoredDType(spec) == DType::kBF16);
  }

  // The rank's slice of one MXFP4 matrix, widened from its codes and scales (spec §2.9); every
  // MXFP4 value (E2M1 × 2^k) is a BF16 value, so it may be held as BF16. Only the scale groups
  // the slice touches are read: along the input dim (w2) a slice may cut a group (the CPU
  // widens, so TP need not keep groups whole), and is cut from its groups once widened.
  Result<Tensor> LoadMxfp4(const TensorSpec& codes, const TensorSpec& scales, HeldAs held) {
    const Placement& p = codes.placement;
    const int64_t rows = codes.shape[0], cols = codes.shape[1] * 2;
    // Logical intermediate elements [begin, begin + length) along p.dim (experts under TP).
    const bool sliced = par_.ep == 1 && par_.tp > 1;
    const int64_t length = sliced ? p.units / par_.tp : (p.dim == 0 ? rows : cols);
    const int64_t begin = sliced ? rank_ * length : 0;
    Tensor packed, scale;
    int64_t out_rows = rows, group0 = 0, groups = cols / kMxfp4GroupSize;
    if (p.dim == 0) {
      out_rows = length;
      KIMIRT_ASSIGN_OR_RETURN(packed, source_.Read(codes, 0, begin, length));
      KIMIRT_ASSIGN_OR_RETURN(scale, source_.Read(scales, 0, begin, length));
    } else {
      group0 = begin / kMxfp4GroupSize;
      groups = (begin + length + kMxfp4GroupSize - 1) / kMxfp4GroupSize - group0;
      KIMIRT_ASSIGN_OR_RETURN(packed, source_.Read(codes, 1, group0 * kMxfp4GroupSize / 2, groups * kMxfp4GroupSize / 2));
      KIMIRT_ASSIGN_OR_RETURN(scale, source_.Read(scales, 1, group0, groups));
    }
    const int64_t width = groups * kMxfp4GroupSize;
    Tensor t = Tensor::Host({out_rows, width});
    const uint8_t* pc = static_cast<const uint8_t*>(packed.raw());
    const uint8_t* ps = static_cast<const uint8_t*>(scale.raw());
    for (int64_t r = 0; r < out_rows; ++r) {
      DequantizeMxfp4Row(pc + r * width / 2, ps + r * groups, width, t.f32() + r * width);
    }
    if (p.dim == 1 && (group0 * kMxfp4GroupSize != begin || width != length)) {
      t = SliceAlong(t, 1, begin - group0 * kMxfp4GroupSize, length, length);
    }
    return Hold(codes, std::move(t), held, /*exact_bf16=*/true);
  }

  // The rank's slice of MXFP4 codes or scales, bytes as stored (U8), placed as SliceFor places
  // them with the experts packed: a slice is whole scale groups, padding is code 0 / scale 0
  // (value 0). At TP 1 a checkpoint's bytes are uploaded straight from the mapped file.
  Result<Tensor> LoadStored(const TensorSpec& spec) {
    if (spec.dtype != DType::kU8 || source_.StoredDType(spec) != DType::kU8) {
      return Corrupt(spec.name + ": stored as " + std::string(DTypeName(source_.StoredDType(spec))) +
                     ", expected U8 MXFP4 codes or scales");
    }
    const TensorSlice s = layout_.SliceFor(spec, par_, rank_);
    KIMIRT_ASSIGN_OR_RETURN(Tensor part, Read(spec, Cut{s.dim, s.begin, s.length, s.allocated}));
    return backend_.Upload(part);
  }

  int64_t vocab_begin() const { return vocab_begin_; }

 private:
  // Where the rank's part of `spec` lies, in stored indices.
  Cut CutOf(const TensorSpec& spec) {
    const Placement& p = spec.placement;
    if ((p.kind == PlacementKind::kExpertShard && par_.ep == 1) || p.kind == PlacementKind::kHeadVector) {
      // Experts under TP: logical intermediate elements per rank (EP: whole, SliceFor below;
      // BF16 experts store one element per index). Head vectors: also at TP 1, to strip the
      // stored padding (K3 stores 128 per-head log-rates for 96 heads, spec §2.4).
      const int64_t per = p.units / par_.tp;
      return Cut{p.dim, rank_ * per, per, per};
    }
    const TensorSlice s = layout_.SliceFor(spec, par_, rank_);
    if (p.kind == PlacementKind::kVocab) vocab_begin_ = s.dim >= 0 ? s.begin : 0;
    return Cut{s.dim, s.begin, s.length, s.allocated};
  }

  // The stored values of cut `c` of `spec`, zero-padded to c.allocated.
  Result<Tensor> Read(const TensorSpec& spec, const Cut& c) {
    if (c.dim >= 0 && c.length == 0) {  // a rank past the last MXFP4 scale group: padding alone
      Shape shape = spec.shape;
      shape[static_cast<size_t>(c.dim)] = c.allocated;
      return Tensor::Host(shape, source_.StoredDType(spec));  // zero-filled
    }
    KIMIRT_ASSIGN_OR_RETURN(Tensor part, source_.Read(spec, c.dim, c.begin, c.length));
    if (c.dim >= 0 && c.allocated > c.length) part = SliceAlong(part, c.dim, 0, c.length, c.allocated);
    return part;
  }

  // Shapes `part` (the rank's stored values, padded) as `held` and uploads it. A GEMM weight
  // stored BF16 and held BF16 goes up as stored; everything else is widened to F32 first.
  Result<Tensor> Hold(const TensorSpec& spec, Tensor part, HeldAs held, bool exact_bf16) {
    switch (held) {
      case HeldAs::kF32Vector: part = part.Reshape({part.numel()}); break;
      case HeldAs::kF32Taps: part = part.Reshape({part.dim(0), part.dim(2)}); break;
      case HeldAs::kMatrix:
        if (options_.matrix_dtype == DType::kBF16 && exact_bf16) {
          if (part.dtype() == DType::kBF16) return backend_.Upload(part);
          KIMIRT_ASSIGN_OR_RETURN(Tensor f32, ToF32(part, spec.name));
          return backend_.Upload(ToBf16(f32));
        }
        break;
      case HeldAs::kRouter:
        if (backend_.RouterAsStored() && part.dtype() == DType::kBF16) return backend_.Upload(part);  // as stored
        break;
      case HeldAs::kF32:
      case HeldAs::kMxfp4: break;  // MXFP4 widened on the CPU: F32
    }
    KIMIRT_ASSIGN_OR_RETURN(Tensor f32, ToF32(part, spec.name));
    return backend_.Upload(f32);
  }

  const Layout& layout_;
  const WeightSource& source_;
  int rank_;
  Backend& backend_;
  LoadOptions options_;
  Parallelism par_;
  int64_t vocab_begin_ = 0;
};

// Every expert held one way: all widened, or all MXFP4 with a scale tensor per code tensor.
Status CheckExperts(const ExpertWeights& ex, int layer) {
  const bool mxfp4 = ex.mxfp4();
  const std::vector<Tensor>* codes[] = {&ex.gate, &ex.up, &ex.down};
  const std::vector<Tensor>* scales[] = {&ex.gate_scales, &ex.up_scales, &ex.down_scales};
  for (int m = 0; m < 3; ++m) {
    for (size_t e = 0; e < codes[m]->size(); ++e) {
      const bool packed = (*codes[m])[e].dtype() == DType::kU8;
      const bool has_scales = e < scales[m]->size() && (*scales[m])[e].defined() && (*scales[m])[e].numel() > 0;
      if (packed != mxfp4 || packed != has_scales) {
        return Internal("layer " + std::to_string(layer) + " expert " + std::to_string(e) + " (" +
                        std::string(m == 0 ? "gate" : m == 1 ? "up" : "down") +
                        "): MXFP4 codes and scales not loaded together");
      }
    }
  }
  return Status::Ok();
}

// Expert parallelism (docs/distributed.md "Expert parallelism"; spec §7.2 steps 3-4, §11): the
// entries of the routed experts other ranks hold point at zeros shaped like this rank's own, so
// Backend::MoeExperts runs as it is on every backend (no kernel knows about EP). The router is
// replicated, so every rank sees the same (token, slot) choices; a slot routed to another rank's
// expert computes GLU(0, 0) = 0 through a zero down-projection: an output of exactly ±0, which the
// combine weights and adds in its slot order as a no-op (x + ±0 = x, and the sum starts at +0).
// Each rank's routed output is therefore exactly the slot-ordered sum of its own experts'
// weighted outputs — the bits a kernel skipping the other experts would give — and the
// all-reduce after the MoE sums the ranks in rank order, deterministic and row-independent
// (rows stay independent: the stand-ins change no grouping a row could see). We chose this over
// masking the routing on the device (remapped ids, zero weights), which needs a new device op;
// the price is compute on zeros for other ranks' slots, which a kernel that skips null experts
// can drop later without changing a bit.
//
// Each layer's stand-in gate is its own view of the buffer (whole 16-byte steps apart): a
// backend may cache per-weight-set data under the first gate's address (the CUDA backend's
// expert pointer tables), and expert 0 is a stand-in on every rank but 0.
Status AddExpertStandIns(const Layout& layout, const Parallelism& par, int rank, Backend& backend, ModelWeights* w) {
  if (par.ep <= 1) return Status::Ok();
  const Layout::ExpertRange own = layout.ExpertsOf(par, rank);
  const int64_t moe_layers = layout.config().NumMoeLayers();
  std::array<Tensor, 6> buffer;  // per ExpertWeights list (gate, up, down, their scales)
  std::array<Tensor, 6> first;   // the own expert each buffer was shaped on
  int64_t gate_step = 0;         // rows between two layers' stand-in gates
  int64_t moe = 0;
  for (size_t i = 0; i < w->layers.size(); ++i) {
    LayerWeights& l = w->layers[i];
    if (!l.is_moe) continue;
    ExpertWeights& ex = l.moe.experts;
    const std::array<std::vector<Tensor>*, 6> lists = {&ex.gate,        &ex.up,        &ex.down,
                                                       &ex.gate_scales, &ex.up_scales, &ex.down_scales};
    for (size_t k = 0; k < lists.size(); ++k) {
      std::vector<Tensor>& v = *lists[k];
      const Tensor& mine = v[static_cast<size_t>(own.first)];
      if (!mine.defined() || mine.numel() == 0) continue;  // not held on this backend (CPU: scales)
      if (!buffer[k].defined()) {
        first[k] = mine;
        Shape shape = mine.shape();
        if (k == 0) {
          KIMIRT_CHECK(mine.rank() == 2);
          const int64_t row_bytes = mine.dim(1) * static_cast<int64_t>(DTypeSize(mine.dtype()));
          gate_step = 1;
          while (gate_step * row_bytes % 16 != 0) ++gate_step;
          shape[0] += (moe_layers - 1) * gate_step;
        }
        buffer[k] = backend.Zeros(shape, mine.dtype());
        w->expert_stand_ins.push_back(buffer[k]);
      } else if (mine.shape() != first[k].shape() || mine.dtype() != first[k].dtype()) {
        return Internal("layer " + std::to_string(i) + " expert " + std::to_string(own.first) + " is " +
                        mine.ToString() + ", but an earlier MoE layer's is " + first[k].ToString() +
                        ": expert parallelism's stand-ins need every MoE layer's experts alike");
      }
      const Tensor stand_in = k == 0 ? buffer[0].Rows(moe * gate_step, mine.dim(0)) : buffer[k];
      for (int64_t e = 0; e < static_cast<int64_t>(v.size()); ++e) {
        if (!own.contains(e)) v[static_cast<size_t>(e)] = stand_in;
      }
    }
    ++moe;
  }
  return Status::Ok();
}

}  // namespace

uint64_t HeldBytes(const ModelWeights& w) {
  std::set<const void*> seen;
  uint64_t total = 0;
  // Expert stand-ins are views of a few buffers: each buffer counts once, its views not at all.
  for (const Tensor& b : w.expert_stand_ins) {
    if (seen.insert(b.raw()).second) total += b.nbytes();
  }
  auto stand_in = [&](const Tensor& t) {
    const uint8_t* p = static_cast<const uint8_t*>(t.raw());
    for (const Tensor& b : w.expert_stand_ins) {
      const uint8_t* base = static_cast<const uint8_t*>(b.raw());
      if (p >= base && p < base + b.nbytes()) return true;
    }
    return false;
  };
  auto add = [&](const Tensor& t) {
    if (t.defined() && t.nbytes() > 0 && !stand_in(t) && seen.insert(t.raw()).second) total += t.nbytes();
  };
  auto add_mlp = [&](const MlpWeights& m) {
    for (const Tensor* t : {&m.gate, &m.up, &m.down}) add(*t);
  };
  for (const Tensor* t : {&w.embed, &w.lm_head, &w.norm, &w.out_res_norm, &w.out_res_proj}) add(*t);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.input_norm, &l.post_norm, &l.attn_res_norm, &l.attn_res_proj, &l.mlp_res_norm,
                            &l.mlp_res_proj}) {
      add(*t);
    }
    const KdaWeights& k = l.kda;
    for (const Tensor* t : {&k.q, &k.k, &k.v, &k.g, &k.g_a, &k.g_b, &k.b, &k.f_a, &k.f_b, &k.conv_q, &k.conv_k,
                            &k.conv_v, &k.a_log, &k.dt_bias, &k.o_norm, &k.o}) {
      add(*t);
    }
    const MlaWeights& a = l.mla;
    for (const Tensor* t : {&a.q_a, &a.q_a_norm, &a.q_b, &a.q, &a.kv_a, &a.kv_a_norm, &a.kv_b, &a.g, &a.o}) add(*t);
    add_mlp(l.dense);
    const MoeWeights& m = l.moe;
    for (const Tensor* t : {&m.router, &m.bias, &m.latent_down, &m.latent_up, &m.latent_norm}) add(*t);
    add_mlp(m.shared);
    const ExpertWeights& ex = m.experts;
    for (const auto* v : {&ex.gate, &ex.up, &ex.down, &ex.gate_scales, &ex.up_scales, &ex.down_scales}) {
      for (const Tensor& t : *v) add(t);
    }
  }
  return total;
}

namespace {

// The GEMM weights offered to the backend to re-lay out (docs/cuda.md "Weights tiled for the
// decode GEMM"): through Backend::HoldForLinearOnly those no op but Linear reads — the
// projections of KDA and MLA but MLA's kv_b (the absorbed decode and the prefill expansion read
// it), the dense MLPs, LatentMoE's latent projections and an untied head; through
// HoldExpertWeights each MoE layer's experts with its shared expert (which the CUDA MoE may run
// as one more expert), unless expert stand-ins alias them. Never the embedding, router or norms.
void HoldGemmWeights(Backend& backend, bool tied_head, ModelWeights* w) {
  auto hold = [&](Tensor* t) {
    if (t->defined() && t->numel() > 0) backend.HoldForLinearOnly(t);
  };
  if (!tied_head) hold(&w->lm_head);
  for (LayerWeights& l : w->layers) {
    KdaWeights& k = l.kda;
    for (Tensor* t : {&k.q, &k.k, &k.v, &k.g, &k.g_a, &k.g_b, &k.b, &k.f_a, &k.f_b, &k.o}) hold(t);
    MlaWeights& a = l.mla;
    for (Tensor* t : {&a.q_a, &a.q_b, &a.q, &a.kv_a, &a.g, &a.o}) hold(t);
    for (Tensor* t : {&l.dense.gate, &l.dense.up, &l.dense.down, &l.moe.latent_down, &l.moe.latent_up}) hold(t);
    if (w->expert_stand_ins.empty()) {
      MlpWeights& sh = l.moe.shared;
      backend.HoldExpertWeights(&l.moe.experts, &sh.gate, &sh.up, &sh.down);
    }
  }
}

}  // namespace

Result<ModelWeights> LoadModelWeights(const Layout& layout, const WeightSource& source, int tp, int rank,
                                      Backend& backend, const LoadOptions& options) {
  KIMIRT_RETURN_IF_ERROR(source.Check(layout));
  if (options.matrix_dtype != DType::kF32 &&
      (options.matrix_dtype != DType::kBF16 || backend.device() == Device::kCpu)) {
    return Unsupported(std::string(backend.name()) + " backend: weights held as " +
                       std::string(DTypeName(options.matrix_dtype)) + " are not supported (the CPU computes with F32 "
                       "weights; CUDA takes F32 or BF16)");
  }
  // The CPU is the F32 reference: it widens MXFP4 experts at load. CUDA holds them as stored.
  const bool mxfp4_as_stored = backend.device() != Device::kCpu;
  const WeightAllocationScope weights_scope(backend);
  Loader ld(layout, source, tp, rank, backend, options, mxfp4_as_stored);
  KIMIRT_RETURN_IF_ERROR(ld.Check());
  const ModelConfig& c = layout.config();
  KIMIRT_RETURN_IF_ERROR(CheckPipelineDegree(c.num_hidden_layers, options.pp));
  if (options.stage < 0 || options.stage >= options.pp) {
    return InvalidArgument("pipeline stage " + std::to_string(options.stage) + " of " + std::to_string(options.pp));
  }
  const std::vector<PipelineStage> stages = PipelineStages(c.num_hidden_layers, options.pp);
  const PipelineStage& stage = stages[static_cast<size_t>(options.stage)];
  ModelWeights w = EmptyModelWeights(c);
  const TensorSpec* codes = nullptr;  // MXFP4 codes whose scales come next in the table
  for (const TensorSpec& t : layout.tensors()) {
    const WeightBinding b = BindWeight(w, t);
    if (b.field == nullptr) continue;  // the vision tower: not part of the text model
    if (!ld.Holds(t)) continue;        // another rank's routed expert (expert parallelism)
    if (!StageLoads(stage, t, stages, c.tie_word_embeddings)) continue;  // another pipeline stage's
    if (b.held == HeldAs::kMxfp4 && mxfp4_as_stored) {
      KIMIRT_ASSIGN_OR_RETURN(*b.field, ld.LoadStored(t));
    } else if (IsMxfp4Codes(t.role)) {
      codes = &t;
    } else if (IsMxfp4Scales(t.role)) {
      if (codes == nullptr || codes->role != Mxfp4CodesOf(t.role) || codes->layer != t.layer ||
          codes->expert != t.expert) {
        return Internal("tensor table lists " + t.name + " without its MXFP4 codes just before it");
      }
      KIMIRT_ASSIGN_OR_RETURN(*BindWeight(w, *codes).field, ld.LoadMxfp4(*codes, t, HeldAs::kMatrix));
      codes = nullptr;
    } else {
      KIMIRT_ASSIGN_OR_RETURN(*b.field, ld.Load(t, b.held));
      if (t.role == TensorRole::kEmbed) w.embed_row_begin = ld.vocab_begin();
    }
  }
  KIMIRT_RETURN_IF_ERROR(AddExpertStandIns(layout, ld.par(), rank, backend, &w));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    KIMIRT_RETURN_IF_ERROR(CheckExperts(w.layers[i].moe.experts, static_cast<int>(i)));
    w.layers[i].moe.experts.light_load = LightRoutedLoad(c.num_experts_per_token, c.num_experts);
  }
  if (layout.config().tie_word_embeddings) w.lm_head = w.embed;
  HoldGemmWeights(backend, layout.config().tie_word_embeddings, &w);
  return w;
}

}  // namespace kimirt
