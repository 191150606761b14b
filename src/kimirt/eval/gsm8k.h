// GSM8K as lm-eval's `gsm8k` task presents it (EleutherAI/lm-evaluation-harness:
// lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0): the data, the prompts and the request settings.
//
// Prompt (plain text, as for --model local-completions): five few-shot examples, each
//   "Question: {question}\nAnswer: {answer}\n\n"   (doc_to_text, target_delimiter " ",
//                                                    doc_to_target = the full answer with its
//                                                    <<calc>> notes and "#### N", fewshot_delimiter)
// then "Question: {question}\nAnswer:" for the test document (no trailing space).
// The examples come from the train split, drawn by ONE random.Random(1234) shared by all test
// documents in order (lm_eval/api/samplers.py ContextSampler.sample: rnd.sample(train, 5); the
// eval doc is not excluded since fewshot_split != test_split; lm_eval/evaluator.py seeds it via
// set_fewshot_seed(fewshot_random_seed=1234)). So document i's examples depend on the draws for
// documents 0..i-1, and --limit N gives the first N prompts of a full run.
//
// Chat (lm-eval --model local-chat-completions --apply_chat_template, which turns
// fewshot_as_multiturn on): user "Question: ...\nAnswer:" / assistant "{answer}" per example,
// then the user question (lm_eval/api/task.py fewshot_context + build_qa_turn). With
// fewshot_as_multiturn off, everything collapses into one user message holding the plain-text
// prompt (lm_eval/api/utils.py multiturn_to_singleturn).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt::eval {

struct Gsm8kDoc {
  std::string question;
  std::string answer;  // the worked solution ending in "#### <number>"
};

// One JSON object per line with string fields "question" and "answer" (the openai/gsm8k files).
Result<std::vector<Gsm8kDoc>> LoadGsm8kJsonl(const std::string& path);

struct Gsm8kData {
  std::string dir;
  std::vector<Gsm8kDoc> train;
  std::vector<Gsm8kDoc> test;
};
// Reads dir/train.jsonl and dir/test.jsonl.
Result<Gsm8kData> LoadGsm8k(const std::string& dir);
// The default data directory: a data/gsm8k beside or above the binary (`argv0`), the source
// tree's data/gsm8k, then the steering repo's shared/data/gsm8k. Empty when none has test.jsonl.
std::string DefaultGsm8kDataDir(const char* argv0);

// The task's settings (gsm8k.yaml generation_kwargs and lm-eval's API-model defaults).
inline constexpr int kGsm8kNumFewshot = 5;
inline constexpr uint64_t kGsm8kFewshotSeed = 1234;   // lm_eval/defaults.py DEFAULT_OTHER_SEED
inline constexpr int kGsm8kMaxGenToks = 256;          // lm_eval/models/api_models.py max_gen_toks
inline constexpr int64_t kGsm8kRequestSeed = 1234;    // api_models.py `seed`, sent in every payload
std::vector<std::string> Gsm8kStopSequences();        // "Question:", "</s>", "<|im_end|>"

struct ChatTurn {
  std::string role;
  std::string content;
};

struct Gsm8kPrompt {
  size_t doc_id = 0;                 // index in the test split
  std::vector<size_t> fewshot_ids;   // indices in the train split, in prompt order
  std::string text;                  // the plain-text prompt
  std::vector<ChatTurn> messages;    // the chat form (see above)
};

// "Question: {question}\nAnswer:"
std::string Gsm8kDocToText(const Gsm8kDoc& doc);

// Prompts for test documents [0, limit) (limit < 0: all), in order.
Result<std::vector<Gsm8kPrompt>> BuildGsm8kPrompts(const std::vector<Gsm8kDoc>& train,
                                                   const std::vector<Gsm8kDoc>& test, int64_t limit,
                                                   int num_fewshot, uint64_t fewshot_seed,
                                                   bool fewshot_as_multiturn);

}  // namespace kimirt::eval
