// Request parsing and validation: every invalid class names its field and gets the right kind.
#include "kimirt/server/openai_schema.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kimirt {
namespace {

SchemaLimits Limits() {
  SchemaLimits l;
  l.served_model_name = "tiny";
  l.vocab_size = 300;
  return l;
}

Json Body(std::string_view text) {
  Json j;
  EXPECT_FALSE(ParseJsonBody(text, &j).has_value()) << text;
  return j;
}

std::optional<ApiError> Completion(std::string_view text, CompletionRequest* out = nullptr) {
  CompletionRequest local;
  return ParseCompletionRequest(Body(text), Limits(), out != nullptr ? out : &local);
}

std::optional<ApiError> Chat(std::string_view text, ChatRequest* out = nullptr) {
  ChatRequest local;
  return ParseChatRequest(Body(text), Limits(), out != nullptr ? out : &local);
}

// The request is refused as invalid, blaming `param`.
void ExpectInvalid(const std::optional<ApiError>& e, const std::string& param, std::string_view text) {
  ASSERT_TRUE(e.has_value()) << text;
  EXPECT_EQ(e->kind, ApiErrorKind::kInvalidRequest) << text;
  EXPECT_EQ(e->param, param) << text << " → " << e->message;
  EXPECT_FALSE(e->message.empty());
}

TEST(OpenAiSchema, BodyMustBeAJsonObject) {
  Json j;
  // 1e400 overflows a double: nlohmann refuses it as a number.
  for (std::string_view bad : {"", "{", "nope", "{\"t\":1e400}", "{\"a\":1,}", "[1,2]", "\"text\"", "42", "null"}) {
    std::optional<ApiError> e = ParseJsonBody(bad, &j);
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_EQ(e->kind, ApiErrorKind::kInvalidRequest);
  }
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  EXPECT_TRUE(ParseJsonBody("{\"p\":" + deep + "}", &j).has_value());
}

TEST(OpenAiSchema, CompletionDefaultsAndValues) {
  CompletionRequest r;
  ASSERT_FALSE(Completion(R"({"model":"tiny","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,
      "top_k":-1,"min_p":0.1,"seed":-1,"presence_penalty":1,"frequency_penalty":-2,"repetition_penalty":1.1,
      "logit_bias":{"7":-100,"8":2.5},"ignore_eos":true,"stop":["a",""],"stop_token_ids":[3],"n":2,
      "logprobs":3,"echo":true,"stream":true,"stream_options":{"include_usage":true},
      "user":"x","some_vendor_extra":{"a":1}})",
                           &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[0].text, "hi");
  const SamplingParams& p = r.gen.sampling;
  EXPECT_EQ(p.max_tokens, 5);
  EXPECT_TRUE(r.gen.max_tokens_set);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 0);  // -1 → off
  EXPECT_EQ(*p.seed, ~uint64_t{0});
  ASSERT_EQ(p.logit_bias.size(), 2u);
  EXPECT_EQ(p.logit_bias[0], (std::pair<int32_t, float>{7, -100.0f}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop, std::vector<std::string>{"a"});  // "" dropped
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{3});
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.logprobs, 3);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);

  CompletionRequest d;
  ASSERT_FALSE(Completion(R"({"prompt":"x","temperature":null,"n":2.0})", &d));  // null = absent; 2.0 = 2
  EXPECT_EQ(d.model, "tiny");
  EXPECT_EQ(d.gen.sampling.max_tokens, 16);
  EXPECT_FALSE(d.gen.max_tokens_set);
  EXPECT_EQ(d.gen.sampling.temperature, 1.0f);
  EXPECT_EQ(d.gen.sampling.logprobs, -1);
  EXPECT_EQ(d.gen.sampling.n, 2);
}

TEST(OpenAiSchema, PromptShapes) {
  CompletionRequest r;
  ASSERT_FALSE(Completion(R"({"prompt":["a","b"]})", &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "b");
  r = {};
  ASSERT_FALSE(Completion(R"({"prompt":[1,2,3]})", &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  r = {};
  ASSERT_FALSE(Completion(R"({"prompt":[[1],[2,299]]})", &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{2, 299}));

  ExpectInvalid(Completion(R"({"model":"tiny"})"), "prompt", "missing");
  ExpectInvalid(Completion(R"({"prompt":null})"), "prompt", "null");
  ExpectInvalid(Completion(R"({"prompt":[]})"), "prompt", "empty list");
  ExpectInvalid(Completion(R"({"prompt":5})"), "prompt", "number");
  ExpectInvalid(Completion(R"({"prompt":{"a":1}})"), "prompt", "object");
  ExpectInvalid(Completion(R"({"prompt":["a",1]})"), "prompt[1]", "mixed");
  ExpectInvalid(Completion(R"({"prompt":[1,"a"]})"), "prompt[1]", "mixed ids");
  ExpectInvalid(Completion(R"({"prompt":[[1],"a"]})"), "prompt[1]", "mixed lists");
  ExpectInvalid(Completion(R"({"prompt":[1,300]})"), "prompt[1]", "id beyond vocab");
  ExpectInvalid(Completion(R"({"prompt":[-1]})"), "prompt[0]", "negative id");
  ExpectInvalid(Completion(R"({"prompt":[1.5]})"), "prompt[0]", "fractional id");
  ExpectInvalid(Completion(R"({"prompt":[[1],[400]]})"), "prompt[1][0]", "nested id beyond vocab");
  ExpectInvalid(Completion(R"({"prompt":[true]})"), "prompt[0]", "bool");
}

TEST(OpenAiSchema, WrongTypesNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":[1]})", "top_p"},
      {R"({"prompt":"x","top_k":1.5})", "top_k"},
      {R"({"prompt":"x","n":"2"})", "n"},
      {R"({"prompt":"x","n":true})", "n"},
      {R"({"prompt":"x","max_tokens":"10"})", "max_tokens"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream":1})", "stream"},
      {R"({"prompt":"x","echo":"true"})", "echo"},
      {R"({"prompt":"x","ignore_eos":0})", "ignore_eos"},
      {R"({"prompt":"x","stop":5})", "stop"},
      {R"({"prompt":"x","stop":["a",1]})", "stop[1]"},
      {R"({"prompt":"x","seed":"1"})", "seed"},
      {R"({"prompt":"x","seed":1.5})", "seed"},
      {R"({"prompt":"x","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"5":"1"}})", "logit_bias.5"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","stop_token_ids":3})", "stop_token_ids"},
      {R"({"prompt":"x","stream":true,"stream_options":true})", "stream_options"},
      {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":"y"}})", "stream_options.include_usage"},
      {R"({"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":1}})",
       "stream_options.continuous_usage_stats"},
      {R"({"prompt":"x","suffix":3})", "suffix"},
      {R"({"prompt":"x","model":7})", "model"},
  };
  for (const auto& [text, param] : cases) ExpectInvalid(Completion(text), param, text);
}

TEST(OpenAiSchema, OutOfRangeValuesNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"x","temperature":-0.1})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_p":1.01})", "top_p"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","min_p":1.5})", "min_p"},
      {R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":-3})", "frequency_penalty"},
      {R"({"prompt":"x","repetition_penalty":0})", "repetition_penalty"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":129})", "n"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":-5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":3000000000})", "max_tokens"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","logprobs":-1})", "logprobs"},
      {R"({"prompt":"x","logit_bias":{"300":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias"},
      {R"({"prompt":"x","stop_token_ids":[300]})", "stop_token_ids"},
      {R"({"prompt":"x","best_of":3,"n":2})", "best_of"},
      {R"({"prompt":"x","suffix":"tail"})", "suffix"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":["a","b","c","d","e","f","g","h","i"],"n":128})", "n"},
      // Issue 11 defect 9: the engine's stop limits (16 strings of 256 bytes) are checked here,
      // so the error names the field instead of carrying param null.
      {R"({"prompt":"x","stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})", "stop"},
      {R"({"prompt":"x","min_tokens":-1})", "min_tokens"},
      {R"({"prompt":"x","min_tokens":6,"max_tokens":5})", "min_tokens"},
      {R"({"prompt":"x","min_tokens":17})", "min_tokens"},  // over the default max_tokens of 16
      {R"({"prompt":"x","skip_special_tokens":"no"})", "skip_special_tokens"},
      {R"({"prompt":"x","include_stop_str_in_output":1})", "include_stop_str_in_output"},
      {R"({"prompt":"x","use_beam_search":true})", "use_beam_search"},
      {R"({"prompt":"x","guided_json":{}})", "guided_json"},
      {R"({"prompt":"x","response_format":{"type":"json_object"}})", "response_format"},
  };
  for (const auto& [text, param] : cases) ExpectInvalid(Completion(text), param, text);
  const std::string long_stop(SamplingParams::kMaxStopBytes + 1, 's');
  ExpectInvalid(Completion(R"({"prompt":"x","stop":["ok",")" + long_stop + R"("]})"), "stop[1]", "long stop");
  ExpectInvalid(Completion(R"({"prompt":"x","stop":")" + long_stop + R"("})"), "stop", "long stop");
}

// vLLM's extensions that kimirt honours reach the sampling params.
TEST(OpenAiSchema, VllmExtrasAreRead) {
  CompletionRequest r;
  ASSERT_FALSE(Completion(R"({"prompt":"x","max_tokens":9,"min_tokens":4,"skip_special_tokens":false,
                             "include_stop_str_in_output":true,"use_beam_search":false,"guided_json":null})",
                          &r));
  EXPECT_EQ(r.gen.sampling.min_tokens, 4);
  EXPECT_FALSE(r.gen.sampling.skip_special_tokens);
  EXPECT_TRUE(r.gen.include_stop_str_in_output);
  CompletionRequest d;
  ASSERT_FALSE(Completion(R"({"prompt":"x"})", &d));
  EXPECT_EQ(d.gen.sampling.min_tokens, 0);
  EXPECT_TRUE(d.gen.sampling.skip_special_tokens);
  EXPECT_FALSE(d.gen.include_stop_str_in_output);
}

TEST(OpenAiSchema, UnknownModelIsNotFound) {
  std::optional<ApiError> e = Completion(R"({"model":"gpt-4","prompt":"x"})");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, ApiErrorKind::kModelNotFound);
  EXPECT_EQ(e->param, "model");
  EXPECT_NE(e->message.find("gpt-4"), std::string::npos);
  e = Chat(R"({"model":"other","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, ApiErrorKind::kModelNotFound);
}

TEST(OpenAiSchema, ChatValues) {
  ChatRequest r;
  ASSERT_FALSE(Chat(R"({"model":"tiny","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"u"},
      {"role":"assistant","content":null,"reasoning_content":"hm",
       "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},
                     {"id":"c2","type":"function","function":{"name":"g","arguments":{"z":2,"a":1}}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}],
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","b":1,"a":2}}}],
      "tool_choice":"none","response_format":{"type":"text"},
      "chat_template_kwargs":{"thinking":false},"reasoning_effort":"minimal","max_completion_tokens":9,
      "logprobs":true,"top_logprobs":2})",
                    &r));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  ASSERT_EQ(r.messages[1].content_parts.size(), 2u);
  EXPECT_EQ(r.messages[1].content_parts[1].text, "b");
  EXPECT_EQ(r.messages[1].name, "u");
  EXPECT_EQ(r.messages[2].reasoning_content, "hm");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(r.messages[2].tool_calls[1].arguments, "{\"z\":2,\"a\":1}");  // document order kept
  EXPECT_EQ(r.messages[3].tool_call_id, "c1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_NE(r.tools[0].json.find("\"b\":1,\"a\":2"), std::string::npos);
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::kNone);
  EXPECT_EQ(r.chat.response_format.type, ResponseFormat::Type::kText);
  EXPECT_FALSE(r.chat.thinking);
  EXPECT_EQ(r.chat.thinking_effort, ThinkingEffort::kLow);
  EXPECT_EQ(r.gen.sampling.max_tokens, 9);
  EXPECT_EQ(r.gen.sampling.logprobs, 2);
  EXPECT_TRUE(r.logprobs);

  ChatRequest d;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})", &d));
  EXPECT_TRUE(d.chat.thinking);
  EXPECT_EQ(d.gen.sampling.logprobs, -1);
  EXPECT_FALSE(d.gen.max_tokens_set);
  ChatRequest k;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"x"}],
                       "chat_template_kwargs":{"thinking_effort":"high"}})", &k));
  EXPECT_EQ(k.chat.thinking_effort, ThinkingEffort::kHigh);
}

TEST(OpenAiSchema, ChatInvalid) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model":"tiny"})", "messages"},
      {R"({"messages":null})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":["hi"]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"audio"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text"},
      {R"({"messages":[{"role":"user","content":"x","name":3}]})", "messages[0].name"},
      {R"({"messages":[{"role":"assistant","tool_calls":{}}]})", "messages[0].tool_calls"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})", "messages[0].tool_calls[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools[0].function"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code","function":{"name":"f"}}]})", "tools[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"maybe"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", "response_format.type"},
      // Issue 11 defect 9: a tool's parameters must be a JSON Schema object.
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}]})", "tools[0].function.parameters"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]})", "tools[0].function.parameters"},
      // Issue 11 defect 8: what needs constrained decoding or beam search is refused, by name.
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{}}}})", "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})", "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"guided_json":{"type":"object"}})", "guided_json"},
      {R"({"messages":[{"role":"user","content":"x"}],"guided_choice":["a","b"]})", "guided_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"guided_regex":"a+"})", "guided_regex"},
      {R"({"messages":[{"role":"user","content":"x"}],"guided_grammar":"root ::= x"})", "guided_grammar"},
      {R"({"messages":[{"role":"user","content":"x"}],"structured_outputs":{"json":{}}})", "structured_outputs"},
      {R"({"messages":[{"role":"user","content":"x"}],"use_beam_search":true})", "use_beam_search"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":"no"}})", "chat_template_kwargs.thinking"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":-1})", "temperature"},
  };
  for (const auto& [text, param] : cases) ExpectInvalid(Chat(text), param, text);
}

}  // namespace
}  // namespace kimirt
