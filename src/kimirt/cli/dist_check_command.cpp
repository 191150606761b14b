// `kimirt dist-check`: starts a group of ranks the way `serve -tp N --device cuda` will
// (docs/distributed.md) and checks each piece end to end in real processes: the launch
// environment (torchrun / Slurm / OpenMPI variables or --nnodes/--node-rank/--master-addr), the
// spawn and supervision of local ranks, the rendezvous, and with --device cuda the NCCL
// communicator (an exact all-reduce and all-gather on every rank's GPU).
//   kimirt dist-check -tp 2 [--device cuda]              one host: spawns and supervises 2 ranks
//   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=h MASTER_PORT=p kimirt dist-check -tp 2
//                                                        one rank, as torchrun starts it
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/dist/launch_env.h"
#include "kimirt/dist/rank_spawner.h"
#include "kimirt/dist/rendezvous_store.h"
#include "kimirt/parallel/nccl_communicator.h"

namespace kimirt {
namespace {

using Json = nlohmann::json;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

int Fail(const std::string& who, const Status& s) {
  std::fprintf(stderr, "kimirt dist-check: %s%s\n", who.c_str(), s.message().c_str());
  return 1;
}

struct Options {
  std::string device = "cpu";
  double timeout_s = 60;
  int fail_rank = -1;
  int64_t count = 4096;
  bool bench = false;
  bool peer_only = false;
  int64_t width = 2304;  // Kimi-Linear-48B's hidden size: one decode row of a row-parallel output
  std::string json;
};

// Rank 0's table of all-reduce latencies (our batch-invariant forms — NCCL all-gather + sum, and
// the peer all-reduce where the group is on one host — beside ncclAllReduce) for decode batches of
// 1-64 rows, and the JSON for bench/results.
int Bench(RendezvousStore& s, const LaunchEnv& env, const Options& o) {
  const std::vector<int> rows = {1, 8, 32, 64};
  std::vector<size_t> counts;
  for (int r : rows) counts.push_back(static_cast<size_t>(r * o.width));
  Result<std::vector<AllReduceTiming>> t = NcclAllReduceBench(s, env.local_rank, counts, 200);
  if (!t.ok()) return Fail("", t.status());
  if (env.rank != 0) return 0;
  Json j = {{"tp", env.world_size}, {"width", o.width}, {"iters", 200}, {"points", Json::array()}};
  std::printf("all-reduce of rows x %lld floats over %d ranks (us per call, mean of 200)\n", (long long)o.width,
              env.world_size);
  std::printf("%6s %12s %16s %14s %8s %10s %14s %14s\n", "rows", "bytes", "invariant (us)", "ncclAllReduce", "ratio",
              "peer (us)", "ncclAllGather", "peer gather");
  for (size_t i = 0; i < t->size(); ++i) {
    const AllReduceTiming& p = (*t)[i];
    std::printf("%6d %12zu %16.2f %14.2f %8.2f %10.2f %14.2f %14.2f\n", rows[i], p.count * 4, p.invariant_us,
                p.nccl_us, p.invariant_us / p.nccl_us, p.peer_us, p.allgather_nccl_us, p.allgather_peer_us);
    j["points"].push_back({{"rows", rows[i]},
                           {"floats", p.count},
                           {"invariant_allgather_sum_us", p.invariant_us},
                           {"nccl_allreduce_us", p.nccl_us},
                           {"peer_allreduce_us", p.peer_us > 0 ? Json(p.peer_us) : Json(nullptr)},
                           {"nccl_allgather_us", p.allgather_nccl_us},
                           {"peer_allgather_us", p.allgather_peer_us > 0 ? Json(p.allgather_peer_us) : Json(nullptr)}});
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << j.dump(2) << "\n";
    if (!f) return Fail("", IoError(o.json + ": cannot write"));
  }
  return 0;
}

// This process is one rank: join, publish who it is, meet, check NCCL on CUDA, meet again.
int RunRank(const LaunchEnv& env, const Options& o) {
  const std::string who = "rank " + std::to_string(env.rank) + ": ";
  RendezvousOptions ro;
  ro.master_addr = env.master_addr;
  ro.master_port = env.master_port;
  ro.rank = env.rank;
  ro.world_size = env.world_size;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  Result<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Join(ro);
  if (!store.ok()) return Fail(who, store.status());
  if (env.rank == o.fail_rank) {
    std::fprintf(stderr, "kimirt dist-check: rank %d fails on purpose (--fail-rank)\n", env.rank);
    std::fflush(stderr);
    std::_Exit(3);  // no goodbye to the store: the others see a death
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string me = std::string(host) + " pid " + std::to_string(getpid()) + " local rank " +
                         std::to_string(env.local_rank) + " (" + LaunchSourceName(env.source) + ")";
  RendezvousStore& s = **store;
  if (Status st = s.Set("who/" + std::to_string(env.rank), me); !st.ok()) return Fail(who, st);
  if (Status st = s.Barrier("published"); !st.ok()) return Fail(who, st);
  if (env.rank == 0) {
    for (int r = 0; r < env.world_size; ++r) {
      Result<std::string> w = s.Get("who/" + std::to_string(r));
      if (!w.ok()) return Fail(who, w.status());
      std::printf("rank %d: %s\n", r, w->c_str());
    }
    std::fflush(stdout);
  }
  if (o.device == "cuda" && o.peer_only) {
    // Every rank on GPU 0, the peer all-reduce's IPC path without NCCL (which refuses two ranks
    // on one GPU): where only one GPU is lent.
    constexpr int kCalls = 20;
    if (Status st = PeerAllReduceSelfCheck(s, 0, static_cast<size_t>(o.count), kCalls); !st.ok()) return Fail("", st);
    if (env.rank == 0) {
      std::printf("peer all-reduce of %lld floats, %d calls, every rank on GPU 0: exact on every rank\n",
                  (long long)o.count, kCalls);
    }
  } else if (o.device == "cuda") {
    // NcclSelfCheck's errors name the rank already.
    if (Status st = NcclSelfCheck(s, env.local_rank, static_cast<size_t>(o.count)); !st.ok()) return Fail("", st);
    if (env.rank == 0) std::printf("NCCL all-reduce and all-gather of %lld floats: exact on every rank\n", (long long)o.count);
    if (o.bench) {
      if (int rc = Bench(s, env, o); rc != 0) return rc;
    }
  }
  if (Status st = s.Barrier("done"); !st.ok()) return Fail(who, st);
  if (env.rank == 0) std::printf("%d ranks ok\n", env.world_size);
  return 0;
}

}  // namespace

int RunDistCheckCommand(int argc, char** argv) {
  int tp = 1, pp = 1;
  LaunchFlags lf;
  Options o;
  FlagSet flags("dist-check",
                "Starts tp × pp ranks as `serve --device cuda` will (one process per GPU) and checks\n"
                "the launch environment, rank supervision, the rendezvous and (--device cuda) NCCL.");
  flags.Int("tp,tensor-parallel-size", &tp, "tensor-parallel ranks");
  flags.Int("pp,pipeline-parallel-size", &pp, "pipeline stages");
  flags.Int("nnodes", &lf.nnodes, "nodes of the run (this process launches its node's ranks)");
  flags.Int("node-rank", &lf.node_rank, "this node's index in [0, nnodes)");
  flags.String("master-addr", &lf.master_addr, "host of rank 0 (overrides MASTER_ADDR)");
  flags.Int("master-port", &lf.master_port, "rendezvous port on rank 0's host (overrides MASTER_PORT)");
  flags.String("device", &o.device, "cpu (rendezvous only) or cuda (also an NCCL all-reduce)");
  flags.Double("timeout-s", &o.timeout_s, "deadline of each rendezvous step");
  flags.Int("fail-rank", &o.fail_rank, "this rank exits with status 3 after joining (tests the failure path)");
  flags.Int("count", &o.count, "floats in the NCCL check");
  flags.Bool("bench", &o.bench, "with --device cuda: all-reduce latency, invariant form vs ncclAllReduce");
  flags.Bool("peer-only", &o.peer_only,
             "with --device cuda: only the peer all-reduce, every rank on GPU 0 (checks its IPC path on one GPU)");
  flags.Int("width", &o.width, "floats per row in --bench (rows 1, 8, 32, 64)");
  flags.String("json", &o.json, "with --bench: rank 0 writes the timings here");
  if (Status s = flags.Parse(argc, argv, 2, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt dist-check: %s\n", s.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (tp < 1 || pp < 1 || (o.device != "cpu" && o.device != "cuda") || o.timeout_s <= 0 || o.count < 1 ||
      o.width < 1) {
    std::fprintf(stderr, "kimirt dist-check: -tp and -pp must be >= 1, --device cpu or cuda, --timeout-s > 0, "
                         "--count and --width >= 1\n");
    return 2;
  }
  Result<LaunchEnv> env = ResolveLaunchEnv(tp * pp, lf, ProcessEnv());
  if (!env.ok()) return Fail("", env.status());
  if (env->is_rank) return RunRank(*env, o);

  // This process launches its node's ranks: the same command line, with the rank environment.
  SpawnOptions so;
  so.argv = {"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) so.argv.emplace_back(argv[i]);
  so.local_ranks = env->local_world_size;
  so.first_rank = env->first_rank;
  so.world_size = env->world_size;
  so.node_rank = env->node_rank;
  so.master_addr = env->master_addr;
  so.master_port = env->master_port;
  so.stop = &g_stop;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::fprintf(stderr, "kimirt dist-check: node %d of %d (%s) starts ranks %d..%d of %d\n", env->node_rank,
               env->nnodes, LaunchSourceName(env->source), env->first_rank,
               env->first_rank + env->local_world_size - 1, env->world_size);
  if (Status s = SpawnAndSupervise(so); !s.ok()) return Fail("", s);
  return g_stop ? 1 : 0;
}

}  // namespace kimirt
