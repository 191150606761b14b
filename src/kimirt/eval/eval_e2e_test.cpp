// End to end against a scripted OpenAI-compatible server on 127.0.0.1: `eval gsm8k` (both
// endpoints) and `bench serve` (random and gsm8k datasets, a concurrency sweep, Poisson
// arrivals) through the library, then through the `kimirt` binary when it has the commands.
// Every JSON output is checked against the documented schema (report_schema_test_util.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kimirt/eval/bench_plot.h"
#include "kimirt/eval/bench_serve.h"
#include "kimirt/eval/fake_openai_server_test_util.h"
#include "kimirt/eval/gsm8k_eval.h"
#include "kimirt/eval/report_schema_test_util.h"
#include "kimirt/testing/run_command.h"

namespace kimirt::eval {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::FakeOpenAiServer;

// 30 train and 5 test documents; test document K's answer is K + 1.
std::string WriteData() {
  const std::string dir = ::testing::TempDir() + "kimirt_eval_e2e_" + std::to_string(getpid());
  fs::create_directories(dir);
  for (const auto& [name, prefix, n] : {std::tuple<const char*, const char*, int>{"train", "T", 30}, {"test", "E", 5}}) {
    std::ofstream f(dir + "/" + name + ".jsonl");
    for (int i = 0; i < n; ++i) {
      f << Json{{"question", std::string(prefix) + " question " + std::to_string(i) + "?"},
                {"answer", std::string(prefix) + " step <<" + std::to_string(i) + "+1=" + std::to_string(i + 1) + ">>.\n#### " +
                               std::to_string(i + 1)}}
               .dump()
        << "\n";
    }
  }
  return dir;
}

// Scripted answers for test documents 0..4 (gold 1..5):
//   strict-match     1 0 1 0 1   (0.6)
//   flexible-extract 1 1 1 1 0   (0.8)
std::string Script(const Json& body) {
  const std::string prompt =
      body.contains("messages") ? body["messages"].back()["content"].get<std::string>() : body["prompt"].get<std::string>();
  const size_t at = prompt.rfind("E question ");
  const int k = at == std::string::npos ? -1 : prompt[at + 11] - '0';
  switch (k) {
    case 0: return " The answer is 1.\n#### 1";
    case 1: return " She pays $2.";
    case 2: return " It is 1,000 #### 3";
    case 3: return " answer: 4";
    case 4: return " #### 5\nThen 7 more";
    default: return " ?";
  }
}

class EvalE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = WriteData();
    server_.responder = Script;
    Result<Gsm8kData> d = LoadGsm8k(dir_);
    ASSERT_TRUE(d.ok()) << d.status().message();
    data_ = std::move(*d);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Gsm8kEvalOptions EvalOptions() const {
    Gsm8kEvalOptions o;
    o.url = server_.url() + "/v1";
    o.limit = 5;
    o.concurrency = 3;
    o.progress = false;
    return o;
  }

  std::string dir_;
  FakeOpenAiServer server_;
  Gsm8kData data_;
};

TEST_F(EvalE2eTest, Gsm8kCompletionsScoresRequestsAndReport) {
  Result<Gsm8kReport> r = RunGsm8kEval(EvalOptions(), data_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->options.model, "fake-model");  // from GET /v1/models
  EXPECT_EQ(r->failed_requests, 0);
  EXPECT_DOUBLE_EQ(r->strict_match.exact_match, 0.6);
  EXPECT_DOUBLE_EQ(r->flexible_extract.exact_match, 0.8);
  EXPECT_NEAR(r->strict_match.stderr_, std::sqrt(0.3 / 5), 1e-12);
  EXPECT_NEAR(r->flexible_extract.stderr_, std::sqrt(0.2 / 5), 1e-12);

  // What went over the wire is lm-eval's local-completions payload.
  Result<std::vector<Gsm8kPrompt>> prompts = BuildGsm8kPrompts(data_.train, data_.test, 5, 5, 1234, true);
  ASSERT_TRUE(prompts.ok());
  std::vector<Json> bodies = server_.bodies();
  ASSERT_EQ(bodies.size(), 5u);
  for (const Json& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["max_tokens"], 256);
    EXPECT_EQ(b["temperature"], 0.0);
    EXPECT_EQ(b["seed"], 1234);
    EXPECT_EQ(b["stop"], Json::array({"Question:", "</s>", "<|im_end|>"}));
    EXPECT_FALSE(b.contains("stream"));
    const std::string p = b["prompt"];
    bool known = false;
    for (const Gsm8kPrompt& x : *prompts) known = known || x.text == p;
    EXPECT_TRUE(known) << p;
  }

  const Json j = Gsm8kReportToJson(*r);
  testing::ExpectSchema(j, testing::Gsm8kReportSchema());
  ASSERT_EQ(j["samples"].size(), 5u);
  EXPECT_EQ(j["samples"][1]["filters"]["strict-match"]["extracted"], "[invalid]");
  EXPECT_EQ(j["samples"][1]["filters"]["flexible-extract"]["extracted"], "$2.");
  EXPECT_EQ(j["samples"][1]["filters"]["flexible-extract"]["exact_match"], 1);
  EXPECT_EQ(j["samples"][4]["gold"], "5");
  EXPECT_EQ(j["samples"][0]["prompt"], (*prompts)[0].text);
  const std::string table = FormatGsm8kTable(*r);
  EXPECT_NE(table.find("|gsm8k|      3|flexible-extract|     5|exact_match|↑  |0.8000|±  |0.2000|"), std::string::npos) << table;
}

TEST_F(EvalE2eTest, Gsm8kChatSendsFewshotTurns) {
  Gsm8kEvalOptions o = EvalOptions();
  o.endpoint = "chat";
  o.model = "fake-model";
  Result<Gsm8kReport> r = RunGsm8kEval(o, data_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->strict_match.exact_match, 0.6);
  EXPECT_DOUBLE_EQ(r->flexible_extract.exact_match, 0.8);
  for (const Json& b : server_.bodies()) {
    ASSERT_EQ(b["messages"].size(), 11u);  // 5 × (user, assistant) + the question
    EXPECT_EQ(b["messages"][0]["role"], "user");
    EXPECT_EQ(b["messages"][1]["role"], "assistant");
    EXPECT_EQ(b["stop"].size(), 3u);
  }
  const Json j = Gsm8kReportToJson(*r);
  testing::ExpectSchema(j, testing::Gsm8kReportSchema());
  EXPECT_EQ(j["samples"][0]["messages"].size(), 11u);
}

TEST_F(EvalE2eTest, Gsm8kFailedRequestsAreCountedWithTheServersMessage) {
  Gsm8kEvalOptions o = EvalOptions();
  o.model = "no-such-model";
  o.limit = 2;
  Result<Gsm8kReport> r = RunGsm8kEval(o, data_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->failed_requests, 2);
  EXPECT_EQ(r->samples[0].attempts, 1);  // a 4xx is not retried
  EXPECT_NE(r->samples[0].error.find("/v1/completions: HTTP 404: The model `no-such-model` does not exist."),
            std::string::npos)
      << r->samples[0].error;
  EXPECT_DOUBLE_EQ(r->strict_match.exact_match, 0.0);
}

TEST_F(EvalE2eTest, BenchServeRandomSweepMatchesTheScript) {
  BenchServeOptions o;
  o.url = server_.url();
  o.input_len = 16;
  o.output_len = 5;
  o.num_prompts = 6;
  o.sweep_concurrency = {1, 3};
  o.progress = false;
  o.detailed = true;
  Result<BenchServeReport> r = RunBenchServe(o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // The fake tokenizer is not one token per word (w + w/4 + 3), so screening keeps no word and
  // the fitted line plus the walk find the word count it maps to 16 tokens: 11.
  ASSERT_TRUE(r->calibration.performed);
  EXPECT_EQ(r->calibration.words_kept, 0u);
  EXPECT_EQ(r->calibration.probes.back(), std::make_pair(int64_t{11}, int64_t{16}));
  ASSERT_EQ(r->runs.size(), 2u);
  for (const BenchRun& run : r->runs) {
    const BenchMetrics& m = run.metrics;
    EXPECT_EQ(m.completed, 6);
    EXPECT_EQ(m.failed, 0);
    EXPECT_EQ(m.total_input_tokens, 6 * 16);
    EXPECT_EQ(m.total_output_tokens, 6 * 5);
    EXPECT_LE(m.max_concurrent_requests, run.max_concurrency);
    EXPECT_GT(m.ttft.mean, 0);
    // The fake server sleeps 1 ms before each token: 4 gaps span at least ~4 ms in all.
    EXPECT_GT(m.itl.mean, 0.5);
    EXPECT_GT(m.tpot.mean, 0.5);
    // Loopback replies take well under a millisecond; Nagle's algorithm on either side would
    // add Linux's 40 ms delayed ACK to every TTFT (openai_client.cpp sets TCP_NODELAY).
    EXPECT_LT(m.ttft.median, 35);
    for (const RequestRecord& rec : run.records) {
      EXPECT_EQ(rec.itl_s.size(), 4u);  // 5 text chunks
      EXPECT_EQ(rec.text, " w0 w1 w2 w3 w4");
    }
    ASSERT_TRUE(run.has_server_metrics) << run.server_metrics_note;
    EXPECT_DOUBLE_EQ(run.server_ttft.count, 6);  // the server counted exactly this run's streams
    EXPECT_NEAR(run.server_ttft.mean_ms, 2.0, 1e-9);
  }
  for (const Json& b : server_.bodies()) {
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_FALSE(b.contains("temperature"));
    EXPECT_FALSE(b["stream_options"].contains("continuous_usage_stats"));  // only when asked
  }
  const Json j = BenchServeReportToJson(*r);
  testing::ExpectSchema(j, testing::BenchReportSchema());
  testing::ExpectSchema(j["runs"][0]["server_metrics"]["ttft"], testing::ServerHistogramSchema(), "$.runs[0].server_metrics.ttft");
  EXPECT_EQ(j["runs"][1]["input_lens"], Json::array({16, 16, 16, 16, 16, 16}));
  const std::string table = FormatBenchRun(r->runs[0]);
  EXPECT_NE(table.find("Successful requests:                     6"), std::string::npos) << table;
  EXPECT_NE(FormatBenchSweep(*r).find("\n3 "), std::string::npos);
}

TEST_F(EvalE2eTest, BenchServeScreensWordsForExactInputLengths) {
  // A tokenizer with a chat-template-like overhead of 5 tokens that splits three of the words.
  server_.prompt_tokens = [](const std::string& text) {
    std::istringstream in(text);
    std::string w;
    int64_t n = 5;
    while (in >> w) n += (w == "school" || w == "during" || w == "years") ? 2 : 1;
    return n;
  };
  BenchServeOptions o;
  o.url = server_.url();
  o.input_len = 40;
  o.output_len = 2;
  o.range_ratio = 0.5;
  o.num_prompts = 12;
  o.seed = 7;
  o.max_concurrency = 4;
  o.progress = false;
  Result<BenchServeReport> r = RunBenchServe(o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->calibration.words_kept, BenchWordList().size() - 3);
  EXPECT_EQ(r->calibration.fit.intercept, 5);
  EXPECT_EQ(r->calibration.probes.back(), std::make_pair(int64_t{35}, int64_t{40}));
  Result<RandomLengths> lengths = SampleRandomLengths(12, 40, 2, 0.5, 7);
  ASSERT_TRUE(lengths.ok());
  ASSERT_EQ(r->runs.size(), 1u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(r->runs[0].records[i].prompt_tokens, lengths->input[i]) << i;  // exact, every request
    EXPECT_EQ(r->runs[0].records[i].output_tokens, lengths->output[i]) << i;
  }
  EXPECT_GE(*std::min_element(lengths->input.begin(), lengths->input.end()), 20);
  EXPECT_LE(*std::max_element(lengths->input.begin(), lengths->input.end()), 60);
}

TEST_F(EvalE2eTest, BenchServeGsm8kChatWithPoissonArrivals) {
  BenchServeOptions o;
  o.url = server_.url();
  o.endpoint = "chat";
  o.dataset = "gsm8k";
  o.output_len = 3;
  o.num_prompts = 4;
  o.request_rate = 200;
  o.max_concurrency = 2;
  o.ignore_eos = false;
  o.progress = false;
  Result<BenchServeReport> r = RunBenchServe(o, &data_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->runs.size(), 1u);
  EXPECT_EQ(r->runs[0].metrics.completed, 4);
  EXPECT_EQ(r->runs[0].metrics.total_output_tokens, 12);
  // Arrivals follow the seeded schedule, the last at num_prompts / rate.
  EXPECT_NEAR(r->runs[0].records.back().arrival_s, 4.0 / 200, 1e-12);
  std::vector<Json> bodies = server_.bodies();
  ASSERT_FALSE(bodies.empty());
  const Json& last = bodies.back();
  EXPECT_EQ(last["messages"].size(), 1u);
  EXPECT_EQ(last["stream"], true);
  EXPECT_EQ(last["stream_options"]["include_usage"], true);
  EXPECT_FALSE(last.contains("ignore_eos"));
  EXPECT_EQ(last["stop"].size(), 3u);
  testing::ExpectSchema(BenchServeReportToJson(*r), testing::BenchReportSchema());
}

TEST_F(EvalE2eTest, BenchServeFailsFastOnABadModelAndOnSilence) {
  BenchServeOptions o;
  o.url = server_.url();
  o.model = "no-such-model";
  o.input_len = 8;
  o.output_len = 2;
  o.num_prompts = 2;
  o.progress = false;
  o.calibrate = false;
  Result<BenchServeReport> r = RunBenchServe(o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("initial test request failed: POST " + server_.url() +
                                      "/v1/completions (stream): HTTP 404: The model `no-such-model` does not exist."),
            std::string::npos)
      << r.status().message();
  // A server that goes quiet for longer than the read timeout fails the request, naming it.
  server_.token_delay_s = 0.4;
  Result<ServerUrl> url = ParseServerUrl(server_.url());
  ASSERT_TRUE(url.ok());
  HttpOptions http;
  http.read_timeout_s = 0.1;
  OpenAiClient client(*url, http);
  Result<StreamedCompletion> s = client.Stream("completions", {{"model", "fake-model"}, {"prompt", "x"}, {"max_tokens", 1}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/v1/completions (stream): the stream broke off: reading the response failed or timed out"),
            std::string::npos)
      << s.status().message();
}

TEST(BenchPlot, ScriptHasOnePointPerRun) {
  const std::string s = GnuplotScript({{"c=1", 100, 10, 5}, {"c=8", 600, 14, 9}}, "/tmp/x.png", "it's a title");
  EXPECT_NE(s.find("set output '/tmp/x.png'"), std::string::npos);
  EXPECT_NE(s.find("'it''s a title'"), std::string::npos);
  EXPECT_NE(s.find("600 14 9 \"c=8\""), std::string::npos) << s;
}

// ---- the binary -------------------------------------------------------------------------

using Cmd = ::kimirt::testing::CommandResult;

// Runs `kimirt ARGS`; `output` holds stdout and stderr.
Cmd Kimirt(const std::string& args) {
  return ::kimirt::testing::RunCommand(std::string(KIMIRT_BINARY) + " " + args + " 2>&1");
}

Json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return Json::parse(f, nullptr, false);
}

TEST_F(EvalE2eTest, BinaryEvalAndBench) {
  const std::string report = dir_ + "/report.json";
  Cmd e = Kimirt("eval gsm8k --url " + server_.url() + " --limit 5 --data-dir " + dir_ + " --output " + report +
              " --no-progress");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("|0.8000|"), std::string::npos) << e.output;
  const Json j = ReadJson(report);
  testing::ExpectSchema(j, testing::Gsm8kReportSchema());
  EXPECT_EQ(j["n_samples"], 5);

  const std::string bench = dir_ + "/bench.json", png = dir_ + "/bench.png";
  const bool plot = !FindOnPath("gnuplot").empty();
  Cmd b = Kimirt("bench serve --url " + server_.url() + "/v1 --num-prompts 4 --input-len 12 --output-len 3 " +
              "--sweep-concurrency 1,2 --no-progress --json " + bench + (plot ? " --plot " + png : ""));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Serving Benchmark Result"), std::string::npos) << b.output;
  const Json bj = ReadJson(bench);
  testing::ExpectSchema(bj, testing::BenchReportSchema());
  EXPECT_EQ(bj["runs"].size(), 2u);
  if (plot) {
    std::ifstream f(png, std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << b.output;
  }

  Cmd bad = Kimirt("bench frobnicate");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("unknown bench mode \"frobnicate\""), std::string::npos) << bad.output;
  Cmd no_url = Kimirt("eval gsm8k --limit 1");
  EXPECT_EQ(no_url.exit_code, 2);
  EXPECT_NE(no_url.output.find("--url is required"), std::string::npos) << no_url.output;
  Cmd refused = Kimirt("eval gsm8k --url http://127.0.0.1:1 --limit 1 --data-dir " + dir_);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("GET http://127.0.0.1:1/v1/models"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace kimirt::eval
