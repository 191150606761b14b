// ProcessRanksRunner (process_ranks_runner.h). Wire format on each rank-0 <-> follower link:
// FrameHeader{op, aux, n} + n payload bytes, where a command's payload is
//   [u64 count of int64 args][u64 count of int32 ids][u64 text bytes][int64 args][int32 ids][text].
// Start-up: follower -> Hello(aux = its rank); rank 0 -> Options; both make their backend;
// CUDA: follower -> BackendReady, then every rank joins the rendezvous store (rank 0 serves it,
// on the port the options name) and builds its NCCL communicator; CPU: the TCP communicator on
// these links. Both load; follower -> Ready. Then rank 0 sends commands; the follower answers
// only through the collectives the command runs (and an error frame if it fails, after which it
// exits 1).
#include "kimirt/engine/process_ranks_runner.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/dist/rank_spawner.h"
#include "kimirt/dist/rendezvous_store.h"
#include "kimirt/engine/rank_device.h"
#include "kimirt/engine/runner_rank.h"
#include "kimirt/model/module_context.h"
#include "kimirt/parallel/nccl_communicator.h"
#include "kimirt/parallel/tcp_communicator.h"

namespace kimirt {
namespace {

using runner::CacheSizes;
using runner::Rank;

enum Cmd : uint32_t {
  kHello = kFrameUserBase,
  kOptions,
  kReady,
  kQuit,
  kNewSequence,
  kReserve,
  kForward,
  kForwardDecode,
  kRelease,
  kRetainBlocks,
  kReleaseBlocks,
  kSharePrefix,
  kSnapshotKda,
  kRestoreKda,
  kDropKdaSnapshot,
  kBackendReady,
  kGroupHello,  // pipeline parallelism on CPUs: aux the sender's world rank, n its group (0 TP, 1 pipeline)
  // A step's decode rows and prefill chunks in one flow (ModelRunner::ForwardStep; also a step of
  // chunks only): a: the decode rows' count D, their D handles, then (handle, last_only, token
  // count) per chunk; ids: the D decode tokens, then the chunks' tokens in order.
  kForwardStep,
};

struct Message {
  std::vector<int64_t> a;
  std::vector<int32_t> ids;
  std::string text;
};

std::vector<char> Encode(const Message& m) {
  const uint64_t counts[3] = {m.a.size(), m.ids.size(), m.text.size()};
  std::vector<char> out(sizeof(counts) + m.a.size() * 8 + m.ids.size() * 4 + m.text.size());
  char* p = out.data();
  auto put = [&p](const void* src, size_t bytes) {
    if (bytes != 0) std::memcpy(p, src, bytes);
    p += bytes;
  };
  put(counts, sizeof(counts));
  put(m.a.data(), m.a.size() * 8);
  put(m.ids.data(), m.ids.size() * 4);
  put(m.text.data(), m.text.size());
  return out;
}

Result<Message> Decode(const std::vector<char>& in) {
  uint64_t counts[3];
  if (in.size() < sizeof(counts)) return Corrupt("rank command: payload shorter than its counts");
  std::memcpy(counts, in.data(), sizeof(counts));
  if (in.size() != sizeof(counts) + counts[0] * 8 + counts[1] * 4 + counts[2]) {
    return Corrupt("rank command: payload size does not match its counts");
  }
  Message m;
  m.a.resize(counts[0]);
  m.ids.resize(counts[1]);
  m.text.resize(counts[2]);
  const char* p = in.data() + sizeof(counts);
  auto get = [&p](void* dst, size_t bytes) {
    if (bytes != 0) std::memcpy(dst, p, bytes);
    p += bytes;
  };
  get(m.a.data(), m.a.size() * 8);
  get(m.ids.data(), m.ids.size() * 4);
  get(m.text.data(), m.text.size());
  return m;
}

Status SendMessage(int fd, uint32_t op, uint32_t aux, const Message& m, Deadline d) {
  const std::vector<char> payload = Encode(m);
  return SendFrame(fd, FrameHeader{op, aux, payload.size()}, payload.data(), payload.size(), d);
}

Result<Message> RecvPayload(int fd, const FrameHeader& h, Deadline d) {
  if (h.n > (uint64_t{1} << 30)) return Corrupt("rank command: payload of " + std::to_string(h.n) + " bytes");
  std::vector<char> payload(h.n);
  KIMIRT_RETURN_IF_ERROR(RecvAll(fd, payload.data(), payload.size(), d));
  return Decode(payload);
}

// What a follower needs to load its shard exactly as rank 0 loads its own — the model source
// (a directory, or a config and the seed of its random weights: each rank makes its own slices),
// the options — and (CUDA) the port of rank 0's rendezvous store.
Message OptionsMessage(const ModelSource& source, const RunnerOptions& o, int store_port) {
  Message m;
  m.a = {o.tp,
         o.num_kv_blocks,
         static_cast<int64_t>(o.kv_cache_bytes),
         o.block_size,
         static_cast<int64_t>(o.kv_cache_dtype),
         o.max_kda_snapshots,
         std::bit_cast<int64_t>(o.kda_snapshot_fraction),
         o.enforce_eager ? 1 : 0,
         static_cast<int64_t>(o.matrix_dtype),
         o.rank_timeout_ms,
         o.follower_cpu_threads,
         std::bit_cast<int64_t>(o.gpu_memory_utilization),
         store_port,
         o.ep,
         std::bit_cast<int64_t>(source.seed),
         o.pp,
         o.pp_micro_batches,
         o.steps_in_flight,
         o.shard_latent_moe ? 1 : 0};
  m.text = source.dir + '\n' + o.device + '\n' + source.config_path;
  return m;
}

struct FollowerOptions {
  ModelSource source;
  RunnerOptions o;
  int store_port = 0;
};

Result<FollowerOptions> OptionsFrom(const Message& m) {
  const size_t nl = m.text.find('\n');
  const size_t nl2 = nl == std::string::npos ? nl : m.text.find('\n', nl + 1);
  if (m.a.size() != 19 || nl2 == std::string::npos) return Corrupt("rank options: malformed message");
  RunnerOptions o;
  o.tp = static_cast<int>(m.a[0]);
  o.num_kv_blocks = m.a[1];
  o.kv_cache_bytes = static_cast<uint64_t>(m.a[2]);
  o.block_size = static_cast<int>(m.a[3]);
  o.kv_cache_dtype = static_cast<KvCacheDType>(m.a[4]);
  o.max_kda_snapshots = m.a[5];
  o.kda_snapshot_fraction = std::bit_cast<double>(m.a[6]);
  o.enforce_eager = m.a[7] != 0;
  o.matrix_dtype = static_cast<DType>(m.a[8]);
  o.rank_timeout_ms = static_cast<int>(m.a[9]);
  o.follower_cpu_threads = static_cast<int>(m.a[10]);
  o.gpu_memory_utilization = std::bit_cast<double>(m.a[11]);
  o.ep = static_cast<int>(m.a[13]);
  o.pp = static_cast<int>(m.a[15]);
  o.pp_micro_batches = static_cast<int>(m.a[16]);
  o.steps_in_flight = static_cast<int>(m.a[17]);
  o.shard_latent_moe = m.a[18] != 0;
  o.device = m.text.substr(nl + 1, nl2 - nl - 1);
  const ModelSource source{m.text.substr(0, nl), m.text.substr(nl2 + 1), std::bit_cast<uint64_t>(m.a[14])};
  return FollowerOptions{source, o, static_cast<int>(m.a[12])};
}

// One rank's backend, communicator, model and state — the same on rank 0 and on every follower.
// Made in this order and ended in reverse: the model and state before the communicator they
// reduce through, the communicator before the rendezvous store and the backend (NCCL issues on
// the backend's stream).
struct LoadedRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<RendezvousStore> store;  // CUDA: NCCL's unique id came through it; CPU pipelines: the links'
  StarLinks tp_links, pp_links;            // CPU pipelines: the rank's stage's TP group, its pipeline group
  std::unique_ptr<Communicator> comm;      // the TP group (the stage's, under pipeline parallelism)
  std::unique_ptr<Communicator> pipeline;  // the pipeline group (pp > 1)
  std::unique_ptr<Communicator> logits;    // GPUs, steps in flight: rank 0 and the last stage's TP rank 0
  std::unique_ptr<Model> model;
  Rank rank;
  CacheSizes sizes;

  // Everything, in the reverse of the order it was made.
  void Release() {
    { Rank gone = std::move(rank); }  // in its own order: the sequences before the caches
    model.reset();
    logits.reset();
    pipeline.reset();
    comm.reset();
    tp_links.peers.clear();
    pp_links.peers.clear();
    store.reset();
    backend.reset();
  }

  // Ends the collectives this rank waits in (Communicator::Abort): the group is broken.
  void AbortCollectives(const std::string& why) {
    for (Communicator* c : {comm.get(), pipeline.get(), logits.get()}) {
      if (c != nullptr) c->Abort(why);
    }
  }
  // Why a communicator of the rank was aborted; empty while both work.
  std::string Aborted() const {
    for (const Communicator* c : {comm.get(), pipeline.get(), logits.get()}) {
      if (c == nullptr) continue;
      if (std::string why = c->aborted(); !why.empty()) return why;
    }
    return {};
  }
};

bool OnGpus(const RunnerOptions& o) { return o.device != "cpu"; }

// Ranks of the run: tp × pp, numbered stage-major (rank = stage · tp + tp rank).
int World(const RunnerOptions& o) { return o.tp * o.pp; }
// Whether the ranks meet in rank 0's rendezvous store: NCCL's ids come through it, and on CPUs
// the pipeline's links find each other there.
bool UsesStore(const RunnerOptions& o) { return OnGpus(o) || o.pp > 1; }

// The rank's backend: on GPUs, device `device` (its local rank).
Status MakeRankBackend(const RunnerOptions& o, int rank, int device, LoadedRank* out) {
  Result<std::unique_ptr<Backend>> b = MakeBackend(o.device, device);
  if (!b.ok()) return b.status().WithContext("rank " + std::to_string(rank));
  out->backend = std::move(*b);
  return Status::Ok();
}

// GPUs: joins rank 0's rendezvous store and builds the NCCL communicator on the backend's stream.
// Collective over the ranks.
// Joins rank 0's rendezvous store (every rank of the run).
Status JoinStore(const RunnerOptions& o, int rank, const std::string& master_addr, int store_port, LoadedRank* out) {
  RendezvousOptions ro;
  ro.master_addr = master_addr;
  ro.master_port = store_port;
  ro.rank = rank;
  ro.world_size = World(o);
  ro.timeout = std::chrono::milliseconds(o.rank_timeout_ms);
  KIMIRT_ASSIGN_OR_RETURN(out->store, RendezvousStore::Join(ro));
  return Status::Ok();
}

Status JoinNccl(const RunnerOptions& o, int rank, const std::string& master_addr, int store_port, int device,
                LoadedRank* out) {
  KIMIRT_RETURN_IF_ERROR(JoinStore(o, rank, master_addr, store_port, out));
  NcclOptions no;
  no.device = device;
  no.stream = BackendStream(*out->backend);
  no.timeout = std::chrono::milliseconds(o.rank_timeout_ms);  // above the longest legitimate step, as the TCP links' deadline
  no.tag = "tp";
  no.share_gpu = RanksShareGpu();  // every rank on GPU 0: the peer all-reduce alone (rank_device.h)
  if (o.pp == 1) {
    KIMIRT_ASSIGN_OR_RETURN(out->comm, MakeNcclCommunicator(*out->store, no));
    return Status::Ok();
  }
  // Pipeline parallelism: a communicator per stage's TP group and one per tp rank's pipeline
  // (each made by all of its members; the groups of one kind are disjoint, so no rank waits on
  // a group whose members are busy with another).
  const int stage = rank / o.tp, t = rank % o.tp;
  no.tag = "tp/" + std::to_string(stage);
  no.group_rank = t;
  no.group_size = o.tp;
  KIMIRT_ASSIGN_OR_RETURN(out->comm, MakeNcclCommunicator(*out->store, no));
  no.tag = "pp/" + std::to_string(t);
  no.group_rank = stage;
  no.group_size = o.pp;
  KIMIRT_ASSIGN_OR_RETURN(out->pipeline, MakeNcclCommunicator(*out->store, no));
  // Steps in flight: the logits' own link, rank 0 and the last stage's TP rank 0 (Model::set_logits_link).
  const int last = (o.pp - 1) * o.tp;
  if (runner::StepsInFlight(o) > 1 && (rank == 0 || rank == last)) {
    no.tag = "pp-logits";
    no.group_rank = rank == 0 ? 0 : 1;
    no.group_size = 2;
    no.side_stream = true;
    KIMIRT_ASSIGN_OR_RETURN(out->logits, MakeNcclCommunicator(*out->store, no));
  }
  return Status::Ok();
}

// CPUs with pipeline stages (docs/distributed.md "Pipeline parallelism"): the ranks' group links,
// besides the command links to rank 0. Each rank listens on a free port and publishes
// "host:port" in rank 0's store (rank 0 an empty host: the others reach it at master_addr);
// then a rank connects to its stage's tp rank 0 (a star: the TP collectives) and to the same tp
// rank of every earlier stage (a mesh: Send/Recv between any two stages), says who it is, and
// accepts the connections of the others. Connects complete in the kernel's backlog before the
// peer accepts, so the order of the ranks does not matter.
Status JoinGroupLinks(const RunnerOptions& o, int rank, const std::string& master_addr, int store_port,
                      const std::string& my_host, LoadedRank* out) {
  KIMIRT_RETURN_IF_ERROR(JoinStore(o, rank, master_addr, store_port, out));
  const std::chrono::milliseconds timeout(o.rank_timeout_ms);
  KIMIRT_ASSIGN_OR_RETURN(Socket listener, ListenTcp(0));
  KIMIRT_ASSIGN_OR_RETURN(const int port, LocalPort(listener));
  KIMIRT_RETURN_IF_ERROR(out->store->Set("links/" + std::to_string(rank), my_host + ":" + std::to_string(port)));
  const int stage = rank / o.tp, t = rank % o.tp;
  const Deadline d = Clock::now() + timeout;
  for (auto [links, me, n] : {std::tuple{&out->tp_links, t, o.tp}, std::tuple{&out->pp_links, stage, o.pp}}) {
    links->rank = me;
    links->size = n;
    links->peers.resize(static_cast<size_t>(n));
    links->timeout = timeout;
  }
  auto connect = [&](int peer, Socket* slot, uint64_t group) -> Status {
    KIMIRT_ASSIGN_OR_RETURN(const std::string addr, out->store->Get("links/" + std::to_string(peer)));
    const size_t colon = addr.rfind(':');
    if (colon == std::string::npos) return Corrupt("rank " + std::to_string(peer) + " published \"" + addr + "\"");
    const std::string host = colon == 0 ? master_addr : addr.substr(0, colon);
    Result<Socket> sock = ConnectTcp(host, std::atoi(addr.c_str() + colon + 1), d);
    if (!sock.ok()) return sock.status().WithContext("rank " + std::to_string(rank) + " linking to rank " + std::to_string(peer));
    KIMIRT_RETURN_IF_ERROR(SendFrame(sock->fd(), FrameHeader{kGroupHello, static_cast<uint32_t>(rank), group}, nullptr, 0, d));
    *slot = std::move(*sock);
    return Status::Ok();
  };
  if (t > 0) KIMIRT_RETURN_IF_ERROR(connect(stage * o.tp, &out->tp_links.peers[0], 0));
  for (int i = 0; i < stage; ++i) KIMIRT_RETURN_IF_ERROR(connect(i * o.tp + t, &out->pp_links.peers[static_cast<size_t>(i)], 1));
  const int expect = (t == 0 ? o.tp - 1 : 0) + (o.pp - 1 - stage);
  for (int k = 0; k < expect; ++k) {
    Result<Socket> sock = AcceptTcp(listener, d);
    if (!sock.ok()) return sock.status().WithContext("rank " + std::to_string(rank) + " waiting for its group links");
    KIMIRT_ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(sock->fd(), -1, "a group link's hello", d));
    const int from = static_cast<int>(h.aux);
    const bool tp_link = h.n == 0 && t == 0 && from / o.tp == stage && from % o.tp > 0;
    const bool pp_link = h.n == 1 && from % o.tp == t && from / o.tp > stage && from / o.tp < o.pp;
    Socket* slot = tp_link   ? &out->tp_links.peers[static_cast<size_t>(from % o.tp)]
                   : pp_link ? &out->pp_links.peers[static_cast<size_t>(from / o.tp)]
                             : nullptr;
    if (h.op != kGroupHello || slot == nullptr || slot->valid()) {
      return Internal("rank " + std::to_string(rank) + ": an unexpected group link from rank " + std::to_string(from));
    }
    *slot = std::move(*sock);
  }
  out->comm = MakeTcpCommunicator(out->tp_links);
  out->pipeline = MakeTcpCommunicator(out->pp_links);
  return Status::Ok();
}

// The host other ranks reach this one at: the local end of its link to rank 0.
std::string LocalHost(const Socket& link) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  char buf[INET_ADDRSTRLEN] = {0};
  if (getsockname(link.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf)) == nullptr) {
    return "127.0.0.1";
  }
  return buf;
}

// Every rank's count replaced by the smallest over the run's ranks (the stage's TP group, then
// the pipeline group: together every rank). Counts above 2^24 (a stage with no MLA layer: its
// own budget is unbounded) are taken as 2^24, where floats are still exact.
int64_t LeastOverRanks(LoadedRank& r, int64_t count) {
  float v = static_cast<float>(std::min<int64_t>(count, int64_t{1} << 24));
  for (Communicator* c : {r.comm.get(), r.pipeline.get()}) {
    if (c != nullptr) v = MinOverRanks(*c, *r.backend, v);
  }
  return static_cast<int64_t>(v);
}

// Loads the rank's shard (rank out->comm->rank()) and sizes its caches. Collective: loading and
// sizing from GPU memory run collectives.
Status LoadRank(const ModelSource& source, RunnerOptions o, LoadedRank* out) {
  LoadOptions lo;
  lo.matrix_dtype = o.matrix_dtype;
  lo.ep = o.ep;
  lo.shard_latent_moe = o.shard_latent_moe;
  KIMIRT_ASSIGN_OR_RETURN(out->model, Model::Load(source, *out->backend, *out->comm, lo, out->pipeline.get()));
  out->model->set_decode_graphs(!o.enforce_eager);
  out->model->set_pipeline_micro_batches(o.pp_micro_batches);
  if (out->logits != nullptr) out->model->set_logits_link(out->logits.get());
  if (OnGpus(o) && o.gpu_memory_utilization > 0 && o.num_kv_blocks == 0) {
    // Each GPU's free memory may differ; the ranks take the smallest budget so their block
    // allocators stay in lockstep. A rank without room takes part too (with 0), so none waits.
    RunnerOptions mine = o;
    const Result<bool> sized = runner::SizeFromGpuMemory(*out->backend, &mine);
    // Ranks sharing one GPU (KIMIRT_RANKS_SHARE_GPU) share its room too: each takes its part of
    // what is left after the weights of all of them (the smallest measure below is the last
    // rank's to load, taken while the others wait in the collective with theirs loaded).
    if (sized.ok() && RanksShareGpu()) mine.kv_cache_bytes /= static_cast<uint64_t>(World(o));
    uint64_t least = runner::MinOverRanks(*out->comm, *out->backend, sized.ok() ? mine.kv_cache_bytes : 0);
    if (out->pipeline != nullptr) least = runner::MinOverRanks(*out->pipeline, *out->backend, least);
    if (!sized.ok()) return sized.status().WithContext("rank " + std::to_string(out->comm->rank()));
    if (least == 0) return ResourceExhausted("another rank's GPU has no room for the latent cache (--gpu-memory-utilization)");
    o.kv_cache_bytes = least;
  }
  KIMIRT_ASSIGN_OR_RETURN(out->sizes, runner::SizeCaches(*out->model, o));
  if (out->pipeline != nullptr) {
    // The stages hold different layers: each rank takes the smallest counts, so the block
    // allocators stay in lockstep (the thread runner's LeastOf).
    out->sizes.blocks = LeastOverRanks(*out, out->sizes.blocks);
    out->sizes.snapshots = LeastOverRanks(*out, out->sizes.snapshots);
  }
  out->rank.model = out->model.get();
  out->rank.kv = out->model->MakeKvCache(out->sizes.blocks, o.block_size, o.kv_cache_dtype, false);
  out->rank.kda = out->model->MakeKdaStates(runner::kInitialKdaSlots);
  return Status::Ok();
}

// kForwardStep's message, and the step it names (its spans point into the message).
Message StepMessage(const ModelRunner::Decodes& d, std::span<const ModelRunner::Chunk> chunks) {
  Message m;
  m.a.push_back(static_cast<int64_t>(d.hs.size()));
  m.a.insert(m.a.end(), d.hs.begin(), d.hs.end());
  m.ids.assign(d.ids.begin(), d.ids.end());
  for (const ModelRunner::Chunk& c : chunks) {
    m.a.insert(m.a.end(), {c.h, c.last_only ? 1 : 0, static_cast<int64_t>(c.ids.size())});
    m.ids.insert(m.ids.end(), c.ids.begin(), c.ids.end());
  }
  return m;
}
struct StepCall {
  ModelRunner::Decodes decodes;
  std::vector<ModelRunner::Chunk> chunks;
};
Result<StepCall> StepFrom(const Message& m) {
  const Status malformed = Corrupt("forward step: malformed message");
  if (m.a.empty() || m.a[0] < 0) return malformed;
  const size_t D = static_cast<size_t>(m.a[0]);
  if (D > m.a.size() - 1 || D > m.ids.size() || (m.a.size() - 1 - D) % 3 != 0) return malformed;
  StepCall call;
  call.decodes.hs = std::span<const int64_t>(m.a).subspan(1, D);
  call.decodes.ids = std::span<const int32_t>(m.ids).first(D);
  size_t at = D;
  for (size_t i = 1 + D; i < m.a.size(); i += 3) {
    const size_t n = static_cast<size_t>(m.a[i + 2]);
    if (m.a[i + 2] < 0 || n > m.ids.size() - at) return malformed;
    call.chunks.push_back(ModelRunner::Chunk{m.a[i], std::span<const int32_t>(m.ids).subspan(at, n), m.a[i + 1] != 0});
    at += n;
  }
  if (at != m.ids.size()) return malformed;
  return call;
}

// Applies one command to a rank; rank 0 and the followers both go through here, so they cannot
// drift apart. Returns false for kQuit.
Result<bool> Apply(Rank& r, uint32_t op, const Message& m) {
  auto arg = [&m](size_t i) -> int64_t { return m.a.at(i); };
  switch (op) {
    case kQuit:
      return false;
    case kNewSequence:
      r.seqs.emplace(arg(0), r.model->NewSequence(r.kv.get(), r.kda.get()));
      break;
    case kReserve:
      KIMIRT_RETURN_IF_ERROR(r.Reserve(arg(0), arg(1)));
      break;
    case kForward:
      KIMIRT_RETURN_IF_ERROR(r.Forward(arg(0), m.ids, arg(1) != 0).status());
      break;
    case kForwardDecode:
      KIMIRT_RETURN_IF_ERROR(r.ForwardDecode(m.a, m.ids).status());
      break;
    case kForwardStep: {
      KIMIRT_ASSIGN_OR_RETURN(const StepCall call, StepFrom(m));
      KIMIRT_RETURN_IF_ERROR(r.ForwardStep(call.decodes, call.chunks, false).status());
      break;
    }
    case kRelease:
      r.seqs.erase(arg(0));
      break;
    case kRetainBlocks:
      r.kv->Share(m.ids);
      break;
    case kReleaseBlocks:
      r.kv->FreeBlocks(m.ids);
      break;
    case kSharePrefix:
      r.SharePrefix(arg(0), m.ids, arg(1));
      break;
    case kSnapshotKda:
      r.SnapshotKda(arg(0), arg(1));
      break;
    case kRestoreKda:
      r.RestoreKda(arg(0), arg(1));
      break;
    case kDropKdaSnapshot:
      r.snapshots.erase(arg(0));
      break;
    default:
      return Corrupt("rank command: unknown op " + std::to_string(op));
  }
  return true;
}

// /proc/self/exe as the path it links to, so the followers show under the binary's own name
// (ps, pgrep -x kimirt) rather than "exe".
std::string ResolveBinary(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::read_symlink(path, ec);
  return ec || path != "/proc/self/exe" ? path : real.string();
}

// The spawner's options for `count` follower ranks from `first_rank` on this node (local ranks
// from `first_local_rank`), connecting to rank 0 at addr:port: rank 0's own node and every other
// node's launcher start them the same way.
SpawnOptions FollowerSpawn(const std::string& binary, int first_rank, int count, int first_local_rank, int world_size,
                           const std::string& addr, int port) {
  SpawnOptions so;
  so.argv = {ResolveBinary(binary), "rank-worker"};
  so.local_ranks = count;
  so.first_rank = first_rank;
  so.first_local_rank = first_local_rank;
  so.world_size = world_size;
  so.master_addr = addr;
  so.master_port = port;
  so.grace = std::chrono::milliseconds(2000);
  return so;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

class ProcessRanksRunner final : public ModelRunner {
 public:
  ~ProcessRanksRunner() override {
    // The followers' links close below on purpose: the watcher must not take that for a death,
    // nor the supervisor their exits (status 0 on kQuit) for failures.
    watch_stop_ = true;
    followers_may_exit_ = true;
    if (watcher_.joinable()) watcher_.join();
    const bool quit = health().ok();
    if (quit) {
      for (int r = 1; r < links_.size && r < static_cast<int>(links_.peers.size()); ++r) {
        if (links_.peers[static_cast<size_t>(r)].valid()) {
          (void)SendMessage(links_.peers[static_cast<size_t>(r)].fd(), kQuit, 0, {}, Clock::now() + std::chrono::seconds(2));
        }
      }
    }
    // The receiver takes the logits of any step still in flight (the followers run every command
    // before kQuit; a dead rank ends its receive at once) before rank 0's shard ends.
    StopLogitsReceiver();
    // Rank 0's shard ends while the followers end theirs (an NCCL communicator's teardown may
    // wait for its peers'); the links stay for the followers' goodbyes. No abort from the
    // supervisor reaches a communicator being destroyed.
    {
      std::lock_guard<std::mutex> lock(comms_mu_);
      comms_live_ = false;
    }
    self_.Release();
    // The followers exit 0 on kQuit and the supervisor returns by itself; any still running
    // after a short wait are stopped (SIGTERM, then SIGKILL).
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (quit) cv_.wait_for(lock, std::chrono::seconds(5), [&] { return supervisor_done_; });
    }
    stop_ = true;
    if (supervisor_.joinable()) supervisor_.join();
  }

  static Result<std::unique_ptr<ModelRunner>> Create(const ModelSource& source, const RunnerOptions& o) {
    auto r = std::unique_ptr<ProcessRanksRunner>(new ProcessRanksRunner());
    r->links_.rank = 0;
    const int world = World(o);
    r->links_.size = world;
    r->links_.peers.resize(static_cast<size_t>(world));
    r->links_.timeout = std::chrono::milliseconds(o.rank_timeout_ms);
    // Multi-node: the master port, on every interface, where the other nodes' followers come.
    KIMIRT_ASSIGN_OR_RETURN(Socket listener, ListenTcp(o.master_port));
    KIMIRT_ASSIGN_OR_RETURN(const int port, LocalPort(listener));
    r->local_followers_ = o.local_followers < 0 ? world - 1 : std::min(o.local_followers, world - 1);
    if (r->local_followers_ > 0) {
      // This process is local rank 0: rank r of this node takes GPU r.
      SpawnOptions so = FollowerSpawn(o.rank_worker_binary, 1, r->local_followers_, 1, world, "127.0.0.1", port);
      so.stop = &r->stop_;
      // A follower runs until rank 0's kQuit: one that exits before, even with status 0, has
      // failed (the server then fails loudly instead of finding out at its next step).
      so.exit_expected = &r->followers_may_exit_;
      // The supervisor thread lives as long as the followers: PR_SET_PDEATHSIG follows the
      // thread that forked, so they die with it, and with this process.
      r->supervisor_ = std::thread([raw = r.get(), so] {
        Status s = SpawnAndSupervise(so);
        if (!s.ok()) (void)raw->Fail(Internal("process ranks: " + s.message()));
        std::lock_guard<std::mutex> lock(raw->mu_);
        raw->supervisor_done_ = true;
        raw->cv_.notify_all();
      });
    } else {
      r->supervisor_done_ = true;
    }
    int store_port = 0;
    if (UsesStore(o)) {
      KIMIRT_ASSIGN_OR_RETURN(store_port, PickFreePort());
    }
    KIMIRT_RETURN_IF_ERROR(r->AcceptFollowers(listener, source, o, store_port));
    // Rank 0 sets up and loads while the followers do (loading runs collectives).
    Status loaded = r->Local([&]() -> Status {
      KIMIRT_RETURN_IF_ERROR(MakeRankBackend(o, 0, 0, &r->self_));
      if (OnGpus(o)) {
        // Every follower has its GPU before anyone waits in the store or NCCL's init for it: a
        // follower that cannot start says why on its link.
        KIMIRT_RETURN_IF_ERROR(r->AwaitFollowers(kBackendReady, "making its backend"));
        KIMIRT_RETURN_IF_ERROR(JoinNccl(o, 0, "127.0.0.1", store_port, 0, &r->self_));
      } else if (o.pp > 1) {
        KIMIRT_RETURN_IF_ERROR(JoinGroupLinks(o, 0, "127.0.0.1", store_port, "", &r->self_));
      } else {
        r->self_.comm = MakeTcpCommunicator(r->links_);
      }
      {
        // From here a follower's death aborts the load's collectives too.
        std::lock_guard<std::mutex> lock(r->comms_mu_);
        r->comms_live_ = true;
      }
      return LoadRank(source, o, &r->self_);
    });
    if (!loaded.ok()) return r->Fail(loaded);
    KIMIRT_RETURN_IF_ERROR(r->AwaitFollowers(kReady, "loading"));
    if (r->local_followers_ < world - 1) r->watcher_ = std::thread([raw = r.get()] { raw->WatchRemoteFollowers(); });
    r->steps_in_flight_ = runner::StepsInFlight(o);
    r->on_gpus_ = OnGpus(o);
    return std::unique_ptr<ModelRunner>(std::move(r));
  }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  const ModelConfig& config() const override { return self_.model->config(); }
  int64_t kv_blocks_total() const override { return self_.rank.kv->num_blocks(); }
  int64_t kv_blocks_free() const override { return self_.rank.kv->free_blocks(); }
  int64_t kv_blocks_for(int64_t tokens) const override { return self_.rank.kv->BlocksFor(tokens); }

  Handle NewSequence() override {
    const Handle h = next_++;
    (void)Run(kNewSequence, {{h}, {}, {}});
    return h;
  }
  Status Reserve(Handle h, int64_t tokens) override {
    KIMIRT_RETURN_IF_ERROR(Mirror(kReserve, {{h, tokens}, {}, {}}));
    return Local([&] { return self_.rank.Reserve(h, tokens); });
  }
  Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only, ArgmaxRequest* argmax) override {
    KIMIRT_RETURN_IF_ERROR(Mirror(kForward, {{h, last_only ? 1 : 0}, {ids.begin(), ids.end()}, {}}));
    Tensor out;
    KIMIRT_RETURN_IF_ERROR(Local([&]() -> Status {
      KIMIRT_ASSIGN_OR_RETURN(out, self_.rank.Forward(h, ids, last_only, argmax));
      return Status::Ok();
    }));
    return out;
  }
  // Batched decode where the backend keeps rows invariant (CUDA: up to 64 rows; the CPU: 1). Every
  // rank runs the same rows, and the all-reduces sum in rank order whatever their size
  // (NcclCommunicator's default), so a row's bits do not depend on the batch at TP > 1 either.
  // Pipeline stages take the whole step as micro-batches in flight (Model::ForwardDecode).
  int64_t decode_batch_limit() const override { return runner::DecodeBatchLimit(*self_.rank.model); }
  Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids,
                               ArgmaxRequest* argmax) override {
    KIMIRT_RETURN_IF_ERROR(Mirror(kForwardDecode, {{hs.begin(), hs.end()}, {ids.begin(), ids.end()}, {}}));
    Tensor out;
    KIMIRT_RETURN_IF_ERROR(Local([&]() -> Status {
      KIMIRT_ASSIGN_OR_RETURN(out, self_.rank.ForwardDecode(hs, ids, argmax));
      return Status::Ok();
    }));
    return out;
  }
  // Pipeline stages: a step's decode micro-batches and prefill chunks in one flow, named to every
  // rank in one message.
  bool step_in_flight() const override { return self_.rank.model->stage().pp > 1; }
  int64_t graph_replays() const override { return self_.rank.model->graph_replays(); }
  Result<StepLogits> ForwardStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    KIMIRT_RETURN_IF_ERROR(Mirror(kForwardStep, StepMessage(decodes, chunks)));
    StepLogits out;
    KIMIRT_RETURN_IF_ERROR(Local([&]() -> Status {
      KIMIRT_ASSIGN_OR_RETURN(out, self_.rank.ForwardStep(decodes, chunks, true));
      return Status::Ok();
    }));
    return out;
  }
  // Steps in flight (docs/distributed.md "Steps in flight"): the followers run each step's
  // command as ever; rank 0 launches its part and the step's logits are received later. On CPUs
  // the logits receiver, a thread of rank 0's own, takes them from the last stage in submit
  // order, so rank 0 sends step n + 1 on while step n's logits arrive: received only after the
  // next launch, a last stage sending them into a full socket and rank 0 sending step n + 1's
  // state into another would wait for each other. On GPUs (only when asked: runner::StepsInFlight) the
  // logits cross on a communicator and stream of their own (JoinNccl), for the same reason:
  // the launch posts their receives there and CollectStep joins them (Model::CollectStep).
  int steps_in_flight() const override { return steps_in_flight_; }
  Status SubmitStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    if (steps_in_flight_ == 1) return ModelRunner::SubmitStep(decodes, chunks);
    KIMIRT_RETURN_IF_ERROR(Mirror(kForwardStep, StepMessage(decodes, chunks)));
    StepInFlight launched;
    KIMIRT_RETURN_IF_ERROR(Local([&]() -> Status {
      KIMIRT_ASSIGN_OR_RETURN(launched, self_.rank.LaunchStep(decodes, chunks, true));
      return Status::Ok();
    }));
    std::lock_guard<std::mutex> lock(logits_mu_);
    if (!on_gpus_ && !logits_receiver_.joinable()) logits_receiver_ = std::thread([this] { ReceiveLogits(); });
    to_receive_.push_back(std::move(launched));
    logits_cv_.notify_all();
    return Status::Ok();
  }
  Result<StepLogits> CollectStep() override {
    if (steps_in_flight_ == 1) return ModelRunner::CollectStep();
    if (on_gpus_) {
      // The receives were posted at launch on the logits' own stream (JoinNccl): the collect
      // joins them, waiting for nothing of a later step.
      if (to_receive_.empty()) return Internal("CollectStep without a step in flight");
      const StepInFlight step = std::move(to_receive_.front());
      to_receive_.pop_front();
      StepLogits logits;
      KIMIRT_RETURN_IF_ERROR(Local([&]() -> Status {
        logits = self_.rank.CollectStep(step);
        return Status::Ok();
      }));
      return logits;
    }
    std::unique_lock<std::mutex> lock(logits_mu_);
    if (to_receive_.empty() && received_.empty()) return Internal("CollectStep without a step in flight");
    logits_cv_.wait(lock, [&] { return !received_.empty(); });
    Result<StepLogits> out = std::move(received_.front());
    received_.pop_front();
    return out;
  }
  void Release(Handle h) override { (void)Run(kRelease, {{h}, {}, {}}); }

  int kv_block_size() const override { return self_.rank.kv->block_size(); }
  KvCacheDType kv_cache_dtype() const override { return self_.rank.kv->dtype(); }
  std::vector<int32_t> BlockTable(Handle h) const override { return self_.rank.seqs.at(h).blocks; }
  int32_t kv_block_refs(int32_t b) const override { return self_.rank.kv->refs(b); }
  void RetainBlocks(std::span<const int32_t> blocks) override {
    (void)Run(kRetainBlocks, {{}, {blocks.begin(), blocks.end()}, {}});
  }
  void ReleaseBlocks(std::span<const int32_t> blocks) override {
    (void)Run(kReleaseBlocks, {{}, {blocks.begin(), blocks.end()}, {}});
  }
  void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t tokens) override {
    (void)Run(kSharePrefix, {{h, tokens}, {blocks.begin(), blocks.end()}, {}});
  }
  SnapshotId SnapshotKda(Handle h) override {
    const SnapshotId id = next_snapshot_++;
    (void)Run(kSnapshotKda, {{h, id}, {}, {}});
    return id;
  }
  void RestoreKda(Handle h, SnapshotId id) override { (void)Run(kRestoreKda, {{h, id}, {}, {}}); }
  void DropKdaSnapshot(SnapshotId id) override { (void)Run(kDropKdaSnapshot, {{id}, {}, {}}); }
  uint64_t kda_snapshot_bytes() const override { return self_.sizes.snapshot_bytes; }
  int64_t kda_snapshot_capacity() const override { return self_.sizes.snapshots; }

 private:
  ProcessRanksRunner() = default;

  // Records the first failure (the runner stays failed) and returns it. Any thread: the rank's
  // own, the supervisor's (a follower died), the remote followers' watcher. Rank 0's
  // communicators are aborted, so a step waiting on a dead rank inside NCCL (the host does not
  // see that wait) ends at once instead of at the collective's timeout.
  Status Fail(const Status& s) {
    Status first;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.ok()) failed_ = s;
      first = failed_;
    }
    cv_.notify_all();  // a FailLink waiting for the supervisor's word
    std::lock_guard<std::mutex> lock(comms_mu_);
    if (comms_live_) self_.AbortCollectives(first.message());
    return first;
  }

  // A link to a follower broke (a send, a receive or a collective on it failed). The rank at its
  // other end may not be the one that died: a pipeline stage exits when the stage before it dies,
  // and rank 0 may hear from it first. The supervisor, told within its 20 ms poll, names the rank
  // that died, so its word is awaited briefly and, recorded first, is the runner's failure.
  Status FailLink(const Status& s) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(1), [&] { return !failed_.ok() || supervisor_done_; });
    }
    return Fail(s);
  }

  // Each follower's next frame, which must be `op` (an error frame carries its failure).
  Status AwaitFollowers(uint32_t op, const std::string& what) {
    const Deadline d = links_.deadline();
    for (int k = 1; k < links_.size; ++k) {
      Result<FrameHeader> h = RecvHeader(links_.peers[static_cast<size_t>(k)].fd(), k, what, d);
      if (!h.ok()) return FailLink(h.status());
      if (h->op != op) {
        return Fail(Internal("rank " + std::to_string(k) + " sent op " + std::to_string(h->op) + " while " + what));
      }
    }
    return Status::Ok();
  }

  Status AcceptFollowers(const Socket& listener, const ModelSource& source, const RunnerOptions& o, int store_port) {
    const Deadline end = links_.deadline();
    const int world = World(o);
    for (int accepted = 0; accepted < world - 1;) {
      KIMIRT_RETURN_IF_ERROR(health());  // a follower that could not start
      if (Clock::now() >= end) {
        const Result<int> port = LocalPort(listener);
        std::vector<int> missing;
        for (int k = 1; k < world; ++k) {
          if (!links_.peers[static_cast<size_t>(k)].valid()) missing.push_back(k);
        }
        return Fail(IoError("process ranks: rank" + std::string(missing.size() > 1 ? "s " : " ") + RankList(missing) +
                            " of " + std::to_string(world) + " did not connect to rank 0 (port " +
                            std::to_string(port.ok() ? *port : 0) + ") within " +
                            std::to_string(o.rank_timeout_ms) + " ms"));
      }
      Result<Socket> s = AcceptTcp(listener, std::min(end, Clock::now() + std::chrono::milliseconds(200)));
      if (!s.ok()) continue;  // timed out this slice: check the supervisor again
      Result<FrameHeader> h = RecvHeader(s->fd(), -1, "the hello", end);
      if (!h.ok()) return Fail(h.status());
      const int k = static_cast<int>(h->aux);
      Result<Message> hello = h->op == kHello ? RecvPayload(s->fd(), *h, end) : Result<Message>(Corrupt("not a hello"));
      if (!hello.ok() || hello->a.size() != 1 || k < 1 || links_.peers[static_cast<size_t>(std::min(k, world - 1))].valid()) {
        return Fail(Internal("process ranks: a bad hello (op " + std::to_string(h->op) + ", rank " + std::to_string(k) + ")"));
      }
      // Each node's command line says the world: one that disagrees would deadlock later.
      if (hello->a[0] != world || k >= world) {
        return Fail(InvalidArgument("process ranks: rank " + std::to_string(k) + " was started in a run of " +
                                    std::to_string(hello->a[0]) + " ranks, but rank 0 serves -tp " +
                                    std::to_string(o.tp) + (o.pp > 1 ? " -pp " + std::to_string(o.pp) : "") +
                                    " (every node must be given the same -tp and -pp)"));
      }
      links_.peers[static_cast<size_t>(k)] = std::move(*s);
      ++accepted;
    }
    const Message opts = OptionsMessage(source, o, store_port);
    for (int k = 1; k < world; ++k) {
      Status s = SendMessage(links_.peers[static_cast<size_t>(k)].fd(), kOptions, 0, opts, end);
      if (!s.ok()) return Fail(Internal("process ranks: sending rank " + std::to_string(k) + " its options: " + s.message()));
    }
    return Status::Ok();
  }

  // Sends the command to every follower, in call order; an error (the runner's first, or a
  // follower whose link is gone) instead of sending when the group is already broken.
  Status Mirror(uint32_t op, const Message& m) {
    KIMIRT_RETURN_IF_ERROR(health());
    const Deadline d = links_.deadline();
    for (int k = 1; k < links_.size; ++k) {
      Status s = SendMessage(links_.peers[static_cast<size_t>(k)].fd(), op, 0, m, d);
      if (!s.ok()) return FailLink(Internal("rank " + std::to_string(k) + " failed or died: " + s.message()));
    }
    return Status::Ok();
  }

  // Runs rank 0's part; a collective that fails (a follower died or failed) throws, which fails
  // the runner through FailLink (the supervisor's word first).
  // A step that ran while its collectives were aborted (the supervisor's word, or the NCCL
  // watchdog's) returns without an error, but its outputs are not the step's: it fails too.
  template <typename F>
  Status Local(F&& f) {
    try {
      Status s = f();
      if (std::string why = self_.Aborted(); s.ok() && !why.empty()) return Fail(Internal(why));
      return s;
    } catch (const std::exception& e) {
      return FailLink(Internal(e.what()));
    }
  }

  // A command whose result rank 0 does not report: mirrored, then applied here too (rank 0's
  // own bookkeeping stays right even once the group has failed).
  Status Run(uint32_t op, const Message& m) {
    Status sent = Mirror(op, m);
    Status local = Local([&]() -> Status { return Apply(self_.rank, op, m).status(); });
    return sent.ok() ? local : sent;
  }

  // The logits receiver's loop: each submitted step's logits (Model::CollectStep), in order,
  // until the runner ends and nothing is left to receive. A receive that fails (a rank died)
  // fails the runner, and its step's collect returns the error.
  void ReceiveLogits() {
    for (;;) {
      StepInFlight step;
      {
        std::unique_lock<std::mutex> lock(logits_mu_);
        logits_cv_.wait(lock, [&] { return !to_receive_.empty() || logits_stop_; });
        if (to_receive_.empty()) return;
        step = to_receive_.front();
      }
      StepLogits logits;
      const Status s = Local([&]() -> Status {
        logits = self_.rank.CollectStep(step);
        return Status::Ok();
      });
      std::lock_guard<std::mutex> lock(logits_mu_);
      to_receive_.pop_front();  // only now: CollectStep's "no step in flight" check sees it until then
      received_.push_back(s.ok() ? Result<StepLogits>(std::move(logits)) : Result<StepLogits>(s));
      logits_cv_.notify_all();
    }
  }
  void StopLogitsReceiver() {
    {
      std::lock_guard<std::mutex> lock(logits_mu_);
      logits_stop_ = true;
      logits_cv_.notify_all();
    }
    if (logits_receiver_.joinable()) logits_receiver_.join();
  }

  // Followers started on other nodes (ranks local_followers_ + 1 ..) have no supervisor here: a
  // link that closes while no command runs (their process or node died) fails the runner, as the
  // supervisor does for the local ones. During a command the collective sees it first.
  void WatchRemoteFollowers() {
    const int first = local_followers_ + 1;
    std::vector<pollfd> fds;
    for (int k = first; k < links_.size; ++k) fds.push_back({links_.peers[static_cast<size_t>(k)].fd(), POLLRDHUP, 0});
    while (!watch_stop_ && health().ok()) {
      if (poll(fds.data(), fds.size(), 200) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
        // A follower that failed sends its message before it exits; let the command that
        // reads it report it first.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (watch_stop_) return;
        (void)Fail(Internal("process ranks: rank " + std::to_string(first + static_cast<int>(i)) +
                            " (started on another node) closed its link to rank 0: its process or its node's "
                            "launcher died"));
        return;
      }
    }
  }

  StarLinks links_;
  int local_followers_ = 0;
  std::atomic<bool> watch_stop_{false};
  std::thread watcher_;
  LoadedRank self_;  // after links_: its TCP communicator (CPU) uses them
  Handle next_ = 0;
  SnapshotId next_snapshot_ = 0;
  int steps_in_flight_ = 1;
  bool on_gpus_ = false;

  // Steps in flight: the logits receiver, the steps it has still to receive (oldest first) and
  // the logits it received and CollectStep has not taken.
  std::thread logits_receiver_;
  std::mutex logits_mu_;
  std::condition_variable logits_cv_;
  std::deque<StepInFlight> to_receive_;
  std::deque<Result<StepLogits>> received_;
  bool logits_stop_ = false;

  std::atomic<bool> stop_{false};
  std::atomic<bool> followers_may_exit_{false};  // SpawnOptions::exit_expected: set as the runner ends
  std::thread supervisor_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status failed_;
  bool supervisor_done_ = false;
  // Fail's abort (any thread) reaches self_'s communicators only between Create having made them
  // (before the load's collectives) and the destructor releasing them; nothing reassigns them in
  // between. A rank dying during NCCL's init is seen by the init's own deadline.
  std::mutex comms_mu_;
  bool comms_live_ = false;
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}

// Fault injection for the tests of a rank dying inside a step (docs/distributed.md "Faults
// inside a step"): KIMIRT_FAULT_RANK_DIES_IN_STEP=<rank>:<n> makes that follower kill itself
// (SIGKILL, as an OOM kill or a crashed node would) on receiving its n-th model step (Forward,
// ForwardDecode, ForwardStep; from 1), after rank 0 has sent the step and before this rank
// joins its collectives. 0: never.
int FaultStepFor(int rank) {
  const char* v = std::getenv("KIMIRT_FAULT_RANK_DIES_IN_STEP");
  int who = -1, n = 0;
  if (v == nullptr || std::sscanf(v, "%d:%d", &who, &n) != 2 || who != rank || n < 1) return 0;
  return n;
}

bool IsModelStep(uint32_t op) { return op == kForward || op == kForwardDecode || op == kForwardStep; }

// On GPUs a follower waits for its peers inside NCCL, where the host does not see rank 0 die (a
// collective would wait for it until the watchdog's timeout): this thread watches rank 0's link
// while the follower runs and aborts the rank's communicators when the link closes. Rank 0 closes
// it when it dies or ends a failed run; after a normal kQuit the follower has stopped using its
// communicators. On CPUs the collectives read that link and see it close themselves.
class RootLinkWatch {
 public:
  RootLinkWatch(int fd, int rank, LoadedRank& self)
      : thread_([this, fd, rank, &self] {
          pollfd p{fd, POLLRDHUP, 0};
          while (!stop_) {
            if (poll(&p, 1, 100) <= 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
            self.AbortCollectives("rank " + std::to_string(rank) +
                                  ": rank 0 closed its link (it died or ended the run) while this rank was in a step");
            return;
          }
        }) {}
  ~RootLinkWatch() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A follower's life after it connected: options, load, ready, then commands until kQuit.
Status ServeFollower(StarLinks& links, const std::string& master_addr, const char* local_rank) {
  const int fd = links.to_root().fd();
  const Deadline start = Clock::now() + std::chrono::minutes(5);
  KIMIRT_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(fd, 0, "waiting for the options", start));
  if (h.op != kOptions) return Corrupt("rank-worker: expected the options, got op " + std::to_string(h.op));
  KIMIRT_ASSIGN_OR_RETURN(Message m, RecvPayload(fd, h, start));
  KIMIRT_ASSIGN_OR_RETURN(const FollowerOptions fo, OptionsFrom(m));
  links.timeout = std::chrono::milliseconds(fo.o.rank_timeout_ms);
  const uint32_t me = static_cast<uint32_t>(links.rank);
  LoadedRank self;
  if (OnGpus(fo.o)) {
    KIMIRT_ASSIGN_OR_RETURN(const int device, RankCudaDevice(links.rank, local_rank, VisibleCudaDevices()));
    KIMIRT_RETURN_IF_ERROR(MakeRankBackend(fo.o, links.rank, device, &self));
    // As in rank 0 (CreateProcessRanksRunner): a follower started by torchrun / srun / mpirun
    // did not come through our spawner, which sets it for the others.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    KIMIRT_RETURN_IF_ERROR(SendFrame(fd, FrameHeader{kBackendReady, me, 0}, nullptr, 0, links.deadline()));
    KIMIRT_RETURN_IF_ERROR(JoinNccl(fo.o, links.rank, master_addr, fo.store_port, device, &self));
  } else {
    SetCpuBackendThreads(fo.o.follower_cpu_threads);
    KIMIRT_RETURN_IF_ERROR(MakeRankBackend(fo.o, links.rank, 0, &self));
    if (fo.o.pp > 1) {
      KIMIRT_RETURN_IF_ERROR(JoinGroupLinks(fo.o, links.rank, master_addr, fo.store_port, LocalHost(links.to_root()), &self));
    } else {
      self.comm = MakeTcpCommunicator(links);
    }
  }
  KIMIRT_RETURN_IF_ERROR(LoadRank(fo.source, fo.o, &self));
  KIMIRT_RETURN_IF_ERROR(SendFrame(fd, FrameHeader{kReady, me, 0}, nullptr, 0, links.deadline()));
  std::optional<RootLinkWatch> watch;  // joined before `self` ends
  if (OnGpus(fo.o)) watch.emplace(fd, links.rank, self);
  const int die_at_step = FaultStepFor(links.rank);
  for (int steps = 0;;) {
    // A server may idle for days between commands; rank 0's death closes the link at once.
    const Deadline idle = Clock::now() + std::chrono::hours(24 * 365);
    KIMIRT_ASSIGN_OR_RETURN(h, RecvHeader(fd, 0, "waiting for a command", idle));
    KIMIRT_ASSIGN_OR_RETURN(m, RecvPayload(fd, h, links.deadline()));
    if (IsModelStep(h.op) && ++steps == die_at_step) raise(SIGKILL);
    KIMIRT_ASSIGN_OR_RETURN(const bool more, Apply(self.rank, h.op, m));
    if (!more) return Status::Ok();
  }
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreateProcessRanksRunner(const ModelSource& source, const RunnerOptions& o) {
  if (World(o) < 2) return InvalidArgument("process ranks need 2 or more ranks (-tp × -pp)");
  if (o.device == "cuda") {
    // Everything a rank would find missing is checked here, before any process starts.
    if (!CudaBackendBuilt()) return MakeBackend(o.device).status();  // says it is not built
    if (!NcclCommunicatorBuilt()) {
      return Unsupported("-tp " + std::to_string(o.tp) + (o.pp > 1 ? " -pp " + std::to_string(o.pp) : "") +
                         " --device cuda needs NCCL, which this kimirt was built "
                         "without (configure with -DKIMIRT_CUDA=ON where nccl.h and libnccl are found)");
    }
    // This host's ranks only: across nodes, the others check their own GPUs.
    KIMIRT_RETURN_IF_ERROR(CheckGpusForRanks(o.local_followers < 0 ? World(o) : 1 + o.local_followers, VisibleCudaDevices()));
    if (RanksShareGpu() && o.pp > 2) {
      return InvalidArgument("KIMIRT_RANKS_SHARE_GPU=1 runs -pp 2 at most (its sends and receives are the pair's "
                             "all-gathers: groups of two only)");
    }
    // NVLink multicast stays off in every process of the group (issue 15 item 5): the followers
    // get it from the spawner; rank 0 is this process, before its NCCL init. Forced, not
    // defaulted, so that all ranks agree.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
  } else if (o.device != "cpu") {
    return MakeBackend(o.device).status();  // an unknown device, named
  }
  // The followers load the directory (or config) rank 0 names, from their own working directory
  // (another node's, across nodes): an absolute path.
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(path, ec);
    return ec || path.empty() ? path : abs.string();
  };
  ModelSource abs = source;
  abs.dir = absolute(source.dir);
  abs.config_path = absolute(source.config_path);
  return ProcessRanksRunner::Create(abs, o);
}

int RunProcessRankWorker(const FollowerStart& start) {
  StarLinks links;
  links.rank = start.rank;
  links.size = start.world_size;
  links.peers.resize(1);
  const std::string local_rank = std::to_string(start.local_rank);
  Status st = [&]() -> Status {
    const Deadline connect = Clock::now() + std::chrono::milliseconds(start.connect_timeout_ms);
    Result<Socket> link = ConnectTcp(start.master_addr, start.master_port, connect);
    if (!link.ok()) {
      return link.status().WithContext("rank " + std::to_string(start.rank) + " could not reach rank 0 at " +
                                       start.master_addr + ":" + std::to_string(start.master_port) + " within " +
                                       std::to_string(start.connect_timeout_ms) + " ms");
    }
    links.peers[0] = std::move(*link);
    Message hello;
    hello.a = {start.world_size};  // rank 0 checks it against its own -tp
    KIMIRT_RETURN_IF_ERROR(SendMessage(links.to_root().fd(), kHello, static_cast<uint32_t>(links.rank), hello,
                                       Clock::now() + std::chrono::minutes(1)));
    try {
      return ServeFollower(links, start.master_addr, start.local_rank < 0 ? nullptr : local_rank.c_str());
    } catch (const std::exception& e) {
      return Internal(e.what());
    }
  }();
  if (st.ok()) return 0;
  std::fprintf(stderr, "kimirt rank-worker: rank %d: %s\n", links.rank, st.message().c_str());
  SendErrorFrame(links, st.message());
  return 1;
}

int RunProcessRankWorker() {
  FollowerStart start;
  start.rank = EnvInt("RANK", -1);
  start.world_size = EnvInt("WORLD_SIZE", -1);
  start.local_rank = EnvInt("LOCAL_RANK", -1);
  const char* addr = std::getenv("MASTER_ADDR");
  start.master_port = EnvInt("MASTER_PORT", -1);
  start.connect_timeout_ms = EnvInt("KIMIRT_RANK_CONNECT_TIMEOUT_MS", 60000);
  if (start.rank < 1 || start.world_size <= start.rank || addr == nullptr || start.master_port <= 0 ||
      start.connect_timeout_ms <= 0) {
    std::fprintf(stderr, "kimirt rank-worker: started without RANK >= 1, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
                         "(it is started by `kimirt serve --distributed-executor-backend mp`, not by hand)\n");
    return 2;
  }
  start.master_addr = addr;
  return RunProcessRankWorker(start);
}

Status RunFollowerNode(const LaunchEnv& env, int connect_timeout_ms, const std::atomic<bool>* stop) {
  SpawnOptions so = FollowerSpawn("/proc/self/exe", env.first_rank, env.local_world_size, 0, env.world_size,
                                  env.master_addr, env.master_port);
  so.node_rank = env.node_rank;
  so.extra_env = {{"KIMIRT_RANK_CONNECT_TIMEOUT_MS", std::to_string(connect_timeout_ms)}};
  so.stop = stop;
  return SpawnAndSupervise(so);
}

}  // namespace kimirt
