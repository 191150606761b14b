// `kimirt serve`: the OpenAI-compatible server. Accepts the seed's ATOM command line verbatim
// (program name aside): --model DIR --kv_cache_dtype fp8 -tp 8 --trust-remote-code
// --max-model-len 16384 --max-num-seqs 64 --max-num-batched-tokens 10240
// --gpu-memory-utilization 0.93 --block-size 128 --no-enable_prefix_caching.
// Without --model it serves the built-in demo model (tools/builtin_model.h).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/cli/commands.h"
#include "kimirt/cli/dtype_flag.h"
#include "kimirt/cli/flags.h"
#include "kimirt/engine/engine.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/server/openai_server.h"
#include "kimirt/tokenizer/tokenizer.h"
#include "kimirt/tools/builtin_model.h"

namespace kimirt {
namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

int Fail(const Status& s, int code = 1) {
  std::fprintf(stderr, "kimirt serve: %s\n", s.message().c_str());
  return code;
}

}  // namespace

int RunServeCommand(int argc, char** argv) {
  std::string model_dir, host = "127.0.0.1", served_name, device = "cpu", kv_dtype = "auto";
  int tp = 1, port = 8000, block_size = 128, threads = 0, max_num_seqs = 64, max_batched = 10240;
  int prefill_chunk = 256, max_waiting = 1024;
  int64_t max_model_len = 0;
  double gpu_util = 0.9, cpu_mem_gib = 2.0;
  bool prefix_caching = false;
  FlagSet f("serve",
            "OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health,\n"
            "/metrics). Without --model it serves the built-in demo model.");
  f.String("model", &model_dir, "model directory (config.json, safetensors, tiktoken.model)");
  f.String("served-model-name", &served_name, "the model name clients use (default: the directory name)");
  f.String("host", &host, "address to bind");
  f.Int("port", &port, "port to bind (0: any free port; the bound one is printed)");
  f.String("device", &device, "cpu or cuda (one GPU; a build with -DKIMIRT_CUDA=ON)");
  f.Int("tp,tensor-parallel-size", &tp, "tensor-parallel ranks (CPU: threads)");
  f.String("kv-cache-dtype", &kv_dtype, "latent cache dtype: auto (cuda: bf16, cpu: f32), f32, bf16, fp8");
  std::string dtype = "auto";
  f.String("dtype", &dtype, "GEMM weights on the device: auto (cuda: bfloat16, cpu: float32), float32, bfloat16");
  f.Int("max-model-len", &max_model_len, "prompt + output tokens per request (0: the model's maximum)");
  f.Int("max-num-seqs", &max_num_seqs, "sequences running at once");
  f.Int("max-num-batched-tokens", &max_batched, "tokens forwarded per engine step");
  f.Int("block-size", &block_size, "latent cache block size in tokens");
  f.Int("prefill-chunk", &prefill_chunk, "fixed prefill chunk (keeps outputs independent of the load)");
  f.Int("max-waiting", &max_waiting, "queued requests before new ones get 429");
  f.Double("gpu-memory-utilization", &gpu_util, "fraction of GPU memory to use (--device cuda)");
  f.Double("cpu-memory-gib", &cpu_mem_gib, "memory for the latent cache on --device cpu");
  f.Int("threads", &threads, "CPU threads for GEMMs (0: all cores)");
  f.Bool("enable-prefix-caching", &prefix_caching, "not supported: prefix caching cannot recover KDA state");
  f.Ignored("trust-remote-code", false, "kimirt runs no model code from the checkpoint");
  std::string forced;
  f.String("test-forced-completion", &forced,
           "testing only: every request generates this text (special-token names allowed), then EOS");
  if (Status s = f.Parse(argc, argv, 2, nullptr); !s.ok()) return Fail(s, 2);
  if (f.help_requested()) {
    std::fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (prefix_caching) {
    return Fail(Unsupported("--enable-prefix-caching: the KDA recurrent state of a cached prefix cannot be "
                            "recovered from the latent cache (ATOM disables it too); use --no-enable-prefix-caching"),
                2);
  }
  if (device != "cpu" && device != "cuda") return Fail(InvalidArgument("--device: expected cpu or cuda, got \"" + device + "\""), 2);
  if (!(cpu_mem_gib > 0)) return Fail(InvalidArgument("--cpu-memory-gib must be positive"), 2);
  // auto: the checkpoint's own precision on the GPU (vLLM's auto), the reference precision on CPU.
  KvCacheDType kv = device == "cuda" ? KvCacheDType::kBF16 : KvCacheDType::kF32;
  if (kv_dtype != "auto") {
    std::optional<KvCacheDType> parsed = ParseKvCacheDType(kv_dtype);
    if (!parsed) return Fail(InvalidArgument("--kv-cache-dtype: expected auto, f32, bf16 or fp8, got \"" + kv_dtype + "\""), 2);
    kv = *parsed;
  }
  if (!(gpu_util > 0 && gpu_util <= 1)) return Fail(InvalidArgument("--gpu-memory-utilization must be in (0, 1]"), 2);
  if (device == "cpu" && f.WasSet("gpu-memory-utilization")) {
    std::fprintf(stderr, "kimirt serve: note: --gpu-memory-utilization applies to --device cuda; the CPU "
                         "latent cache is sized by --cpu-memory-gib\n");
  }
  SetCpuBackendThreads(threads);

  if (model_dir.empty()) {
    Result<std::string> dir = EnsureBuiltinModel();
    if (!dir.ok()) return Fail(dir.status());
    model_dir = *dir;
    if (served_name.empty()) served_name = kBuiltinModelName;
  }
  if (served_name.empty()) served_name = DefaultServedModelName(model_dir);

  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  Result<DType> matrix_dtype = ParseDtypeFlag(dtype, device);
  if (!matrix_dtype.ok()) return Fail(matrix_dtype.status(), 2);
  RunnerOptions ro;
  ro.device = device;
  ro.matrix_dtype = *matrix_dtype;
  ro.tp = tp;
  ro.block_size = block_size;
  ro.kv_cache_dtype = kv;
  ro.kv_cache_bytes = static_cast<uint64_t>(cpu_mem_gib * 1073741824.0);
  if (device == "cuda") ro.gpu_memory_utilization = gpu_util;  // the cache is in GPU memory there
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(model_dir, ro);
  if (!runner.ok()) return Fail(runner.status());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineOptions eo;
  eo.max_num_seqs = max_num_seqs;
  eo.max_num_batched_tokens = max_batched;
  eo.max_model_len = max_model_len;
  eo.prefill_chunk = std::min(prefill_chunk, max_batched);
  eo.max_waiting = max_waiting;
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
               model_dir.c_str(), load_s, tp, device == "cuda" ? "CUDA" : "CPU", tp > 1 ? "s" : "",
               static_cast<long long>((*runner)->kv_blocks_total()),
               block_size, static_cast<long long>(tokens), std::string(KvCacheDTypeName(kv)).c_str(),
               static_cast<double>(tokens) / static_cast<double>(used.max_model_len),
               static_cast<long long>(used.max_model_len), used.max_num_seqs);

  ServerOptions so;
  so.host = host;
  so.port = port;
  so.served_model_name = served_name;
  so.max_model_len = used.max_model_len;
  Result<std::unique_ptr<Server>> server = Server::Create(so, **engine, **tokenizer, (*runner)->config().family);
  if (!server.ok()) return Fail(server.status());
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
  if (Status s = (*server)->Start(); !s.ok()) return Fail(s);
  std::printf("kimirt serve: listening on http://%s:%d (model \"%s\")\n", host.c_str(), (*server)->port(),
              served_name.c_str());
  std::fflush(stdout);
  while (g_signal.load() == 0 && (*server)->serving()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool died = g_signal.load() == 0;
  if (died) {
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
