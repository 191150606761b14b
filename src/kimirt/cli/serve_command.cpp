// `kimirt serve`: the OpenAI-compatible server. Accepts the seed's ATOM command line verbatim
// (program name aside): --model DIR --kv_cache_dtype fp8 -tp 8 --trust-remote-code
// --max-model-len 16384 --max-num-seqs 64 --max-num-batched-tokens 10240
// --gpu-memory-utilization 0.93 --block-size 128 --no-enable_prefix_caching.
// Without --model it serves the built-in demo model (tools/builtin_model.h). --config FILE
// --random-weights (or vLLM's --load-format dummy) serves a config with random weights made at
// load, no checkpoint (model/random_weights.h; --seed picks them), tokenized by the built-in
// tokenizer unless --tokenizer DIR names another. Prefix caching is
// on by default; --no-enable_prefix_caching (the seed's spelling) or --no-enable-prefix-caching
// turns it off (docs/prefix-caching.md).
//
// vLLM drop-in: `kimirt serve MODEL` (positional, as `vllm serve MODEL`), --api-key (or
// $KIMIRT_API_KEY / $VLLM_API_KEY), --seed, --disable-log-requests, --disable-log-stats,
// --enable-auto-tool-choice, --tool-call-parser / --reasoning-parser (kimi_k3: the only parser
// kimirt has, always on for K3 models), --default-chat-template-kwargs, --allowed-origins,
// --log-level.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/cli/commands.h"
#include "kimirt/cli/dtype_flag.h"
#include "kimirt/cli/prefill_chunk_flag.h"
#include "kimirt/cli/flags.h"
#include "kimirt/cli/load_progress.h"
#include "kimirt/dist/launch_env.h"
#include "kimirt/dist/serve_ranks.h"
#include "kimirt/engine/engine.h"
#include "kimirt/engine/kda_snapshot_budget.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/process_ranks_runner.h"
#include "kimirt/model/config.h"
#include "kimirt/server/log.h"
#include "kimirt/server/openai_server.h"
#include "kimirt/tokenizer/tokenizer.h"
#include "kimirt/tools/builtin_model.h"

namespace kimirt {
namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_stop{false};  // the same, for a follower node's supervisor (RunFollowerNode)
void OnSignal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

int Fail(const Status& s, int code = 1) {
  std::fprintf(stderr, "kimirt serve: %s\n", s.message().c_str());
  return code;
}

// --tool-call-parser / --reasoning-parser: vLLM picks a parser per model family; kimirt has the
// K3 one built in. Anything else would silently parse nothing, so it is refused.
Status CheckParserFlag(const char* flag, const std::string& value) {
  if (value.empty() || value == "kimi_k3") return Status::Ok();
  return InvalidArgument(std::string("--") + flag + " \"" + value +
                         "\" is not available: kimirt parses Kimi-K3 output itself; use kimi_k3 (or leave it out)");
}

// --allowed-origins: vLLM's JSON list ('["https://a.example"]'), or a comma-separated list.
Result<std::vector<std::string>> ParseOrigins(const std::string& text) {
  std::vector<std::string> out;
  if (!text.empty() && text.front() == '[') {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) return InvalidArgument("--allowed-origins: not a JSON list: " + text);
    for (const auto& v : j) {
      if (!v.is_string()) return InvalidArgument("--allowed-origins: every origin must be a string: " + text);
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string origin = text.substr(start, comma - start);
    while (!origin.empty() && origin.front() == ' ') origin.erase(origin.begin());
    while (!origin.empty() && origin.back() == ' ') origin.pop_back();
    if (!origin.empty()) out.push_back(origin);
    start = comma + 1;
  }
  return out;
}

// What names a config served with random weights: its file without ".json"
// ("bench/configs/kimi-linear-48b.json" -> "bench/configs/kimi-linear-48b"), or the directory of
// a config.json (DefaultServedModelName keeps the last part).
std::string ConfigName(std::string path) {
  const size_t slash = path.rfind('/');
  if (path.compare(slash == std::string::npos ? 0 : slash + 1, std::string::npos, "config.json") == 0) {
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
  }
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) path.resize(path.size() - 5);
  return path;
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

}  // namespace

int RunServeCommand(int argc, char** argv) {
  std::string model_dir, host = "127.0.0.1", served_name, device = "cpu", kv_dtype = "auto";
  int tp = 1, port = 8000, block_size = 128, threads = 0, max_num_seqs = 64, max_batched = 10240;
  int prefill_chunk = 0, max_waiting = 1024;
  int64_t max_model_len = 0;
  double gpu_util = 0.9, cpu_mem_gib = 2.0;
  bool prefix_caching = true;
  FlagSet f("serve",
            "OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health,\n"
            "/metrics). Without --model it serves the built-in demo model.");
  f.String("model", &model_dir, "model directory (config.json, safetensors, tiktoken.model)");
  std::string config_path, load_format = "auto", tokenizer_dir;
  bool random_weights = false;
  f.String("config", &config_path, "config.json of a model to serve with --random-weights (no checkpoint)");
  f.Bool("random-weights", &random_weights,
         "random weights made at load (each rank its own slices) for --config FILE, or for --model DIR's "
         "config.json; --seed picks them (default 0)");
  f.String("load-format", &load_format, "auto or safetensors: the checkpoint; dummy: --random-weights (vLLM's name)");
  f.String("tokenizer", &tokenizer_dir,
           "directory with tiktoken.model (+ tokenizer_config.json); default: the model directory's, or with "
           "--config the built-in tokenizer");
  f.String("served-model-name", &served_name, "the model name clients use (default: the directory name)");
  f.String("host", &host, "address to bind");
  f.Int("port", &port, "port to bind (0: any free port; the bound one is printed)");
  f.String("device", &device, "cpu or cuda (a build with -DKIMIRT_CUDA=ON; -tp N takes GPUs 0..N-1)");
  f.Int("tp,tensor-parallel-size", &tp, "tensor-parallel ranks (CPU: threads or processes; CUDA: one process per GPU)");
  int pp = 1;
  f.Int("pp,pipeline-parallel-size", &pp,
        "pipeline stages, each -tp ranks holding its share of the layers (docs/distributed.md \"Pipeline "
        "parallelism\"); tp × pp ranks, CUDA: tp × pp GPUs");
  int pp_micro_batches = 0;
  f.Int("pp-micro-batches", &pp_micro_batches,
        "with -pp: micro-batches a decode step splits into, in flight through the stages (0: one per stage; "
        "more where the backend's row invariance needs them, on the CPU one per sequence)");
  int steps_in_flight = 0;
  f.Int("steps-in-flight", &steps_in_flight,
        "with -pp: engine steps in flight, the next entering the first stage while the later stages run this "
        "one (docs/distributed.md \"Steps in flight\"; 0: one per stage, 1: a step at a time); GPUs: 1 unless "
        "asked for more (not yet run on GPUs)");
  bool expert_parallel = false;
  f.Bool("enable-expert-parallel", &expert_parallel,
         "routed experts split by ID over the -tp ranks (each holds E/tp whole) instead of sliced on every rank");
  bool shard_latent_moe = false;
  f.Bool("shard-latent-moe", &shard_latent_moe,
         "LatentMoE's latent projections split over the -tp ranks (down column-, up row-parallel) instead of replicated on each (docs/plan.md \"Weights\")");
  f.String("kv-cache-dtype", &kv_dtype, "latent cache dtype: auto (cuda: bf16, cpu: f32), f32, bf16, fp8");
  std::string dtype = "auto";
  f.String("dtype", &dtype, "GEMM weights on the device: auto (cuda: bfloat16, cpu: float32), float32, bfloat16");
  f.Int("max-model-len", &max_model_len, "prompt + output tokens per request (0: the model's maximum)");
  f.Int("max-num-seqs", &max_num_seqs, "sequences running at once");
  f.Int("max-num-batched-tokens", &max_batched, "tokens forwarded per engine step");
  f.Int("block-size", &block_size, "latent cache block size in tokens");
  f.Int("prefill-chunk", &prefill_chunk,
        "fixed prefill chunk (keeps outputs independent of the load); 0: the device's (cuda 1024, cpu 256)");
  f.Int("max-waiting", &max_waiting, "queued requests before new ones get 429");
  f.Double("gpu-memory-utilization", &gpu_util, "fraction of GPU memory to use (--device cuda)");
  f.Double("cpu-memory-gib", &cpu_mem_gib, "memory for the latent cache on --device cpu");
  f.Int("threads", &threads, "CPU threads for GEMMs (0: all cores)");
  f.Bool("enable-prefix-caching", &prefix_caching,
         "resume prompts from cached prefixes: shared latent blocks + KDA snapshots, bit-identical to no caching "
         "(default on; --no-enable-prefix-caching turns it off; docs/prefix-caching.md)");
  f.Ignored("trust-remote-code", false, "kimirt runs no model code from the checkpoint");
  std::string executor = "threads";
  f.String("distributed-executor-backend", &executor,
           "-tp > 1 on CPU: threads (one process) or mp (one process per rank; docs/distributed.md); "
           "CUDA always runs mp");
  LaunchFlags lf;
  f.Int("nnodes", &lf.nnodes, "nodes of a multi-node run (process ranks; docs/distributed.md \"Multi-node\")");
  f.Int("node-rank", &lf.node_rank, "this node's index in [0, nnodes): node 0 serves HTTP, the others follow");
  f.String("master-addr", &lf.master_addr, "host of rank 0 (node 0), for the other nodes (overrides MASTER_ADDR)");
  f.Int("master-port", &lf.master_port, "port rank 0 listens on for the other nodes' ranks (overrides MASTER_PORT)");
  double rank_timeout_s = 300;
  f.Double("rank-timeout-s", &rank_timeout_s,
           "process ranks: the longest one rank waits for another (to connect, load or finish a step)");
  bool enforce_eager = false;
  f.Bool("enforce-eager", &enforce_eager, "no CUDA graphs: run every decode step op by op (default: graphs)");
  std::string api_key, tool_parser, reasoning_parser, chat_kwargs, origins = "*", log_level = "info";
  int64_t seed = 0;
  bool no_request_log = false, no_stats_log = false, auto_tool_choice = false;
  f.String("api-key", &api_key, "require `Authorization: Bearer KEY` on /v1/* (default: $KIMIRT_API_KEY, $VLLM_API_KEY)");
  f.Int("seed", &seed,
        "base of the seeds of requests that set none (reproducible runs; default: random); with random weights also "
        "their seed (as vLLM's --seed)");
  f.Bool("disable-log-requests", &no_request_log, "no log line per request");
  f.Bool("disable-log-stats", &no_stats_log, "no periodic throughput / queue / cache line");
  f.Bool("enable-auto-tool-choice", &auto_tool_choice,
         "accepted for vLLM command lines: K3 tool calls are always parsed (tool_choice auto)");
  f.String("tool-call-parser", &tool_parser, "kimi_k3 (the built-in K3 parser; the only one)");
  f.String("reasoning-parser", &reasoning_parser, "kimi_k3 (reasoning_content from K3's think channel; the only one)");
  f.String("default-chat-template-kwargs", &chat_kwargs,
           "JSON object under every chat request's chat_template_kwargs, e.g. '{\"thinking\": false}'");
  f.String("allowed-origins", &origins, "CORS origins: a JSON list or comma-separated; \"*\" allows any");
  f.String("log-level", &log_level, "debug, info, warning or error");
  std::string forced;
  f.String("test-forced-completion", &forced,
           "testing only: every request generates this text (special-token names allowed), then EOS");
  std::vector<std::string> positional;
  if (Status s = f.Parse(argc, argv, 2, &positional); !s.ok()) return Fail(s, 2);
  if (f.help_requested()) {
    std::fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (positional.size() > 1) return Fail(InvalidArgument("at most one MODEL argument, got " + std::to_string(positional.size())), 2);
  if (positional.size() == 1) {
    if (!model_dir.empty() && model_dir != positional[0]) {
      return Fail(InvalidArgument("MODEL \"" + positional[0] + "\" and --model \"" + model_dir + "\" disagree"), 2);
    }
    model_dir = positional[0];
  }
  for (const auto& [flag, value] : {std::pair{"tool-call-parser", tool_parser}, {"reasoning-parser", reasoning_parser}}) {
    if (Status s = CheckParserFlag(flag, value); !s.ok()) return Fail(s, 2);
  }
  Result<LogLevel> level = ParseLogLevel(log_level);
  if (!level.ok()) return Fail(level.status(), 2);
  SetLogLevel(*level);
  Result<std::vector<std::string>> allowed = ParseOrigins(origins);
  if (!allowed.ok()) return Fail(allowed.status(), 2);
  if (api_key.empty()) api_key = EnvOr("KIMIRT_API_KEY", EnvOr("VLLM_API_KEY", ""));
  if (device != "cpu" && device != "cuda") return Fail(InvalidArgument("--device: expected cpu or cuda, got \"" + device + "\""), 2);
  if (!(cpu_mem_gib > 0)) return Fail(InvalidArgument("--cpu-memory-gib must be positive"), 2);
  std::optional<KvCacheDType> kv_parsed = KvCacheDTypeFlag(kv_dtype, device);
  if (!kv_parsed) return Fail(InvalidArgument("--kv-cache-dtype: expected auto, f32, bf16 or fp8, got \"" + kv_dtype + "\""), 2);
  const KvCacheDType kv = *kv_parsed;
  if (!(gpu_util > 0 && gpu_util <= 1)) return Fail(InvalidArgument("--gpu-memory-utilization must be in (0, 1]"), 2);
  if (device == "cpu" && f.WasSet("gpu-memory-utilization")) {
    std::fprintf(stderr, "kimirt serve: note: --gpu-memory-utilization applies to --device cuda; the CPU "
                         "latent cache is sized by --cpu-memory-gib\n");
  }
  SetCpuBackendThreads(threads);

  if (load_format == "dummy") {
    random_weights = true;
  } else if (load_format != "auto" && load_format != "safetensors") {
    return Fail(InvalidArgument("--load-format: expected auto, safetensors or dummy, got \"" + load_format + "\""), 2);
  }
  if (!config_path.empty() && !model_dir.empty()) {
    return Fail(InvalidArgument("give --model DIR or --config FILE, not both"), 2);
  }
  if (!config_path.empty() && !random_weights) {
    return Fail(InvalidArgument("--config FILE has no weights: add --random-weights (or --load-format dummy)"), 2);
  }
  if (random_weights && config_path.empty() && model_dir.empty()) {
    return Fail(InvalidArgument("--random-weights needs --config FILE (or --model DIR, for its config.json)"), 2);
  }
  if (model_dir.empty() && config_path.empty()) {
    Result<std::string> dir = EnsureBuiltinModel();
    if (!dir.ok()) return Fail(dir.status());
    model_dir = *dir;
    if (served_name.empty()) served_name = kBuiltinModelName;
  }
  const bool builtin_tokenizer = tokenizer_dir.empty() && model_dir.empty();
  if (tokenizer_dir.empty()) {
    // A config alone has no tokenizer: the built-in one (its ids are a prefix of any Kimi
    // vocabulary's range; ids it does not know decode to nothing).
    if (builtin_tokenizer) {
      Result<std::string> dir = EnsureBuiltinModel();
      if (!dir.ok()) return Fail(dir.status());
      tokenizer_dir = *dir;
    } else {
      tokenizer_dir = model_dir;
    }
  }
  const ModelSource source = random_weights ? ModelSource::RandomWeights(config_path.empty() ? model_dir : config_path,
                                                                         static_cast<uint64_t>(seed))
                                            : ModelSource::Directory(model_dir);
  if (served_name.empty()) served_name = DefaultServedModelName(model_dir.empty() ? ConfigName(config_path) : model_dir);

  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  Result<DType> matrix_dtype = ParseDtypeFlag(dtype, device);
  if (!matrix_dtype.ok()) return Fail(matrix_dtype.status(), 2);
  const Result<int> chunk = ResolvePrefillChunk(prefill_chunk, device);
  if (!chunk.ok()) return Fail(chunk.status(), 2);
  RunnerOptions ro;
  ro.device = device;
  ro.matrix_dtype = *matrix_dtype;
  ro.tp = tp;
  ro.pp = pp;
  ro.pp_micro_batches = pp_micro_batches;
  ro.steps_in_flight = steps_in_flight;
  ro.ep = expert_parallel ? tp : 1;
  ro.shard_latent_moe = shard_latent_moe;
  ro.block_size = block_size;
  ro.kv_cache_dtype = kv;
  ro.kv_cache_bytes = static_cast<uint64_t>(cpu_mem_gib * 1073741824.0);
  // The cache budget pays for KDA snapshots too (docs/prefix-caching.md): a tenth of it, as
  // `kimirt plan` counts them (engine/kda_snapshot_budget.h).
  ro.kda_snapshot_fraction = prefix_caching ? kServeKdaSnapshotFraction : 0.0;
  if (device == "cuda") ro.gpu_memory_utilization = gpu_util;
  ro.enforce_eager = enforce_eager;  // the cache is in GPU memory there
  if (executor != "threads" && executor != "mp") {
    return Fail(InvalidArgument("--distributed-executor-backend must be threads or mp, not \"" + executor + "\""), 2);
  }
  if (tp < 1 || pp < 1) return Fail(InvalidArgument("-tp and -pp must be >= 1"), 2);
  const int world = tp * pp;
  ro.process_ranks = executor == "mp" && world > 1;
  ro.follower_cpu_threads = threads;
  if (!(rank_timeout_s > 0 && rank_timeout_s < 2e6)) return Fail(InvalidArgument("--rank-timeout-s must be in (0, 2e6)"), 2);
  ro.rank_timeout_ms = static_cast<int>(rank_timeout_s * 1000);
  if (ro.process_ranks || (world > 1 && device == "cuda")) {
    // One process per rank: this process may be rank 0 (it serves), another node's launcher, or
    // one follower rank started by torchrun / srun / mpirun (dist/serve_ranks.h).
    Result<LaunchEnv> env = ResolveLaunchEnv(world, lf, ProcessEnv());
    if (!env.ok()) return Fail(env.status(), 2);
    const ServeRanks plan = PlanServeRanks(*env);
    if (plan.role == ServeRole::kFollower) {
      std::fprintf(stderr, "kimirt serve: rank %d of %d (%s): follows rank 0 at %s:%d\n", env->rank, env->world_size,
                   LaunchSourceName(env->source), env->master_addr.c_str(), env->master_port);
      return RunProcessRankWorker(FollowerStart{env->rank, env->world_size, env->local_rank, env->master_addr,
                                                env->master_port, ro.rank_timeout_ms});
    }
    if (plan.role == ServeRole::kNodeLauncher) {
      std::fprintf(stderr, "kimirt serve: node %d of %d (%s) starts ranks %d..%d of %d, following rank 0 at %s:%d\n",
                   env->node_rank, env->nnodes, LaunchSourceName(env->source), env->first_rank,
                   env->first_rank + env->local_world_size - 1, env->world_size, env->master_addr.c_str(),
                   env->master_port);
      std::signal(SIGINT, OnSignal);
      std::signal(SIGTERM, OnSignal);
      if (Status s = RunFollowerNode(*env, ro.rank_timeout_ms, &g_stop); !s.ok()) return Fail(s);
      return g_stop ? 1 : 0;
    }
    ro.master_port = plan.listen_port;
    ro.local_followers = plan.spawn_followers;
    if (env->source != LaunchSource::kLocal) {
      std::fprintf(stderr, "kimirt serve: rank 0 of %d (%s) serves; %d of its ranks start here, the others connect "
                           "to port %d\n", env->world_size, LaunchSourceName(env->source), 1 + plan.spawn_followers,
                   plan.listen_port);
    }
  } else if (lf.nnodes >= 0 || lf.node_rank >= 0 || !lf.master_addr.empty() || lf.master_port >= 0) {
    return Fail(InvalidArgument("--nnodes, --node-rank, --master-addr and --master-port need one process per rank: "
                                "-tp 2 or more with --distributed-executor-backend mp, or --device cuda"), 2);
  }
  const auto t0 = std::chrono::steady_clock::now();
  LoadProgress progress(source.dir);  // nothing to show while random weights are made
  Result<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(source, ro);
  progress.Finish();
  if (!runner.ok()) return Fail(runner.status());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineOptions eo;
  eo.max_num_seqs = max_num_seqs;
  eo.max_num_batched_tokens = max_batched;
  eo.max_model_len = max_model_len;
  eo.prefill_chunk = std::min(chunk.value(), max_batched);
  eo.max_waiting = max_waiting;
  eo.enable_prefix_caching = prefix_caching;
  EngineTestHooks hooks;
  if (!forced.empty()) {
    const std::vector<int32_t> forced_ids = (*tokenizer)->Encode(forced, /*allow_special=*/true);
    hooks = EngineTestHooks::ForcedCompletion(forced_ids, (*runner)->config());
    std::fprintf(stderr, "kimirt serve: TESTING: every request generates a fixed %zu-token completion\n",
                 forced_ids.size());
  }
  Result<std::unique_ptr<Engine>> engine = Engine::Create(**runner, tokenizer->get(), eo, std::move(hooks));
  if (!engine.ok()) return Fail(engine.status());
  const EngineOptions& used = (*engine)->options();
  const int64_t tokens = (*runner)->kv_blocks_total() * block_size;
  std::fprintf(stderr,
               "kimirt serve: %s loaded in %.1f s on %d %s rank%s; latent cache: %lld blocks × %d tokens = %lld "
               "tokens (%s), %.1f requests of max_model_len %lld at once; %d state slots\n",
               source.ToString().c_str(), load_s, world, device == "cuda" ? "CUDA" : "CPU", world > 1 ? "s" : "",
               static_cast<long long>((*runner)->kv_blocks_total()),
               block_size, static_cast<long long>(tokens), std::string(KvCacheDTypeName(kv)).c_str(),
               static_cast<double>(tokens) / static_cast<double>(used.max_model_len),
               static_cast<long long>(used.max_model_len), used.max_num_seqs);

  ServerOptions so;
  so.host = host;
  so.port = port;
  so.served_model_name = served_name;
  so.max_model_len = used.max_model_len;
  so.model_vocab_size = static_cast<int32_t>((*runner)->config().vocab_size);
  so.api_key = api_key;
  so.allowed_origins = *allowed;
  if (f.WasSet("seed")) so.seed = static_cast<uint64_t>(seed);
  so.log_requests = !no_request_log;
  if (no_stats_log) so.stats_interval = std::chrono::milliseconds(0);
  so.default_chat_template_kwargs = chat_kwargs;
  // The built-in tokenizer knows K3's chat markers only: with it, chat is K3-formatted whatever
  // the (random-weight) model's family, so /v1/chat/completions works for any config.
  const ChatFormat format = (*runner)->config().family == ModelFamily::kKimiK3 || builtin_tokenizer
                                ? ChatFormat::kK3
                                : ChatFormat::kKimiLinear;
  Result<std::unique_ptr<Server>> server = Server::Create(so, **engine, **tokenizer, format);
  if (!server.ok()) return Fail(server.status());
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
  if (Status s = (*server)->Start(); !s.ok()) return Fail(s);
  std::printf("kimirt serve: listening on http://%s:%d (model \"%s\")%s\n", host.c_str(), (*server)->port(),
              served_name.c_str(), api_key.empty() ? "" : "; /v1/* need the API key");
  std::fflush(stdout);
  Status health;
  while (g_signal.load() == 0 && (*server)->serving() && (health = (*engine)->Health()).ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const bool died = g_signal.load() == 0;
  if (!health.ok()) {
    // A rank died (process ranks): the group exits, but /health answers 503 for a moment first,
    // so a load balancer polling it sees why before the port closes.
    std::fprintf(stderr, "kimirt serve: the model cannot run: %s; stopping\n", health.message().c_str());
    std::this_thread::sleep_for(std::chrono::seconds(2));
  } else if (died) {
    std::fprintf(stderr, "kimirt serve: the HTTP listener stopped unexpectedly\n");
  } else {
    std::fprintf(stderr, "kimirt serve: signal %d: no new requests; finishing the running ones\n", g_signal.load());
  }
  (*server)->Stop(std::chrono::seconds(30));
  (*engine)->Shutdown(/*drain=*/false);
  std::fprintf(stderr, "kimirt serve: stopped\n");
  return died ? 1 : 0;
}

}  // namespace kimirt
