// The decoder forward pass (spec §4): embedding, then per layer two sub-layers — KDA or MLA
// (kda.h, mla.h), then dense MLP or MoE (moe.h) — each reading a norm of the residual stream
// and adding its output back to it, then final norm and LM head. The residual scheme is the one
// difference between the configs: Block AttnRes where the config has it (attn_res.h, spec §8),
// the plain pre-norm residual otherwise (residual.h); the layer loop is written once against it.
#include "kimirt/model/model.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "kimirt/model/attn_res.h"
#include "kimirt/model/kda.h"
#include "kimirt/model/mla.h"
#include "kimirt/model/moe.h"
#include "kimirt/model/residual.h"

namespace kimirt {
namespace {

Tensor HostCopy(Backend& be, const Tensor& t) {
  Tensor d = be.Download(t);
  if (d.raw() != t.raw()) return d;  // already a fresh host tensor (a device's download)
  Tensor h = Tensor::Host(d.shape(), d.dtype());
  std::copy_n(static_cast<const uint8_t*>(d.raw()), d.nbytes(), static_cast<uint8_t*>(h.raw()));
  return h;
}

// Host copies of one layer's sub-layer inputs and outputs (ForwardTrace).
void RecordLayer(Backend& be, const Tensor& attn_in, const Tensor& attn_out, const Tensor& ffn_in,
                 const Tensor& ffn_out, const Tensor& route, ForwardTrace* trace) {
  trace->attn_in.push_back(HostCopy(be, attn_in));
  trace->attn_out.push_back(HostCopy(be, attn_out));
  trace->ffn_in.push_back(HostCopy(be, ffn_in));
  trace->ffn_out.push_back(HostCopy(be, ffn_out));
  trace->route_idx.push_back(route.defined() && route.numel() > 0 ? HostCopy(be, route) : Tensor());
}

}  // namespace

Model::Model(Layout layout, ModelWeights weights, Backend& backend, Communicator& comm, Communicator* pipeline,
             PipelineStage stage)
    : layout_(std::move(layout)),
      w_(std::move(weights)),
      be_(backend),
      comm_(comm),
      pipeline_(pipeline),
      stage_(stage),
      ctx_{layout_.config(), be_, comm_, FfnActivation(layout_.config())} {
  const ModelConfig& c = config();
  // KDA state and latent cache hold the stage's own layers only (issue 15 item 4).
  int kda = 0, mla = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool is_kda = c.IsKdaLayer(i), mine = stage_.holds_layer(i);
    kda_slot_.push_back(is_kda && mine ? kda++ : -1);
    mla_slot_.push_back(!is_kda && mine ? mla++ : -1);
  }
  stage_kda_layers_ = kda;
  stage_mla_layers_ = mla;
  private_kv_ = MakeKvCache(0, 16, KvCacheDType::kF32, /*growable=*/true);
  private_kda_ = MakeKdaStates(1);
}

std::unique_ptr<KdaStateSlots> Model::MakeKdaStates(int64_t slots) const {
  const int64_t layers = stage_kda_layers_;
  const ModuleContext& ctx = ctx_;
  return std::make_unique<KdaStateSlots>(
      be_,
      [&ctx, layers](int64_t n) {
        std::vector<KdaStatePool> pools;
        for (int64_t l = 0; l < layers; ++l) pools.push_back(NewKdaStatePool(ctx, n));
        return pools;
      },
      slots);
}

std::unique_ptr<LatentKvCache> Model::MakeKvCache(int64_t num_blocks, int block_size, KvCacheDType dtype,
                                                  bool growable) const {
  const ModelConfig& c = config();
  return std::make_unique<LatentKvCache>(be_, static_cast<int>(stage_mla_layers_), num_blocks, block_size,
                                         c.kv_lora_rank, c.qk_rope_head_dim, dtype, growable);
}

Result<std::unique_ptr<Model>> Model::Load(const ModelSource& source, Backend& backend, Communicator& comm,
                                           const LoadOptions& options, Communicator* pipeline) {
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(source.random() ? source.config_path : source.dir));
  KIMIRT_ASSIGN_OR_RETURN(Layout layout, Layout::Build(config));
  LoadOptions lo = options;
  lo.pp = pipeline != nullptr ? pipeline->size() : 1;
  lo.stage = pipeline != nullptr ? pipeline->rank() : 0;
  KIMIRT_RETURN_IF_ERROR(CheckPipelineDegree(config.num_hidden_layers, lo.pp));
  const PipelineStage stage = PipelineStages(config.num_hidden_layers, lo.pp)[static_cast<size_t>(lo.stage)];
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<WeightSource> weights_source;
  if (source.random()) {
    weights_source = RandomWeightSource(layout.config(), source.seed);
  } else {
    KIMIRT_ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(source.dir));
    weights_source = CheckpointWeightSource(*ckpt);
  }
  // BF16-held weights mean BF16 tensor-core prefill; F32 ones the exact F32 mode (issue 14). Set
  // before the weights load: how the backend holds them may depend on it (MXFP4 codes are tiled
  // for the decode kernel only where prefill reads BF16, CudaBackend::TileMxfp4Experts).
  backend.set_bf16_prefill(options.matrix_dtype == DType::kBF16);
  KIMIRT_ASSIGN_OR_RETURN(ModelWeights weights,
                          LoadModelWeights(layout, *weights_source, comm.size(), comm.rank(), backend, lo));
  return std::unique_ptr<Model>(
      new Model(std::move(layout), std::move(weights), backend, comm, lo.pp > 1 ? pipeline : nullptr, stage));
}

SequenceState Model::NewSequence(LatentKvCache* kv, KdaStateSlots* kda) {
  SequenceState st;
  st.kv = kv != nullptr ? kv : private_kv_.get();
  st.kda = kda != nullptr ? kda : private_kda_.get();
  st.kda_slot = st.kda->Acquire();
  return st;
}

Result<Tensor> Model::Forward(SequenceState* st, std::span<const int32_t> ids, const ForwardOptions& o) {
  SequenceState* const one[] = {st};
  SequenceRows rows;
  rows.seqs = one;
  rows.T = static_cast<int64_t>(ids.size());
  return Run(rows, ids, o);
}

namespace {

// A step names each sequence once (the scheduler's plan does): its decode row or its chunk.
Status DistinctSequences(std::span<SequenceState* const> decode, std::span<const PrefillChunk> chunks) {
  std::vector<const SequenceState*> all(decode.begin(), decode.end());
  for (const PrefillChunk& c : chunks) all.push_back(c.state);
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end()) return InvalidArgument("a step names one sequence twice");
  return Status::Ok();
}

}  // namespace

Result<Tensor> Model::ForwardDecode(std::span<SequenceState* const> states, std::span<const int32_t> ids,
                                    const ForwardOptions& o) {
  if (states.size() != ids.size()) {
    return InvalidArgument("decode batch of " + std::to_string(states.size()) + " sequences and " +
                           std::to_string(ids.size()) + " tokens");
  }
  if (states.empty()) return InvalidArgument("forward of zero tokens");
  KIMIRT_RETURN_IF_ERROR(DistinctSequences(states, {}));
  if (pipelined()) {
    KIMIRT_ASSIGN_OR_RETURN(StepLogits step, RunStepInFlight(DecodeRows{states, ids, o.argmax}, {}, o));
    return std::move(step.decode);
  }
  if (states.size() == 1) return Forward(states[0], ids, o);
  SequenceRows rows;
  rows.seqs = states;
  rows.T = static_cast<int64_t>(ids.size());
  ForwardOptions every_row = o;
  every_row.all_logits = true;  // each row is some sequence's last position
  return Run(rows, ids, every_row);
}

Result<Tensor> Model::Run(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o) {
  KIMIRT_RETURN_IF_ERROR(Prepare(rows, ids));
  const Tensor local = Launch(rows, ids, o);
  return GatherLogits(local, o.all_logits ? rows.T : 1, o.argmax);
}

Result<std::vector<Tensor>> Model::ForwardChunks(std::span<const PrefillChunk> chunks, const ForwardOptions& o) {
  if (chunks.empty()) return InvalidArgument("forward of zero chunks");
  KIMIRT_ASSIGN_OR_RETURN(StepLogits step, ForwardStep(DecodeRows{}, chunks, o));
  return std::move(step.chunks);
}

Status Model::CheckStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks) {
  if (decode.states.size() != decode.ids.size()) {
    return InvalidArgument("decode batch of " + std::to_string(decode.states.size()) + " sequences and " +
                           std::to_string(decode.ids.size()) + " tokens");
  }
  if (decode.states.empty() && chunks.empty()) return InvalidArgument("a step of no decode rows and no chunks");
  KIMIRT_RETURN_IF_ERROR(DistinctSequences(decode.states, chunks));
  return Status::Ok();
}

Result<StepLogits> Model::ForwardStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                      const ForwardOptions& o) {
  if (pipelined()) return RunStepInFlight(decode, chunks, o);  // LaunchStep checks the step
  KIMIRT_RETURN_IF_ERROR(CheckStep(decode, chunks));
  StepLogits out;
  if (!decode.states.empty()) {
    ForwardOptions d;
    d.kda_form = o.kda_form;
    d.mla_form = o.mla_form;
    d.argmax = decode.argmax;
    KIMIRT_ASSIGN_OR_RETURN(out.decode, ForwardDecode(decode.states, decode.ids, d));
  }
  for (const PrefillChunk& c : chunks) {
    ForwardOptions each;
    each.kda_form = o.kda_form;
    each.mla_form = o.mla_form;
    each.all_logits = c.all_logits;
    each.argmax = c.argmax;
    KIMIRT_ASSIGN_OR_RETURN(Tensor logits, Forward(c.state, c.ids, each));
    out.chunks.push_back(std::move(logits));
  }
  return out;
}

// A step in one flow (docs/distributed.md "A step in one flow"): the decode rows split by
// MicroBatchRows (docs/distributed.md "Micro-batches in flight"), then each prefill chunk, as the
// calls of one LaunchStep; each call is exactly the Run it would be alone, so no bit changes.
//
// Decodes first. On balanced stages the order does not change the step's time: with each call
// taking the same time on every stage, the flow takes the sum of its calls' stage-times plus
// (pp − 1) times the longest call's, in any order (a proportionate flow shop); one flow instead
// of two saves one fill and drain — (pp − 1) times the shorter flow's longest call, usually a
// decode micro-batch — and stage 0's wait for the decodes' logits between the flows. What
// the order decides is what leaves the last stage first: the decode rows, which every running
// request's next token (its TPOT) waits on, so their logits are gathered first, and a schedule
// that returns them before the chunks end or starts the next step's decodes behind them
// (docs/distributed.md "Steps in flight") finds them at the head of the flow. It is also the
// engine's order of work in a step (the decodes' samples, then the chunks' prefix-cache entries
// and samples), as the two flows had it.
Result<StepLogits> Model::RunStepInFlight(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                          const ForwardOptions& o) {
  KIMIRT_ASSIGN_OR_RETURN(const StepInFlight step, LaunchStep(decode, chunks, o));
  return CollectStep(step);
}

Result<StepInFlight> Model::LaunchStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                       const ForwardOptions& o) {
  if (!pipelined()) return Unsupported("LaunchStep runs pipeline stages only (-pp > 1)");
  KIMIRT_RETURN_IF_ERROR(CheckStep(decode, chunks));
  ForwardOptions forms;  // all_logits: each decode row is some sequence's last position
  forms.kda_form = o.kda_form;
  forms.mla_form = o.mla_form;
  std::vector<SequenceRows> calls;
  std::vector<std::span<const int32_t>> ids;
  std::vector<ForwardOptions> each;
  StepInFlight step;
  step.decode_rows = static_cast<int64_t>(decode.states.size());
  if (step.decode_rows > 0) {
    for (int64_t at = 0;
         const int64_t n : MicroBatchRows(step.decode_rows, be_.RowInvariantRows(), pipeline_micro_batches())) {
      SequenceRows rows;
      rows.seqs = decode.states.subspan(static_cast<size_t>(at), static_cast<size_t>(n));
      rows.T = n;
      calls.push_back(rows);
      ids.push_back(decode.ids.subspan(static_cast<size_t>(at), static_cast<size_t>(n)));
      each.push_back(forms);
      at += n;
    }
  }
  step.decode_calls = calls.size();
  // The argmax shortcut stays with one stage (PipelineLogits): every row comes back.
  if (decode.argmax != nullptr) decode.argmax->taken = false;
  for (const PrefillChunk& c : chunks) {
    if (c.argmax != nullptr) c.argmax->taken = false;
    SequenceRows rows;
    rows.seqs = std::span<SequenceState* const>(&c.state, 1);
    rows.T = static_cast<int64_t>(c.ids.size());
    calls.push_back(rows);
    ids.push_back(c.ids);
    each.push_back(forms);
    each.back().all_logits = c.all_logits;
  }
  // In flight (docs/distributed.md "Micro-batches in flight"). Every stage runs the calls in
  // order, each exactly as Run of it alone: receive the state from the stage before, run the
  // stage's layers, send it on, and go straight on to the next — so while stage s + 1 runs call
  // i, stage s already runs i + 1. The last stage keeps each call's logits and sends them to the
  // first once all have run; the first stage receives them in CollectStep, after it has sent its
  // last call. No rank ever waits on a message that is sent only after something it has still
  // to send is received, so the order holds even where a Send waits for its Recv (NCCL's point
  // to point): stage 0's sends are taken by stage 1's receives in order, and the logits cross
  // only once every stage is past its last send. All or nothing: every call's checks and blocks
  // before the first runs.
  for (size_t i = 0; i < calls.size(); ++i) KIMIRT_RETURN_IF_ERROR(Prepare(calls[i], ids[i]));
  std::vector<Tensor> last_stage_logits;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Tensor local = Launch(calls[i], ids[i], each[i]);
    if (stage_.is_last()) last_stage_logits.push_back(GatherRanks(local));
    step.logit_rows.push_back(each[i].all_logits ? calls[i].T : 1);
  }
  for (const Tensor& all_ranks : last_stage_logits) SendLogits(all_ranks);
  // Rank 0 with the logits' own link posts their receives now, behind nothing of a later step.
  if (gets_logits() && logits_link_ != nullptr) {
    for (const int64_t R : step.logit_rows) step.posted.push_back(PostLogitsRecv(R));
  }
  return step;
}

StepLogits Model::CollectStep(const StepInFlight& step) {
  StepLogits out;
  const size_t calls = step.logit_rows.size();
  out.chunks.resize(calls - step.decode_calls);
  if (!gets_logits()) return out;
  std::vector<Tensor> parts;
  if (!step.posted.empty()) {
    logits_link_->Join();
    for (size_t i = 0; i < calls; ++i) parts.push_back(AssembleLogits(step.posted[i], step.logit_rows[i]));
  } else {
    for (size_t i = 0; i < calls; ++i) parts.push_back(ReceiveLogits(step.logit_rows[i]));
  }
  std::move(parts.begin() + static_cast<std::ptrdiff_t>(step.decode_calls), parts.end(), out.chunks.begin());
  if (step.decode_rows == 0) return out;
  const int64_t V = config().vocab_size;
  out.decode = Tensor::Host({step.decode_rows, V});
  int64_t row = 0;
  for (size_t i = 0; i < step.decode_calls; ++i) {
    std::copy_n(parts[i].f32(), parts[i].numel(), out.decode.f32() + row * V);
    row += step.logit_rows[i];
  }
  return out;
}

Status Model::Prepare(const SequenceRows& rows, std::span<const int32_t> ids) {
  const ModelConfig& c = config();
  if (rows.T == 0) return InvalidArgument("forward of zero tokens");
  for (int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");
    }
  }
  for (SequenceState* st : rows.seqs) {
    if (st->kda == nullptr || st->kda->num_layers() != stage_kda_layers_ || st->kda_slot < 0 || st->kv == nullptr ||
        st->kv->num_layers() != stage_mla_layers_) {
      return InvalidArgument("sequence state was not made by this model");
    }
    if (st->kda != rows.seqs[0]->kda) return InvalidArgument("sequences of one call must share their KDA slots");
  }
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    SequenceState* st = rows.seqs[b];
    KIMIRT_RETURN_IF_ERROR(st->kv->Reserve(&st->blocks, st->length + rows.count(b)));
  }
  return Status::Ok();
}

Tensor Model::Launch(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o) {
  if (!sent_logits_.empty()) {
    // The logits' own link (set_logits_link): what comes now may reuse their blocks once sent.
    logits_link_->Join();
    sent_logits_.clear();
  }
  // A decode step (one new token per sequence, absorbed form, one cache): its metadata goes to
  // the cache's storage once here, and every MLA layer attends through the block tables. (On a
  // device the copies are queued on the backend's stream, so a micro-batch's metadata replaces
  // the one before only after that one's kernels have read it.)
  const bool paged_decode = PagedDecode(rows, o.mla_form);
  if (paged_decode && stage_mla_layers_ > 0) {
    PagedDecodeStep step;
    for (SequenceState* st : rows.seqs) step.Add(st->blocks, st->length + 1);
    rows.seqs[0]->kv->SetDecodeStep(step);
  }
  // The step's token ids and KDA slots go up once, to buffers of fixed address (a decode graph
  // reads them there).
  if (paged_decode) {
    std::vector<int32_t> slots;
    for (SequenceState* st : rows.seqs) slots.push_back(st->kda_slot);
    be_.SetDecodeInputs(ids, slots);
  }
  const std::string key = DecodeGraphKey(rows, paged_decode, o);
  Tensor local;
  switch (key.empty() ? kRunEagerly : DecodeGraphAction(key)) {
    case kReplay:
      local = ReplayDecodeGraph(key);
      break;
    case kCapture: {
      // Second time this shape: capture it (the first ran eagerly, so every lazily made table,
      // such as the MoE's expert pointers, already exists outside the graph), then replay.
      be_.CaptureBegin(key);
      Tensor captured;
      try {
        captured = RunLayers(rows, ids, o, paged_decode);
      } catch (...) {
        be_.CaptureAbandon();  // a collective aborted inside the capture: the stream leaves it
        throw;
      }
      bool captured_ok = be_.CaptureEnd(captured);
      if (comm_.size() > 1 && MinOverRanks(comm_, be_, captured_ok ? 1.0f : 0.0f) == 0.0f) {
        // A peer's capture failed: no rank may replay its graph alone.
        if (captured_ok) {
          std::fprintf(stderr, "kimirt: a tensor-parallel peer could not capture a decode graph; running eagerly\n");
          be_.DropGraph(key);
        }
        captured_ok = false;
      }
      if (captured_ok && comm_.size() > 1) {
        // Every rank counts the agreed captures alike (below 2^24: exact in the agreement's floats).
        if (capture_of_key_.size() > 4096) capture_of_key_.clear();  // a rank missing one captures
        capture_of_key_[key] = captures_++ % (int64_t{1} << 24);
      }
      if (captured_ok) {
        local = ReplayDecodeGraph(key);
      } else {
        decode_graphs_ = false;  // told on stderr; the step runs op by op from here on
        local = RunLayers(rows, ids, o, paged_decode);
      }
      break;
    }
    case kRunEagerly:
      if (!key.empty()) {
        if (graph_seen_.size() > 4096) graph_seen_.clear();
        graph_seen_.insert(key);
      }
      local = RunLayers(rows, ids, o, paged_decode);
      break;
  }
  for (size_t b = 0; b < rows.seqs.size(); ++b) rows.seqs[b]->length += rows.count(b);
  return local;
}

Model::GraphAction Model::DecodeGraphAction(const std::string& key) {
  const GraphAction mine = be_.HasGraph(key) ? kReplay : graph_seen_.count(key) > 0 ? kCapture : kRunEagerly;
  if (comm_.size() == 1) return mine;
  // Tensor-parallel ranks capture and replay the same graphs together (NCCL: a captured
  // collective is collective over the ranks that captured it, and each must replay the graph of
  // that capture). Their keys hold their own addresses, so the ranks compare what they would do
  // — run eagerly (-2), capture (-1), or replay the graph of agreed capture n (n) — and all take
  // the least advanced: eagerly if any would, else a capture unless every rank would replay the
  // graph of one capture. A rank that could replay captures again with the others, replacing its
  // graph. A host wait per decode step, at TP > 1 only.
  auto it = capture_of_key_.find(key);
  const float v = mine == kRunEagerly ? -2.0f
                  : mine == kCapture || it == capture_of_key_.end() ? -1.0f
                                                                    : static_cast<float>(it->second);
  const std::vector<float> all = GatherOverRanks(comm_, be_, v);
  if (std::find(all.begin(), all.end(), -2.0f) != all.end()) return kRunEagerly;
  if (all[0] >= 0 && std::all_of(all.begin(), all.end(), [&](float x) { return x == all[0]; })) return kReplay;
  return kCapture;
}

Tensor Model::ReplayDecodeGraph(const std::string& key) {
  Tensor local = be_.Replay(key);
  ++graph_replays_;
  if (comm_.size() > 1) comm_.WatchLaunched("a decode graph's collectives");
  return local;
}

std::string Model::DecodeGraphKey(const SequenceRows& rows, bool paged_decode, const ForwardOptions& o) const {
  if (!decode_graphs_ || !paged_decode || !be_.SupportsGraphs() || o.trace != nullptr ||
      (comm_.size() > 1 && !comm_.CapturesInGraphs()) || pipelined()) {
    return {};
  }
  // What the launches bake in: the row count, the latent cache's buffers and step layout, and
  // the KDA pools' addresses (they move when the slots grow).
  std::string key = "B" + std::to_string(rows.seqs.size()) + (o.all_logits ? ":all" : ":last");
  if (stage_mla_layers_ > 0) {
    const std::string kv = rows.seqs[0]->kv->GraphKey();
    if (kv.empty()) return {};
    key += ":" + kv;
  }
  KdaStateSlots* kda = rows.seqs[0]->kda;
  if (kda->num_layers() > 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ":kda:%p:%lld", kda->layer(0).recurrent.raw(),
                  static_cast<long long>(kda->capacity()));
    key += buf;
  }
  return key;
}

// The weights a layer's attention reads first, small ones first: its input projections
// (kda.cpp, mla.cpp: the first LinearGroup of each).
static std::vector<const Tensor*> AttentionInputWeights(const LayerWeights& lw) {
  if (lw.is_kda) {
    const KdaWeights& w = lw.kda;
    return {&w.b, &w.f_a, w.g.defined() ? &w.g : &w.g_a, &w.q, &w.k, &w.v};
  }
  const MlaWeights& w = lw.mla;
  return {&w.kv_a, w.q_a.defined() ? &w.q_a : &w.q, &w.g};
}

Tensor Model::RunLayers(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o,
                        bool paged_decode) {
  const ModelConfig& c = config();
  const int64_t T = rows.T;
  ForwardTrace* trace = o.trace;
  if (trace != nullptr) *trace = ForwardTrace{};
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Spec §4 step 1: embedding (vocab-parallel: each rank fills its rows, the sum is the row).
  // Pipeline stages after the first take the stream where the stage before left it instead.
  std::vector<Tensor> state;
  if (stage_.is_first()) {
    Tensor h = be_.Empty({T, c.hidden_size});
    be_.Embedding(ids, w_.embed, w_.embed_row_begin, &h);
    ctx_.AllReduce(&h);
    state.push_back(h);
  } else {
    state = ReceiveState(T);
  }

  // Spec §4 steps 2-4 (§4.1 per layer), over this stage's layers.
  std::unique_ptr<ResidualStream> stream;
  if (c.UsesAttnRes()) {
    stream = std::make_unique<BlockAttnRes>(be_, std::move(state), *c.attn_res_block_size, eps, w_.out_res_proj,
                                            w_.out_res_norm);
  } else {
    stream = std::make_unique<PreNormResidual>(be_, state[0]);
  }
  // Each sub-layer's output is added to the stream together with the norm that reads the sum
  // next (ResidualStream::AddThenNorm): the FFN's, the next layer's attention norm, the final norm.
  const size_t first = static_cast<size_t>(stage_.first_layer), end = static_cast<size_t>(stage_.end_layer);
  Tensor x, hn;  // the attention norm of layer i; the final norm
  if (first < end) {
    x = ctx_.Norm(stream->AttentionInput(stage_.first_layer, w_.layers[first]), w_.layers[first].input_norm, eps);
  }
  for (size_t i = first; i < end; ++i) {
    const LayerWeights& lw = w_.layers[i];
    Tensor attn = lw.is_kda ? RunKda(ctx_, lw.kda, x, kda_slot_[i], rows, o.kda_form)
                            : RunMla(ctx_, lw.mla, x, mla_slot_[i], rows, o.mla_form, paged_decode);
    Tensor y = stream->AddThenNorm(attn, lw.post_norm, eps, [&] { return stream->FfnInput(lw); });
    Tensor route;
    // The routed choices only when traced (RunMoe may then keep the shared expert apart).
    Tensor ffn =
        lw.is_moe ? RunMoe(ctx_, lw.moe, y, trace != nullptr ? &route : nullptr) : RunMlp(ctx_, lw.dense, y);
    if (trace != nullptr) RecordLayer(be_, x, attn, y, ffn, route, trace);
    // A decode step's next weights toward the caches while the FFN's last small kernels and the
    // norm run (Backend::PrefetchWeights): the next layer's input projections, or the head.
    if (i + 1 < end) {
      ctx_.PrefetchForDecode(T, AttentionInputWeights(w_.layers[i + 1]));
    } else if (stage_.is_last()) {
      const Tensor* const head[] = {&w_.lm_head};
      ctx_.PrefetchForDecode(T, head);
    }
    if (i + 1 < end) {
      const LayerWeights& next = w_.layers[i + 1];
      x = stream->AddThenNorm(ffn, next.input_norm, eps,
                              [&] { return stream->AttentionInput(static_cast<int64_t>(i + 1), next); });
    } else if (stage_.is_last()) {
      hn = stream->AddThenNorm(ffn, w_.norm, eps, [&] { return stream->Output(); });
    } else {
      stream->Add(ffn);
    }
  }

  if (!stage_.is_last()) {
    SendState(stream->State());
    return Tensor();
  }
  // Spec §4 steps 5-6: final norm (above, with the last add) and the vocab-parallel head.
  if (!hn.defined()) hn = ctx_.Norm(stream->Output(), w_.norm, eps);
  if (trace != nullptr) trace->final_norm = HostCopy(be_, hn);
  return HeadLogits(o.all_logits ? hn : hn.Rows(T - 1, 1));
}

// What crosses a stage boundary: the residual stream's whole state after the stage's last layer
// (attn_res.h: the closed AttnRes blocks and the open block's sum; residual.h: h), [T, D] F32
// each, in the backend's memory. The receiver knows how many from the layer it starts at.
std::vector<Tensor> Model::ReceiveState(int64_t T) {
  const ModelConfig& c = config();
  const int64_t n = c.UsesAttnRes() ? BlockAttnRes::StateSizeBefore(stage_.first_layer, *c.attn_res_block_size) : 1;
  std::vector<Tensor> state;
  for (int64_t k = 0; k < n; ++k) {
    Tensor t = be_.Empty({T, c.hidden_size});
    pipeline_->Recv(static_cast<float*>(t.raw()), static_cast<size_t>(t.numel()), stage_.stage - 1);
    state.push_back(std::move(t));
  }
  return state;
}

void Model::SendState(const std::vector<Tensor>& state) {
  for (const Tensor& t : state) {
    KIMIRT_CHECK(t.dtype() == DType::kF32);
    pipeline_->Send(static_cast<const float*>(t.raw()), static_cast<size_t>(t.numel()), stage_.stage + 1);
  }
}

Tensor Model::HeadLogits(const Tensor& head_in) {
  const int64_t R = head_in.dim(0), Vl = w_.lm_head.dim(0);
  Tensor local = be_.Empty({R, Vl});
  // Rows up to RowInvariantRows go in one GEMM (each row's bits are its own there). Beyond,
  // the last row goes through the head on its own even when every row is wanted: a GEMM's
  // summation order may depend on its row count, and the row a sampler reads must not change
  // when a caller also asks for the others (engine.h, prompt logprobs).
  if (R <= be_.RowInvariantRows()) {
    be_.Linear(head_in, w_.lm_head, &local);
    return local;
  }
  Tensor head = local.Rows(0, R - 1);
  be_.Linear(head_in.Rows(0, R - 1), w_.lm_head, &head);
  Tensor last = local.Rows(R - 1, 1);
  be_.Linear(head_in.Rows(R - 1, 1), w_.lm_head, &last);
  return local;
}

Tensor Model::GatherLogits(const Tensor& local, int64_t R, ArgmaxRequest* argmax) {
  if (pipelined()) return PipelineLogits(local, R, argmax);
  const int64_t Vl = local.dim(1), V = config().vocab_size;
  if (argmax != nullptr) {
    argmax->taken = false;
    const std::vector<uint8_t>& only = argmax->only;
    const bool any = std::find(only.begin(), only.end(), uint8_t{1}) != only.end();
    if (comm_.size() == 1 && Vl == V && static_cast<int64_t>(only.size()) == R && any) {
      argmax->argmax = be_.ArgmaxRows(local);
      argmax->taken = true;
      const int64_t full = std::count(only.begin(), only.end(), uint8_t{0});
      Tensor rows = Tensor::Host({full, V});
      const size_t row_bytes = static_cast<size_t>(V) * sizeof(float);
      int64_t at = 0;
      for (int64_t r = 0; r < R;) {
        if (only[static_cast<size_t>(r)] != 0) {
          ++r;
          continue;
        }
        int64_t e = r;
        while (e < R && only[static_cast<size_t>(e)] == 0) ++e;
        Tensor d = be_.Download(local.Rows(r, e - r));
        std::copy_n(static_cast<const uint8_t*>(d.raw()), static_cast<size_t>(e - r) * row_bytes,
                    static_cast<uint8_t*>(rows.raw()) + static_cast<size_t>(at) * row_bytes);
        at += e - r;
        r = e;
      }
      return rows;
    }
  }
  return AssembleLogits(GatherRanks(local), R);
}

Tensor Model::GatherRanks(const Tensor& local) {
  const int tp = comm_.size();
  if (tp == 1) return local;
  // The ranks' slices are gathered where they lie (the communicator takes the backend's memory:
  // device pointers under NCCL), then cross to the host once, as [tp, R, Vl].
  const int64_t R = local.dim(0), Vl = local.dim(1);
  Tensor all_ranks = be_.Empty({tp * R, Vl});
  comm_.AllGather(static_cast<const float*>(local.raw()), static_cast<size_t>(R * Vl),
                  static_cast<float*>(all_ranks.raw()));
  return all_ranks;
}

Tensor Model::AssembleLogits(const Tensor& all_ranks, int64_t R) {
  const int tp = comm_.size();
  const int64_t Vl = all_ranks.dim(1), V = config().vocab_size;
  if (tp == 1 && Vl == V) return HostCopy(be_, all_ranks);  // already [R, V] (a decode batch: no 2nd copy)
  const Tensor host = be_.Download(all_ranks);  // read only: may be all_ranks itself on the CPU
  const float* all = host.f32();
  Tensor logits = Tensor::Host({R, V});
  // Rank r's block [R, Vl] holds vocabulary rows [r*Vl, (r+1)*Vl); rows past V are padding.
  for (int r = 0; r < tp; ++r) {
    for (int64_t t = 0; t < R; ++t) {
      for (int64_t j = 0; j < Vl; ++j) {
        const int64_t v = r * Vl + j;
        if (v < V) logits.f32()[t * V + v] = all[(static_cast<int64_t>(r) * R + t) * Vl + j];
      }
    }
  }
  return logits;
}

// Pipeline stages: the last stage's TP ranks gather their vocabulary slices as without
// pipelining, and its TP rank 0 sends the [tp, R, Vl] block to rank 0 (the first stage's TP rank
// 0, on their pipeline group), which assembles the logits it samples from. Only rank 0 samples:
// the first stage's other TP ranks wait for no logits, so with steps in flight they go on to the
// next step at once (docs/distributed.md "Steps in flight"). The argmax shortcut stays with
// one-stage models (the request is rank 0's, the logits the last stage's).
Tensor Model::PipelineLogits(const Tensor& local, int64_t R, ArgmaxRequest* argmax) {
  if (argmax != nullptr) argmax->taken = false;
  if (stage_.is_last()) {
    SendLogits(GatherRanks(local));
    return Tensor();
  }
  return ReceiveLogits(R);
}

bool Model::gets_logits() const { return !pipelined() || (stage_.is_first() && comm_.rank() == 0); }

void Model::SendLogits(const Tensor& all_ranks) {
  if (comm_.rank() != 0) return;
  if (logits_link_ != nullptr) {
    // On the link's own stream: the block stays held until the next Launch has joined it.
    logits_link_->Send(static_cast<const float*>(all_ranks.raw()), static_cast<size_t>(all_ranks.numel()), 0);
    sent_logits_.push_back(all_ranks);
    return;
  }
  pipeline_->Send(static_cast<const float*>(all_ranks.raw()), static_cast<size_t>(all_ranks.numel()), 0);
}

Tensor Model::ReceiveLogits(int64_t R) {
  if (!gets_logits()) return Tensor();
  const Tensor all_ranks = PostLogitsRecv(R);
  if (logits_link_ != nullptr) logits_link_->Join();
  return AssembleLogits(all_ranks, R);
}

Tensor Model::PostLogitsRecv(int64_t R) {
  // The head's vocabulary slice is the embedding's (both vocab-parallel, ceil(V/tp) rows).
  Tensor all_ranks = be_.Empty({comm_.size() * R, w_.embed.dim(0)});
  float* into = static_cast<float*>(all_ranks.raw());
  const size_t n = static_cast<size_t>(all_ranks.numel());
  logits_link_ != nullptr ? logits_link_->Recv(into, n, 1) : pipeline_->Recv(into, n, stage_.pp - 1);
  return all_ranks;
}

}  // namespace kimirt
