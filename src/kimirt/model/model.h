// Model: the Kimi-K3 / Kimi-Linear text decoder, written once against the Backend op interface
// and the Communicator (spec §4–§9). One Model per rank; under tensor parallelism every rank
// runs the same Forward on its shard and the collectives sit where the math needs them.
//
// A forward call continues one sequence from its SequenceState: prefill a prompt at once or in
// chunks, then decode a token at a time; KDA state, conv windows and the paged MLA latent cache
// carry over (spec §5.7, §6.5, §9).
#pragma once

#include <memory>
#include <map>
#include <set>
#include <string>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/model/config.h"
#include "kimirt/model/latent_kv_cache.h"
#include "kimirt/model/layout.h"
#include "kimirt/model/model_source.h"
#include "kimirt/model/module_context.h"
#include "kimirt/model/pipeline_stages.h"
#include "kimirt/model/sequence_state.h"
#include "kimirt/model/weights.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {

// Host copies of intermediate tensors, for golden and debugging comparisons.
struct ForwardTrace {
  std::vector<Tensor> attn_in, attn_out, ffn_in, ffn_out;  // per layer [T, D]
  std::vector<Tensor> route_idx;  // per layer [T, k] (empty for dense layers)
  Tensor final_norm;              // [T, D]
};

// Rows of a forward's logits that the caller reduces to their argmax (greedy sampling with
// nothing that changes the logits and no logprobs: Sampler::ArgmaxOnly). Where one rank holds
// the whole vocabulary, the backend takes them where the logits lie (Backend::ArgmaxRows) and
// those rows never come back: a decode batch's logits are 42 MB at 64 rows of a 163,840-token
// vocabulary, its argmaxes 256 bytes.
struct ArgmaxRequest {
  std::vector<uint8_t> only;    // in: per output row, 1 = its argmax is all the caller reads
  bool taken = false;           // out: the argmaxes were taken, and the returned logits hold
                                // only the rows with only[r] == 0, in order
  std::vector<int32_t> argmax;  // out, when taken: per output row, its ArgmaxOf (core/argmax.h)
};

struct ForwardOptions {
  // Default: chunked for calls of more than 64 tokens, recurrent otherwise.
  std::optional<KdaForm> kda_form;
  // Default: expanded for prefill (T > 1), absorbed for decode (T = 1), as engines do.
  std::optional<MlaForm> mla_form;
  bool all_logits = true;  // false: logits of the last position only
  ForwardTrace* trace = nullptr;
  ArgmaxRequest* argmax = nullptr;
};

// One prefill chunk of a step (Model::ForwardChunks): ids as the next tokens of state, with the
// logits of every position or of the last only, and the argmax shortcut where one stage asks.
struct PrefillChunk {
  SequenceState* state = nullptr;
  std::span<const int32_t> ids;
  bool all_logits = false;
  ArgmaxRequest* argmax = nullptr;
};

// A step's decode rows (Model::ForwardStep): ids[b] is the next token of states[b], as in
// ForwardDecode, with its argmax request.
struct DecodeRows {
  std::span<SequenceState* const> states;
  std::span<const int32_t> ids;
  ArgmaxRequest* argmax = nullptr;
};

// Model::ForwardStep's logits: the decode rows' [B, vocab] (undefined without decode rows) and
// each prefill chunk's. Pipeline stages: undefined tensors on every rank but rank 0 (gets_logits).
struct StepLogits {
  Tensor decode;
  std::vector<Tensor> chunks;
};

// A step launched on a pipeline stage (Model::LaunchStep), as its CollectStep needs it: the
// logit rows of each call (decode micro-batches first, then the chunks), how many calls are
// decode micro-batches, and their rows in all.
struct StepInFlight {
  std::vector<int64_t> logit_rows;
  size_t decode_calls = 0;
  int64_t decode_rows = 0;
  // Rank 0 with the logits' own link (Model::set_logits_link): each call's receive, posted at
  // launch into these blocks; CollectStep joins them.
  std::vector<Tensor> posted;
};

class Model {
 public:
  // Loads `source` (a model directory, or a config with random weights) as rank comm.rank() of
  // comm.size(); a random source makes only this rank's slices. With a `pipeline` group of more
  // than one rank (pipeline parallelism; docs/distributed.md "Pipeline parallelism"), as stage
  // pipeline->rank() of pipeline->size() (model/pipeline_stages.h): `comm` is then the stage's TP
  // group, and the rank holds and runs only its stage's layers. options.pp and options.stage are
  // set from `pipeline`.
  static Result<std::unique_ptr<Model>> Load(const ModelSource& source, Backend& backend, Communicator& comm,
                                              const LoadOptions& options = {}, Communicator* pipeline = nullptr);
  // Loads DIR (config.json + checkpoint).
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, Backend& backend, Communicator& comm,
                                              const LoadOptions& options = {}, Communicator* pipeline = nullptr) {
    return Load(ModelSource::Directory(dir), backend, comm, options, pipeline);
  }

  Model(const Model&) = delete;  // not movable either: ctx_ refers to layout_'s config
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return layout_.config(); }
  Backend& backend() const { return be_; }
  const Layout& layout() const { return layout_; }
  // The weights as this rank holds them on its backend (bench model counts their bytes).
  const ModelWeights& weights() const { return w_; }

  // A fresh sequence whose latents live in `kv` and whose KDA state takes a slot of `kda`
  // (defaults: a growable F32 cache and slots of the model's own, for tools and tests; the
  // engine passes its paged pool and its slots). Sequences decoded together must share both.
  SequenceState NewSequence(LatentKvCache* kv = nullptr, KdaStateSlots* kda = nullptr);
  // This rank's pipeline stage (stage 0 of 1, every layer, without pipeline parallelism).
  const PipelineStage& stage() const { return stage_; }
  // Whether this rank's forwards return the logits: every TP rank of a one-stage model; under
  // pipeline stages rank 0 only (the first stage's TP rank 0; the others return undefined ones).
  bool gets_logits() const;

  // KDA state slots shaped for this model (every KDA layer of its stage), `slots` to begin with
  // (they grow).
  std::unique_ptr<KdaStateSlots> MakeKdaStates(int64_t slots) const;
  // A latent cache shaped for this model (the MLA layers of its stage; none: block accounting
  // only, which every stage keeps in lockstep).
  std::unique_ptr<LatentKvCache> MakeKvCache(int64_t num_blocks, int block_size, KvCacheDType dtype,
                                             bool growable) const;
  // Runs `ids` as the next tokens of `state`. Returns F32 host logits [T, vocab] (or [1, vocab]
  // with all_logits = false). ids outside the vocabulary are an InvalidArgument. Pipeline
  // stages: every stage's ranks call it alike; the first stage's ranks get the logits (the last
  // stage sends them back), the others an undefined tensor.
  Result<Tensor> Forward(SequenceState* state, std::span<const int32_t> ids,
                         const ForwardOptions& options = {});
  // One decode step of several sequences at once: ids[b] is the next token of states[b]; returns
  // F32 host logits [B, vocab]. The sequences share every per-token op (projections, norms, MoE,
  // head); KDA and MLA run as batched ops over their slots and block tables. On a backend whose ops are row-invariant up
  // to B rows (Backend::RowInvariantRows) each row's logits equal, bit for bit, a Forward of that
  // sequence alone. States must be distinct.
  // Pipeline stages: any B. The step splits into micro-batches (MicroBatchRows: none larger
  // than RowInvariantRows, so each row is still its sequence's Forward alone, bit for bit) that
  // flow through the stages in flight — a stage goes on to the next micro-batch as soon as it
  // has sent one on, so stage s runs micro-batch i while stage s + 1 runs i − 1 (docs/
  // distributed.md "Micro-batches in flight").
  Result<Tensor> ForwardDecode(std::span<SequenceState* const> states, std::span<const int32_t> ids,
                               const ForwardOptions& options = {});

  // A step's prefill chunks, of distinct sequences: chunk i's logits, each exactly what
  // Forward(chunks[i].state, chunks[i].ids) gives (a chunk keeps its bits; the prefix cache and
  // batch invariance rely on fixed chunks). One stage: one Forward after another. Pipeline
  // stages: the chunks flow through the stages in flight as a decode step's micro-batches do —
  // stage s runs chunk i while stage s + 1 runs chunk i − 1 (docs/distributed.md "Prefill
  // chunks in flight"); every chunk's blocks are checked and reserved before any runs. `options`
  // gives the KDA / MLA forms only.
  Result<std::vector<Tensor>> ForwardChunks(std::span<const PrefillChunk> chunks, const ForwardOptions& options = {});

  // A whole step — its decode rows and its prefill chunks, all of distinct sequences — in one
  // call: the decode logits exactly ForwardDecode's, chunk i's exactly ForwardChunks' (each its
  // Forward alone). One stage: ForwardDecode, then one Forward per chunk. Pipeline stages: one
  // flow through the stages, the decode micro-batches first and the chunks after them, so the
  // pipeline fills and drains once per step instead of once for the decodes and once for the
  // chunks (docs/distributed.md "A step in one flow"); every call's checks and blocks before any
  // runs, so an error leaves every sequence as it was. `options` gives the KDA / MLA forms only.
  Result<StepLogits> ForwardStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                 const ForwardOptions& options = {});

  // Steps in flight (docs/distributed.md "Steps in flight"), pipeline stages only: ForwardStep in
  // two halves. LaunchStep checks and reserves every call, runs this stage's part of each (the
  // last stage sends the logits on) and returns; then the first stage's CollectStep receives the
  // step's logits (the other stages' returns undefined tensors at once). A stage may launch step
  // n + 1 before step n is collected: every stage runs its calls in launch order, and the
  // logits of step n were sent before anything of step n + 1 on the last stage.
  Result<StepInFlight> LaunchStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                  const ForwardOptions& options = {});
  StepLogits CollectStep(const StepInFlight& step);

  // Pipeline stages: how many micro-batches a decode step asks for (MicroBatchRows' `wanted`;
  // more where RowInvariantRows needs them). 0, the default: one per stage. Every rank of a run
  // must be given the same.
  void set_pipeline_micro_batches(int n) { micro_batches_ = n; }
  // Pipeline stages: the logits' own link between rank 0 (its rank 0) and the last stage's TP
  // rank 0 (its rank 1), set on those two ranks; without one they cross on the pipeline group.
  // GPUs with steps in flight (docs/distributed.md "Steps in flight"): an NCCL communicator on a
  // side stream, so a step's logits never queue behind the next step's activations.
  void set_logits_link(Communicator* link) { logits_link_ = link; }
  int pipeline_micro_batches() const { return micro_batches_ > 0 ? micro_batches_ : stage_.pp; }

  // Decode steps as graphs (on by default where the backend has them: Backend::SupportsGraphs;
  // docs/cuda.md "Decode graphs"): a step shape seen once is captured the second time and
  // replayed after, the same bits as running it op by op. Off: vLLM's --enforce-eager. At
  // TP > 1 where the communicator's collectives can be captured (NCCL), every rank of the group
  // must be given the same setting.
  void set_decode_graphs(bool on) { decode_graphs_ = on; }
  bool decode_graphs() const { return decode_graphs_; }
  // Decode steps run as graph replays so far (a test's proof that graphs ran).
  int64_t graph_replays() const { return graph_replays_; }

 private:
  Model(Layout layout, ModelWeights weights, Backend& backend, Communicator& comm, Communicator* pipeline,
        PipelineStage stage);
  bool pipelined() const { return stage_.pp > 1; }

  Result<Tensor> Run(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o);
  // Run's parts. Prepare checks a call and reserves every latent block it writes (before any
  // layer runs, so a full pool fails the call cleanly); Launch runs it on the device (a decode
  // graph where there is one) and advances the sequences: this rank's logits [R, V_local] on the
  // last stage, an undefined tensor on the others.
  Status Prepare(const SequenceRows& rows, std::span<const int32_t> ids);
  Tensor Launch(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o);
  // ForwardStep (and so ForwardDecode and ForwardChunks) on pipeline stages: the decode rows'
  // micro-batches, then the chunks, as the calls of one flow (LaunchStep, then CollectStep).
  Result<StepLogits> RunStepInFlight(const DecodeRows& decode, std::span<const PrefillChunk> chunks,
                                     const ForwardOptions& o);
  // A step's arguments: as many ids as decode rows, some work, every sequence once.
  static Status CheckStep(const DecodeRows& decode, std::span<const PrefillChunk> chunks);
  // The layers, final norm and head of a step on the device: this rank's logits [R, V_local].
  Tensor RunLayers(const SequenceRows& rows, std::span<const int32_t> ids, const ForwardOptions& o, bool paged_decode);
  // This rank's logits [R, V_local] of final-norm output rows head_in [R, D] (spec §4 step 6).
  Tensor HeadLogits(const Tensor& head_in);
  // F32 host logits [R, vocab] from every rank's [R, V_local] (or, when `argmax` is taken, the
  // argmaxes and the other rows only). Pipeline stages: `local` is the last stage's; the first
  // stage receives them (rows R) and returns them, the others return an undefined tensor.
  Tensor GatherLogits(const Tensor& local, int64_t R, ArgmaxRequest* argmax);
  // Every TP rank's [R, V_local] as [tp·R, V_local] in the backend's memory (`local` at TP 1).
  Tensor GatherRanks(const Tensor& local);
  // Host [R, vocab] from GatherRanks's block.
  Tensor AssembleLogits(const Tensor& all_ranks, int64_t R);
  Tensor PipelineLogits(const Tensor& local, int64_t R, ArgmaxRequest* argmax);
  // PipelineLogits' halves: the last stage's TP rank 0 sends the TP ranks' [tp·R, V_local] block
  // to rank 0, which receives it (R rows) and assembles the host logits (the others: nothing).
  void SendLogits(const Tensor& all_ranks);
  Tensor ReceiveLogits(int64_t R);
  // ReceiveLogits' first half: the receive posted into a new block, returned (not yet joined).
  Tensor PostLogitsRecv(int64_t R);
  // Pipeline stages: the residual stream's state before this stage's first layer, from the
  // stage before (T rows), and after its last layer, to the stage after.
  std::vector<Tensor> ReceiveState(int64_t T);
  void SendState(const std::vector<Tensor>& state);
  // The graph key of a decode step of `rows`, or empty when the step runs op by op.
  std::string DecodeGraphKey(const SequenceRows& rows, bool paged_decode, const ForwardOptions& o) const;
  // What a decode step under `key` does: run op by op (a shape seen first), capture (seen once),
  // replay (captured). At TP > 1 the ranks agree first (the smallest; a collective).
  enum GraphAction { kRunEagerly = 0, kCapture = 1, kReplay = 2 };
  GraphAction DecodeGraphAction(const std::string& key);
  Tensor ReplayDecodeGraph(const std::string& key);

  Layout layout_;
  ModelWeights w_;
  Backend& be_;
  Communicator& comm_;
  Communicator* pipeline_;  // the pipeline group (rank = stage), or null
  PipelineStage stage_;
  ModuleContext ctx_;  // what the sub-layer modules (kda.h, mla.h, moe.h) run with
  std::vector<int> kda_slot_;  // layer -> KDA layer index in KdaStateSlots (or -1; the stage's layers only)
  std::vector<int> mla_slot_;  // layer -> MLA layer index in the latent cache (or -1; the stage's layers only)
  int64_t stage_kda_layers_ = 0, stage_mla_layers_ = 0;
  std::unique_ptr<LatentKvCache> private_kv_;
  std::unique_ptr<KdaStateSlots> private_kda_;
  bool decode_graphs_ = true;
  int micro_batches_ = 0;  // set_pipeline_micro_batches
  Communicator* logits_link_ = nullptr;  // set_logits_link
  std::vector<Tensor> sent_logits_;       // sent on logits_link_, not yet joined (the next Launch joins)
  int64_t graph_replays_ = 0;
  std::set<std::string> graph_seen_;  // keys run once eagerly; the next step captures
  // TP > 1: which agreed capture (counted alike on every rank) made the graph under each key.
  std::map<std::string, int64_t> capture_of_key_;
  int64_t captures_ = 0;
};

}  // namespace kimirt
