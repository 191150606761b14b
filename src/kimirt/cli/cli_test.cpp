// Drives the `kimirt` binary the way a user does: good input prints the seed's numbers, bad
// input (a broken checkpoint, config or flag) exits non-zero with a message naming the problem
// and never crashes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/cli/prefill_chunk_flag.h"
#include "kimirt/testing/run_command.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/builtin_model.h"

namespace {

namespace fs = std::filesystem;
using CmdResult = kimirt::testing::CommandResult;

// Runs `kimirt ARGS` with optional environment assignments (`env`, e.g. "XDG_CACHE_HOME=/x").
// `output` holds stdout and stderr.
CmdResult Kimirt(const std::string& args, const std::string& env = "") {
  return kimirt::testing::RunCommand(env + (env.empty() ? "" : " ") + std::string(KIMIRT_BINARY) + " " +
                                     args + " 2>&1");
}

std::string Shared(const std::string& rel) { return kimirt::testing::TestDataPath(rel); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FILE(Shared("fixtures/tiny-a/config.json"));
    dir_ = ::testing::TempDir() + "kimirt_cli_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    // A valid two-shard checkpoint to break in each test.
    CmdResult r = Kimirt("make-checkpoint --quiet --random --seed 1 --shards 2 --config " +
                   Shared("fixtures/tiny-a/config.json") + " --out " + dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Shard(int k) const {
    return dir_ + "/model-0000" + std::to_string(k) + "-of-00002.safetensors";
  }
  std::string ReadAll(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void WriteAll(const std::string& path, const std::string& bytes) const {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  // Replaces the first `from` inside the JSON header of shard k by `to` (same length, so every
  // offset stays valid and only the edited field is wrong).
  void EditHeader(int k, const std::string& from, const std::string& to) const {
    ASSERT_EQ(from.size(), to.size());
    std::string b = ReadAll(Shard(k));
    const size_t at = b.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    b.replace(at, from.size(), to);
    WriteAll(Shard(k), b);
  }
  CmdResult Plan() const { return Kimirt("plan --model " + dir_); }
  void ExpectFailure(const CmdResult& r, const std::string& needle) const {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "wanted \"" << needle << "\" in:\n" << r.output;
  }

  std::string dir_;
};

TEST_F(CliTest, ValidCheckpointPlans) {
  CmdResult r = Plan();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("390 tensors"), std::string::npos) << r.output;
}

TEST_F(CliTest, TruncatedShard) {
  std::string b = ReadAll(Shard(2));
  WriteAll(Shard(2), b.substr(0, b.size() / 2));
  ExpectFailure(Plan(), "model-00002-of-00002.safetensors");
}

TEST_F(CliTest, ShorterThanTheLengthPrefix) {
  WriteAll(Shard(1), "abc");
  ExpectFailure(Plan(), "model-00001-of-00002.safetensors");
}

TEST_F(CliTest, HeaderLengthBeyondTheFile) {
  std::string b = ReadAll(Shard(1));
  b.replace(0, 8, std::string("\xff\xff\xff\x7f\x00\x00\x00\x00", 8));
  WriteAll(Shard(1), b);
  ExpectFailure(Plan(), "model-00001-of-00002.safetensors");
}

TEST_F(CliTest, InvalidHeaderJson) {
  EditHeader(1, "\"dtype\"", "\"dtype'");
  ExpectFailure(Plan(), "model-00001-of-00002.safetensors");
}

TEST_F(CliTest, UnknownDtype) {
  EditHeader(1, "\"BF16\"", "\"XF16\"");
  ExpectFailure(Plan(), "XF16");
}

TEST_F(CliTest, BytesDoNotMatchShape) {
  EditHeader(1, "\"shape\":[512,64]", "\"shape\":[512,63]");
  ExpectFailure(Plan(), "[512, 63]");
}

TEST_F(CliTest, MissingShard) {
  fs::remove(Shard(2));
  ExpectFailure(Plan(), "model-00002-of-00002.safetensors");
}

TEST_F(CliTest, CheckpointOfAnotherConfig) {
  fs::copy_file(Shared("fixtures/tiny-b/config.json"), dir_ + "/config.json",
                fs::copy_options::overwrite_existing);
  ExpectFailure(Plan(), "does not match its config");
}

TEST_F(CliTest, MissingTensor) {
  // Remove one tensor from the index and rename it in its shard: the checkpoint is self-consistent
  // but lacks a tensor the config implies.
  const std::string name = "language_model.model.norm.weight";
  std::string idx = ReadAll(dir_ + "/model.safetensors.index.json");
  for (int k : {1, 2}) {
    std::string b = ReadAll(Shard(k));
    if (b.find(name) == std::string::npos) continue;
    b.replace(b.find(name), name.size(), "language_model.model.norm.weighX");
    WriteAll(Shard(k), b);
  }
  idx.replace(idx.find(name), name.size(), "language_model.model.norm.weighX");
  WriteAll(dir_ + "/model.safetensors.index.json", idx);
  CmdResult r = Plan();
  ExpectFailure(r, "1 missing (language_model.model.norm.weight)");
  EXPECT_NE(r.output.find("1 unexpected (language_model.model.norm.weighX)"), std::string::npos) << r.output;
}

TEST_F(CliTest, WrongConfigField) {
  std::string cfg = ReadAll(dir_ + "/config.json");
  cfg.replace(cfg.find("\"hidden_size\": 64"), 17, "\"hidden_size\": -1");
  WriteAll(dir_ + "/config.json", cfg);
  ExpectFailure(Plan(), "text_config.hidden_size");
}

TEST_F(CliTest, BadFlagsAreUsageErrors) {
  CmdResult r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " --kv-cache-dtype int3");
  ExpectFailure(r, "--kv-cache-dtype");
  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " --gpu tpu9");
  ExpectFailure(r, "unknown GPU");
  r = Kimirt("plan --frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown flag --frobnicate"), std::string::npos);
  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " -tp");
  EXPECT_EQ(r.exit_code, 2);
  r = Kimirt("nonsense");
  EXPECT_EQ(r.exit_code, 2);
  // Devices: an unknown one, a bad memory fraction, `generate` beyond one GPU, and more CUDA
  // ranks than any host has GPUs (the first rank without one named; in a build without CUDA it
  // says that instead; either way nothing starts).
  auto refused = [&](const std::string& args, const std::string& needle) {
    const CmdResult c = Kimirt(args);
    EXPECT_NE(c.exit_code, 0) << args;
    EXPECT_NE(c.output.find(needle), std::string::npos) << "wanted \"" << needle << "\" in:\n" << c.output;
  };
  refused("serve --device tpu --port 0", "--device: expected cpu or cuda");
  // Random weights: a config needs them asked for, and names one model only.
  const std::string cfg = Shared("fixtures/tiny-a/config.json");
  refused("serve --config " + cfg + " --port 0", "add --random-weights (or --load-format dummy)");
  refused("serve --config " + cfg + " --model " + dir_ + " --random-weights --port 0", "not both");
  refused("serve --load-format pickle --port 0", "--load-format: expected auto, safetensors or dummy");
  refused("serve --random-weights --port 0", "--random-weights needs --config FILE");
  refused("bench model --config " + cfg, "--config needs --random-weights");
  refused("serve --device cuda --gpu-memory-utilization 1.5 --port 0", "--gpu-memory-utilization must be in (0, 1]");
  const std::string no_gpu = "needs CUDA device " + std::to_string(kimirt::VisibleCudaDevices()) + " (its local rank)";
  refused("generate --device cuda --tp 64 --model " + dir_ + " --ids 1,2",
          kimirt::CudaBackendBuilt() ? no_gpu : "built without the CUDA backend");
  refused("generate --distributed-executor-backend ray --tp 2 --model " + dir_ + " --ids 1,2",
          "--distributed-executor-backend must be threads or mp");
  refused("bench model --device cuda -tp 64 --model " + dir_,
          kimirt::CudaBackendBuilt() ? no_gpu : "built without the CUDA backend");
  // Pipeline stages: more than the layers, none, and more CUDA ranks (tp × pp) than GPUs.
  const std::string tiny = Shared("fixtures/tiny-a");
  refused("bench model -pp 7 --model " + tiny, "-pp 7: must be between 1 and the 6 layers");
  refused("serve -pp 0 --port 0", "-tp and -pp must be >= 1");
  refused("serve --prefill-chunk -5 --port 0", "--prefill-chunk: expected a positive token count");
  refused("bench model --prefill-chunk -1 --model " + tiny, "--prefill-chunk: expected a positive token count");
  refused("bench model --device cuda -tp 2 -pp 32 --model " + tiny,
          kimirt::CudaBackendBuilt() ? no_gpu : "built without the CUDA backend");
}

// --prefill-chunk 0 (the default) is the device's chunk; a given one is kept.
TEST(CliFlags, PrefillChunkDefaultsByDevice) {
  EXPECT_EQ(kimirt::ResolvePrefillChunk(0, "cpu").value(), 256);
  EXPECT_EQ(kimirt::ResolvePrefillChunk(0, "cuda").value(), 1024);
  EXPECT_EQ(kimirt::ResolvePrefillChunk(64, "cuda").value(), 64);
  EXPECT_FALSE(kimirt::ResolvePrefillChunk(-1, "cpu").ok());
  // What bench model ran with is in its JSON.
  const std::string json = testing::TempDir() + "/bench-model-chunk.json";
  const CmdResult r = Kimirt("bench model --model " + Shared("fixtures/tiny-a") +
                             " --batch-sizes 1 --prompt-len 9 --decode-tokens 2 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"prefill_chunk\": 256"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"communicator\": \"none\""), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"cuda_graphs\": false"), std::string::npos) << text.str();
}

// bench model -pp 3 on thread ranks: three stages of tiny-a run the engine end to end.
TEST(CliModel, BenchModelRunsPipelineStages) {
  const CmdResult r = Kimirt("bench model -pp 3 --model " + Shared("fixtures/tiny-a") +
                             " --batch-sizes 1,2 --prompt-len 9 --decode-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TP1 PP3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("communicator threads"), std::string::npos) << r.output;
}

TEST_F(CliTest, SeedCommandLinePrintsTheSeedTotals) {
  // Both spellings of the seed's flags (ATOM uses --kv_cache_dtype and serves with
  // --no-enable_prefix_caching: no KDA snapshots).
  CmdResult r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") +
                 " -tp 8 --gpu mi355x --context 1048576 --kv_cache_dtype fp8 --no-enable_prefix_caching");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* n : {"205.057 GB", "15.491 GB", "205.401 GiB", "71.3%", "82.599 GiB", "FITS"}) {
    EXPECT_NE(r.output.find(n), std::string::npos) << n;
  }
  EXPECT_EQ(r.output.find("KDA prefix snapshots"), std::string::npos);
  // With prefix caching (serve's default) its snapshots are a row of their own: 126 of
  // 69 x 841,728 bytes = 7.318 GB (plan_test.cpp has the arithmetic), in the total.
  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " -tp 8 --gpu mi355x --context 1048576 --kv-cache-dtype fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* n : {"KDA prefix snapshots", "7.318 GB", "22.809 GB", "FITS"}) {
    EXPECT_NE(r.output.find(n), std::string::npos) << n << " missing from:\n" << r.output;
  }
  // The latent projections split over the ranks: "Other" drops from 11.231 to 2.959 GB
  // (plan_test.cpp has the arithmetic) and says where they went.
  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " -tp 8 --shard-latent-moe");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* n : {"2.959 GB", "196.784 GB", "LatentMoE down column / up row parallel"}) {
    EXPECT_NE(r.output.find(n), std::string::npos) << n << " missing from:\n" << r.output;
  }
  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + " -tp 8 --gpu h200 --kv-cache-dtype fp8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"fits\": false"), std::string::npos);
  EXPECT_NE(r.output.find("\"smallest_fit\""), std::string::npos);
}

// issue 17's command: the most K3 layers that fit 8 × H200 at TP8 with the seed's serving settings
// at a 128K context; the written config plans to the same per-GPU total as the fit printed.
TEST(CliPlan, FitLayersWritesTheCutConfig) {
  const std::string out = ::testing::TempDir() + "kimirt_fit_" + std::to_string(::getpid()) + ".json";
  const std::string settings = " --gpu h200 -tp 8 --kv-cache-dtype fp8 --max-model-len 131072 --max-num-seqs 64"
                               " --gpu-memory-utilization 0.93";
  CmdResult r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + settings + " --fit-layers --write-config " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* n : {"Layer fit:", "Chosen: 36 layers (27 KDA + 9 MLA, 3 AttnRes blocks of 12)", "Why not 48",
                        "121.039 GiB", "wrote " }) {
    EXPECT_NE(r.output.find(n), std::string::npos) << n << " missing from:\n" << r.output;
  }
  CmdResult again = Kimirt("plan --config " + out + settings);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("36 layers (27 KDA + 9 MLA)"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("121.039 GiB"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("note: ignoring unknown config key"), std::string::npos) << again.output;
  std::remove(out.c_str());

  r = Kimirt("plan --config " + Shared("configs/kimi-k3.json") + settings + " --fit-layers --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"next_layers\": 48"), std::string::npos) << r.output;
}

// A cut config is a model like any other: make-checkpoint writes it and generate loads and runs it.
// tiny-a (6 layers, AttnRes blocks of 2, MLA layers 4-6): with 16 × 4,096 tokens of latent on a
// 0.015 GiB GPU the first 4 layers fit (7.5 MiB) and all 6 do not (18.4 MiB).
TEST(CliPlan, FitLayersCutLoadsAndGenerates) {
  const std::string dir = ::testing::TempDir() + "kimirt_fit_tiny_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  CmdResult r = Kimirt("plan --config " + Shared("fixtures/tiny-a/config.json") +
                       " --gpu-mem-gib 0.015 --max-model-len 4096 --max-num-seqs 16 --no-enable-prefix-caching"
                       " --fit-layers --write-config " + dir + "/config.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Chosen: 4 layers (3 KDA + 1 MLA, 2 AttnRes blocks of 2)"), std::string::npos) << r.output;
  r = Kimirt("make-checkpoint --quiet --random --seed 1 --config " + dir + "/config.json --out " + dir + "/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Kimirt("generate --model " + dir + "/ckpt --ids 1,2,3 --max-tokens 4 --ignore-eos");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("decode 3 tokens"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(CliPlan, FitLayersBadInputsAreNamed) {
  const std::string k3 = Shared("configs/kimi-k3.json");
  CmdResult r = Kimirt("plan --config " + k3 + " -tp 8 --gpu-mem-gib 16 --fit-layers");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("even the smallest cut, 12 layers"), std::string::npos) << r.output;
  r = Kimirt("plan --config " + k3 + " -tp 8 --fit-layers");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("needs a GPU"), std::string::npos) << r.output;
  r = Kimirt("plan --model " + ::testing::TempDir() + " --gpu h200 --fit-layers");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fit-layers cuts a config"), std::string::npos) << r.output;
  r = Kimirt("plan --config " + k3 + " --gpu h200 --write-config /tmp/x.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("add --fit-layers"), std::string::npos) << r.output;
  r = Kimirt("plan --config " + k3 + " -tp 8 --gpu h200 --fit-layers --write-config /nonexistent-dir/x.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write /nonexistent-dir/x.json"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(CliModel, GenerateReproducesTheReferenceGreedyContinuation) {
  KIMIRT_REQUIRE_FILE(Shared("fixtures/tiny-a/goldens.safetensors"));
  // tiny-a prompt1 and its 24-token greedy_fp32 continuation (fixtures/tiny-a/README.md).
  const std::string ids = "422,53,217,295,453,382,482";
  const std::string want =
      "16,207,473,268,451,25,205,486,194,208,245,403,0,416,235,189,489,184,503,57,194,238,96,360";
  // Also with the routed experts split by id (8 experts: 4 or 2 whole ones a rank), in pipeline
  // stages, and with the ranks as processes (the runner serve uses: generate_command.cpp).
  for (const char* tp : {"1", "2", "2 --enable-expert-parallel", "4 --enable-expert-parallel", "1 -pp 3",
                         "2 -pp 2 --distributed-executor-backend mp", "4 --shard-latent-moe",
                         "2 --shard-latent-moe --distributed-executor-backend mp"}) {
    CmdResult r = Kimirt("generate --model " + Shared("fixtures/tiny-a") + " --ids " + ids +
                         " --max-tokens 24 --ignore-eos --tp " + tp);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // stdout holds the ids (stderr, interleaved by the pipe, the timing line).
    EXPECT_NE(r.output.find(want + "\n"), std::string::npos) << "tp " << tp << ":\n" << r.output;
  }
}

TEST(CliModel, ExpertParallelOverADegreeThatDoesNotDivideTheExpertsFails) {
  KIMIRT_REQUIRE_FILE(Shared("fixtures/tiny-a/config.json"));
  CmdResult r = Kimirt("generate --model " + Shared("fixtures/tiny-a") + " --ids 1,2 --tp 3 --enable-expert-parallel");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("expert parallelism over 3 ranks: the 8 routed experts do not split evenly"),
            std::string::npos)
      << r.output;
}

TEST(CliModel, LogitsWritesEveryPosition) {
  KIMIRT_REQUIRE_FILE(Shared("fixtures/tiny-b/goldens.safetensors"));
  const std::string out = ::testing::TempDir() + "kimirt_logits_" + std::to_string(::getpid()) + ".safetensors";
  CmdResult r = Kimirt("logits --model " + Shared("fixtures/tiny-b") + " --ids 1,2,3,999 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("logits [4, 1000]"), std::string::npos) << r.output;
  EXPECT_GT(fs::file_size(out), 4u * 1000 * 4);  // 16,000 bytes of F32 logits plus the header
  EXPECT_LT(fs::file_size(out), 4u * 1000 * 4 + 200);
  fs::remove(out);
  r = Kimirt("logits --model " + Shared("fixtures/tiny-b") + " --ids 1,1000 --out " + out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("token id 1000 is outside the vocabulary"), std::string::npos) << r.output;
  r = Kimirt("generate --model " + Shared("fixtures/tiny-b") + " --ids 1,x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("\"x\" is not a token id"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// The built-in model's tokenizer through the CLI (XDG_CACHE_HOME keeps the test's copy private).
CmdResult KimirtBuiltin(const std::string& args) {
  return Kimirt(args, "XDG_CACHE_HOME=" + ::testing::TempDir() + "kimirt_cli_cache");
}

TEST(CliTokenizer, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Natalia sold 48 clips in April, and half as many in May.";
  CmdResult ids = KimirtBuiltin("tokenize \"" + text + "\"");
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  const std::string list = ids.output.substr(0, ids.output.find('\n'));
  EXPECT_NE(list.find(','), std::string::npos) << list;
  CmdResult back = KimirtBuiltin("detokenize " + list);
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_EQ(back.output, text + "\n");
  // Special-token strings are plain text unless allowed (spec §10.3).
  CmdResult plain = KimirtBuiltin("tokenize \"<|open|>\"");
  CmdResult special = KimirtBuiltin("tokenize --allow-special \"<|open|>\"");
  EXPECT_EQ(special.output, "4099\n");  // base vocabulary 4096 + 3 (K3's offset, spec §10.2)
  EXPECT_NE(plain.output, special.output);
  EXPECT_EQ(KimirtBuiltin("detokenize 1,x").exit_code, 2);
  EXPECT_EQ(KimirtBuiltin("detokenize 999999").exit_code, 2);
}

TEST(CliTokenizer, ChatRequestsRenderWithTheK3Markers) {
  const std::string path = ::testing::TempDir() + "kimirt_chat_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"messages": [{"role": "user", "content": "What is 2+2?"}],
                             "chat_template_kwargs": {"thinking": false}})";
  CmdResult ids = KimirtBuiltin("tokenize --chat " + path);
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  CmdResult text = KimirtBuiltin("detokenize " + ids.output.substr(0, ids.output.find('\n')));
  EXPECT_EQ(text.output,
            "<|open|>message role=\"user\"<|sep|>What is 2+2?<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>\n");
  std::ofstream(path) << R"({"messages": [{"role": "wizard", "content": "hi"}]})";
  CmdResult bad = KimirtBuiltin("tokenize --chat " + path);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("role"), std::string::npos) << bad.output;
  fs::remove(path);
}

}  // namespace

namespace {

// A `kimirt serve ARGS --port 0` run: its log, and the body of a greedy /v1/completions of
// `prompt` (4 tokens). The server is stopped with SIGTERM and must say it stopped.
struct ServeRun {
  std::string log;
  std::string body;
};
ServeRun ServeAndComplete(const std::string& args, const std::string& prompt) {
  ServeRun run;
  const std::string log = ::testing::TempDir() + "kimirt_serve_" + std::to_string(::getpid()) + ".log";
  const std::string cmd = "XDG_CACHE_HOME=" + ::testing::TempDir() + "kimirt_cli_cache timeout 120 " +
                          std::string(KIMIRT_BINARY) + " serve " + args + " --port 0 > " + log + " 2>&1 & echo $!";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return run;
  char pid_text[32] = {0};
  const bool started = fgets(pid_text, sizeof(pid_text), p) != nullptr;
  pclose(p);
  EXPECT_TRUE(started);
  if (!started) return run;
  auto read_log = [&] {
    std::ifstream in(log);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    run.log = read_log();
    const size_t at = run.log.find("listening on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(run.log.c_str() + at + 30);
  }
  EXPECT_GT(port, 0) << run.log;
  if (port > 0) {
    // Python's urllib is the HTTP client every CI machine of ours has (curl may be missing).
    const std::string request =
        "python3 -c \"import urllib.request as u; print(u.urlopen(u.Request('http://127.0.0.1:" +
        std::to_string(port) + "/v1/completions', data=b'{\\\"prompt\\\": \\\"" + prompt +
        "\\\", \\\"max_tokens\\\": 4, \\\"temperature\\\": 0}', headers={'Content-Type': 'application/json'}), "
        "timeout=60).read().decode())\"";
    const kimirt::testing::CommandResult reply = kimirt::testing::RunCommand(request);
    EXPECT_EQ(reply.exit_code, 0) << reply.output;  // not ASSERT: the server below must be stopped
    run.body = reply.output;
  }
  (void)std::system(("kill -TERM " + std::string(pid_text)).c_str());
  // Running until its /proc entry is gone or a zombie (nothing may reap it where PID 1 does not).
  const std::string stat = "/proc/" + std::to_string(std::atoi(pid_text)) + "/stat";
  auto running = [&] {
    std::ifstream in(stat);
    std::string pid, comm, state;
    return static_cast<bool>(in >> pid >> comm >> state) && state != "Z";
  };
  for (int i = 0; i < 300 && running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  run.log = read_log();
  EXPECT_NE(run.log.find("kimirt serve: stopped"), std::string::npos) << run.log;
  fs::remove(log);
  return run;
}

// The "text" of a completion body.
std::string CompletionText(const std::string& body) {
  const size_t at = body.find("\"text\":");
  return at == std::string::npos ? std::string() : body.substr(at, body.find("\"logprobs\"", at) - at);
}

// The seed's ATOM command line, program name aside, must be accepted as written (issue
// "Engine and OpenAI-compatible server" item 5). The built-in model has 8 heads and a 32K context,
// so it really runs: 8 tensor-parallel CPU ranks, FP8 latent cache, 16K max model length.
TEST(CliServe, TheSeedsCommandLineServesAsWritten) {
  const ServeRun run = ServeAndComplete(
      "--kv_cache_dtype fp8 -tp 8 --trust-remote-code --max-model-len 16384 --max-num-seqs 64"
      " --max-num-batched-tokens 10240 --gpu-memory-utilization 0.93 --block-size 128 --no-enable_prefix_caching",
      "Natalia sold clips");
  EXPECT_NE(run.log.find("on 8 CPU ranks"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("(fp8)"), std::string::npos) << run.log;
  EXPECT_NE(run.body.find("\"completion_tokens\":4"), std::string::npos) << run.body;
}

// `serve --config FILE --load-format dummy --seed N` (random weights made at load, the built-in
// tokenizer) on two process ranks answers exactly as the built-in model, whose checkpoint on disk
// make-checkpoint --random wrote from the same config and seed (builtin_model.cpp: 20261130).
TEST(CliServe, RandomWeightsFromAConfigAnswerAsTheirCheckpoint) {
  const ServeRun disk = ServeAndComplete("--cpu-memory-gib 0.2", "Natalia sold clips");
  // The directory serve used (the same cache).
  const kimirt::Result<std::string> dir = kimirt::EnsureBuiltinModel(::testing::TempDir() + "kimirt_cli_cache/kimirt");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string seed = std::to_string(kimirt::kBuiltinWeightsSeed);
  const ServeRun made = ServeAndComplete("--config " + *dir + "/config.json --load-format dummy --seed " + seed +
                                             " -tp 2 --distributed-executor-backend mp --cpu-memory-gib 0.2",
                                         "Natalia sold clips");
  EXPECT_NE(made.log.find("(random weights, seed " + seed + ") loaded"), std::string::npos) << made.log;
  // Served under the config's directory name.
  const std::string name = fs::path(*dir).filename().string();
  EXPECT_NE(made.body.find("\"model\":\"" + name + "\""), std::string::npos) << made.body;
  ASSERT_FALSE(CompletionText(disk.body).empty()) << disk.body;
  EXPECT_EQ(CompletionText(made.body), CompletionText(disk.body)) << made.body << "\n" << disk.body;
}

}  // namespace
