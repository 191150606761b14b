// ProcessRanksRunner (process_ranks_runner.h). Wire format on each rank-0 <-> follower link:
// FrameHeader{op, aux, n} + n payload bytes, where a command's payload is
//   [u64 count of int64 args][u64 count of int32 ids][u64 text bytes][int64 args][int32 ids][text].
// Start-up: follower -> Hello(aux = its rank); rank 0 -> Options; both load; follower -> Ready.
// Then rank 0 sends commands; the follower answers only through the collectives the command
// runs (and an error frame if it fails, after which it exits 1).
#include "kimirt/engine/process_ranks_runner.h"

#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/dist/rank_spawner.h"
#include "kimirt/engine/runner_rank.h"
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

// The options a follower needs to load its shard exactly as rank 0 loads its own.
Message OptionsMessage(const std::string& dir, const RunnerOptions& o) {
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
         o.follower_cpu_threads};
  m.text = dir + '\n' + o.device;
  return m;
}

Result<std::pair<std::string, RunnerOptions>> OptionsFrom(const Message& m) {
  const size_t nl = m.text.find('\n');
  if (m.a.size() != 11 || nl == std::string::npos) return Corrupt("rank options: malformed message");
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
  o.device = m.text.substr(nl + 1);
  return std::make_pair(m.text.substr(0, nl), o);
}

// One rank's backend, model and state, loaded with `comm` (rank r of N) — the same on rank 0 and
// on every follower. Members end in reverse: the state before the model before the backend.
struct LoadedRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  Rank rank;
  CacheSizes sizes;
};

Status LoadRank(const std::string& dir, const RunnerOptions& o, Communicator& comm, LoadedRank* out) {
  KIMIRT_ASSIGN_OR_RETURN(out->backend, MakeBackend(o.device));
  LoadOptions lo;
  lo.matrix_dtype = o.matrix_dtype;
  KIMIRT_ASSIGN_OR_RETURN(out->model, Model::Load(dir, *out->backend, comm, lo));
  out->model->set_decode_graphs(!o.enforce_eager);
  KIMIRT_ASSIGN_OR_RETURN(out->sizes, runner::SizeCaches(*out->model, o));
  out->rank.model = out->model.get();
  out->rank.kv = out->model->MakeKvCache(out->sizes.blocks, o.block_size, o.kv_cache_dtype, false);
  out->rank.kda = out->model->MakeKdaStates(runner::kInitialKdaSlots);
  return Status::Ok();
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

class ProcessRanksRunner final : public ModelRunner {
 public:
  ~ProcessRanksRunner() override {
    const bool quit = health().ok();
    if (quit) {
      for (int r = 1; r < links_.size && r < static_cast<int>(links_.peers.size()); ++r) {
        if (links_.peers[static_cast<size_t>(r)].valid()) {
          (void)SendMessage(links_.peers[static_cast<size_t>(r)].fd(), kQuit, 0, {}, Clock::now() + std::chrono::seconds(2));
        }
      }
    }
    // The followers exit 0 on kQuit and the supervisor returns by itself; any still running
    // after a short wait are stopped (SIGTERM, then SIGKILL).
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (quit) cv_.wait_for(lock, std::chrono::seconds(5), [&] { return supervisor_done_; });
    }
    stop_ = true;
    if (supervisor_.joinable()) supervisor_.join();
  }

  static Result<std::unique_ptr<ModelRunner>> Create(const std::string& dir, const RunnerOptions& o) {
    auto r = std::unique_ptr<ProcessRanksRunner>(new ProcessRanksRunner());
    r->links_.rank = 0;
    r->links_.size = o.tp;
    r->links_.peers.resize(static_cast<size_t>(o.tp));
    r->links_.timeout = std::chrono::milliseconds(o.rank_timeout_ms);
    KIMIRT_ASSIGN_OR_RETURN(Socket listener, ListenTcp(0));
    KIMIRT_ASSIGN_OR_RETURN(const int port, LocalPort(listener));
    SpawnOptions so;
    so.argv = {ResolveBinary(o.rank_worker_binary), "rank-worker"};
    so.local_ranks = o.tp - 1;
    so.first_rank = 1;
    so.world_size = o.tp;
    so.master_port = port;
    so.grace = std::chrono::milliseconds(2000);
    so.stop = &r->stop_;
    // The supervisor thread lives as long as the followers: PR_SET_PDEATHSIG follows the
    // thread that forked, so they die with it, and with this process.
    r->supervisor_ = std::thread([raw = r.get(), so] {
      Status s = SpawnAndSupervise(so);
      std::lock_guard<std::mutex> lock(raw->mu_);
      if (!s.ok() && raw->failed_.ok()) raw->failed_ = Internal("process ranks: " + s.message());
      raw->supervisor_done_ = true;
      raw->cv_.notify_all();
    });
    KIMIRT_RETURN_IF_ERROR(r->AcceptFollowers(listener, dir, o));
    // Rank 0 loads while the followers do (loading may run collectives).
    r->comm_ = MakeTcpCommunicator(r->links_);
    Status loaded;
    try {
      loaded = LoadRank(dir, o, *r->comm_, &r->self_);
    } catch (const std::exception& e) {
      loaded = Internal(e.what());
    }
    if (!loaded.ok()) return r->Fail(loaded);
    const Deadline d = r->links_.deadline();
    for (int k = 1; k < o.tp; ++k) {
      Result<FrameHeader> h = RecvHeader(r->links_.peers[static_cast<size_t>(k)].fd(), k, "loading", d);
      if (!h.ok()) return r->Fail(h.status());
      if (h->op != kReady) return r->Fail(Internal("rank " + std::to_string(k) + " sent op " + std::to_string(h->op) + " instead of ready"));
    }
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

  // Records the first failure (the runner stays failed) and returns it.
  Status Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
    return failed_;
  }

  Status AcceptFollowers(const Socket& listener, const std::string& dir, const RunnerOptions& o) {
    const Deadline end = links_.deadline();
    for (int accepted = 0; accepted < o.tp - 1;) {
      KIMIRT_RETURN_IF_ERROR(health());  // a follower that could not start
      if (Clock::now() >= end) {
        return Fail(IoError("process ranks: only " + std::to_string(accepted) + " of " + std::to_string(o.tp - 1) +
                            " follower ranks connected within " + std::to_string(o.rank_timeout_ms) + " ms"));
      }
      Result<Socket> s = AcceptTcp(listener, std::min(end, Clock::now() + std::chrono::milliseconds(200)));
      if (!s.ok()) continue;  // timed out this slice: check the supervisor again
      Result<FrameHeader> h = RecvHeader(s->fd(), -1, "the hello", end);
      if (!h.ok()) return Fail(h.status());
      const int k = static_cast<int>(h->aux);
      if (h->op != kHello || k < 1 || k >= o.tp || links_.peers[static_cast<size_t>(k)].valid()) {
        return Fail(Internal("process ranks: a bad hello (op " + std::to_string(h->op) + ", rank " + std::to_string(k) + ")"));
      }
      links_.peers[static_cast<size_t>(k)] = std::move(*s);
      ++accepted;
    }
    const Message opts = OptionsMessage(dir, o);
    for (int k = 1; k < o.tp; ++k) {
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
      if (!s.ok()) return Fail(Internal("rank " + std::to_string(k) + " failed or died: " + s.message()));
    }
    return Status::Ok();
  }

  // Runs rank 0's part; a collective that fails (a follower died or failed) throws, which fails
  // the runner.
  template <typename F>
  Status Local(F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      return Fail(Internal(e.what()));
    }
  }

  // A command whose result rank 0 does not report: mirrored, then applied here too (rank 0's
  // own bookkeeping stays right even once the group has failed).
  Status Run(uint32_t op, const Message& m) {
    Status sent = Mirror(op, m);
    Status local = Local([&]() -> Status { return Apply(self_.rank, op, m).status(); });
    return sent.ok() ? local : sent;
  }

  StarLinks links_;
  std::unique_ptr<Communicator> comm_;
  LoadedRank self_;  // after comm_: its model ends before the communicator it holds
  Handle next_ = 0;
  SnapshotId next_snapshot_ = 0;

  std::atomic<bool> stop_{false};
  std::thread supervisor_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status failed_;
  bool supervisor_done_ = false;
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}

// A follower's life after it connected: options, load, ready, then commands until kQuit.
Status ServeFollower(StarLinks& links) {
  const int fd = links.to_root().fd();
  const Deadline start = Clock::now() + std::chrono::minutes(5);
  KIMIRT_ASSIGN_OR_RETURN(FrameHeader h, RecvHeader(fd, 0, "waiting for the options", start));
  if (h.op != kOptions) return Corrupt("rank-worker: expected the options, got op " + std::to_string(h.op));
  KIMIRT_ASSIGN_OR_RETURN(Message m, RecvPayload(fd, h, start));
  KIMIRT_ASSIGN_OR_RETURN(auto dir_options, OptionsFrom(m));
  links.timeout = std::chrono::milliseconds(dir_options.second.rank_timeout_ms);
  SetCpuBackendThreads(dir_options.second.follower_cpu_threads);
  std::unique_ptr<Communicator> comm = MakeTcpCommunicator(links);
  LoadedRank self;
  KIMIRT_RETURN_IF_ERROR(LoadRank(dir_options.first, dir_options.second, *comm, &self));
  KIMIRT_RETURN_IF_ERROR(SendFrame(fd, FrameHeader{kReady, static_cast<uint32_t>(links.rank), 0}, nullptr, 0, links.deadline()));
  for (;;) {
    // A server may idle for days between commands; rank 0's death closes the link at once.
    const Deadline idle = Clock::now() + std::chrono::hours(24 * 365);
    KIMIRT_ASSIGN_OR_RETURN(h, RecvHeader(fd, 0, "waiting for a command", idle));
    KIMIRT_ASSIGN_OR_RETURN(m, RecvPayload(fd, h, links.deadline()));
    KIMIRT_ASSIGN_OR_RETURN(const bool more, Apply(self.rank, h.op, m));
    if (!more) return Status::Ok();
  }
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreateProcessRanksRunner(const std::string& dir, const RunnerOptions& o) {
  if (o.device != "cpu") return Unsupported("process ranks run on --device cpu so far (" + o.device + " asked)");
  if (o.tp < 2) return InvalidArgument("process ranks need -tp 2 or more");
  return ProcessRanksRunner::Create(dir, o);
}

int RunProcessRankWorker() {
  StarLinks links;
  links.rank = EnvInt("RANK", -1);
  links.size = EnvInt("WORLD_SIZE", -1);
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = EnvInt("MASTER_PORT", -1);
  if (links.rank < 1 || links.size <= links.rank || addr == nullptr || port <= 0) {
    std::fprintf(stderr, "kimirt rank-worker: started without RANK >= 1, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
                         "(it is started by `kimirt serve --distributed-executor-backend mp`, not by hand)\n");
    return 2;
  }
  links.peers.resize(1);
  Status st = [&]() -> Status {
    KIMIRT_ASSIGN_OR_RETURN(links.peers[0], ConnectTcp(addr, port, Clock::now() + std::chrono::minutes(1)));
    KIMIRT_RETURN_IF_ERROR(SendFrame(links.to_root().fd(), FrameHeader{kHello, static_cast<uint32_t>(links.rank), 0},
                                     nullptr, 0, Clock::now() + std::chrono::minutes(1)));
    try {
      return ServeFollower(links);
    } catch (const std::exception& e) {
      return Internal(e.what());
    }
  }();
  if (st.ok()) return 0;
  std::fprintf(stderr, "kimirt rank-worker: rank %d: %s\n", links.rank, st.message().c_str());
  SendErrorFrame(links, st.message());
  return 1;
}

}  // namespace kimirt
