// `kimirt tokenize` and `kimirt detokenize`: the model's tokenizer from the command line.
//   kimirt tokenize --model DIR [--allow-special] [--verbose] "text"
//   kimirt tokenize --model DIR --chat REQUEST.json [--verbose]   (an OpenAI chat request body,
//                   rendered with the model family's chat format, generation prompt included)
//   kimirt detokenize --model DIR 1,2,3
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/model/config.h"
#include "kimirt/server/openai_schema.h"
#include "kimirt/tokenizer/chat_renderer.h"
#include "kimirt/tokenizer/kimi_linear_chat.h"
#include "kimirt/tokenizer/tokenizer.h"
#include "kimirt/tools/builtin_model.h"

namespace kimirt {
namespace {

int Fail(const char* cmd, const Status& s, int code = 1) {
  std::fprintf(stderr, "kimirt %s: %s\n", cmd, s.message().c_str());
  return code;
}

// The model directory, or the built-in model's when none is given.
Result<std::string> ModelDir(const std::string& given) {
  if (!given.empty()) return given;
  return EnsureBuiltinModel();
}

// A printable form of a token's bytes: printable ASCII as is, everything else as \xNN.
std::string Printable(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      s += buf;
    }
  }
  return s;
}

Result<std::vector<int32_t>> RenderChatFile(const std::string& path, const std::string& dir, const Tokenizer& tok) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  Json body;
  if (std::optional<ApiError> e = ParseJsonBody(ss.str(), &body)) return InvalidArgument(path + ": " + e->message);
  SchemaLimits limits;
  limits.vocab_size = tok.vocab_size();
  ChatRequest req;
  if (body.contains("model")) limits.served_model_name = body["model"].is_string() ? body["model"].get<std::string>() : "";
  if (std::optional<ApiError> e = ParseChatRequest(body, limits, &req)) {
    return InvalidArgument(path + ": " + (e->param.empty() ? "" : e->param + ": ") + e->message);
  }
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  Result<std::vector<ChatSegment>> segments =
      config.family == ModelFamily::kKimiK3 ? RenderK3Chat(req.messages, req.tools, req.chat)
                                            : RenderKimiLinearChat(req.messages, req.tools, req.chat);
  if (!segments.ok()) return segments.status().WithContext(path);
  return EncodeSegments(tok, *segments);
}

}  // namespace

int RunTokenizeCommand(int argc, char** argv) {
  std::string model_dir, chat_path;
  bool allow_special = false, verbose = false;
  FlagSet f("tokenize", "Prints the token ids of a text (plain text by default) or of a rendered chat request.");
  f.String("model", &model_dir, "model directory with tiktoken.model (default: the built-in model)");
  f.String("chat", &chat_path, "an OpenAI chat request body (JSON file) to render and encode");
  f.Bool("allow-special", &allow_special, "encode special-token strings in the text as their ids");
  f.Bool("verbose", &verbose, "one line per token: id and bytes");
  std::vector<std::string> text;
  if (Status s = f.Parse(argc, argv, 2, &text); !s.ok()) return Fail("tokenize", s, 2);
  if (f.help_requested()) {
    std::fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (chat_path.empty() == (text.size() != 1)) {
    return Fail("tokenize", InvalidArgument("give one TEXT argument or --chat FILE"), 2);
  }
  Result<std::string> dir = ModelDir(model_dir);
  if (!dir.ok()) return Fail("tokenize", dir.status());
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(*dir);
  if (!tok.ok()) return Fail("tokenize", tok.status());
  Result<std::vector<int32_t>> ids = chat_path.empty() ? Result<std::vector<int32_t>>((*tok)->Encode(text[0], allow_special))
                                                       : RenderChatFile(chat_path, *dir, **tok);
  if (!ids.ok()) return Fail("tokenize", ids.status());
  if (verbose) {
    for (int32_t id : *ids) std::printf("%d\t%s\n", id, Printable((*tok)->TokenBytes(id)).c_str());
    std::printf("%zu tokens\n", ids->size());
    return 0;
  }
  std::string line;
  for (int32_t id : *ids) line += (line.empty() ? "" : ",") + std::to_string(id);
  std::printf("%s\n", line.c_str());
  return 0;
}

int RunDetokenizeCommand(int argc, char** argv) {
  std::string model_dir;
  FlagSet f("detokenize", "Prints the text of comma-separated token ids (special tokens by name).");
  f.String("model", &model_dir, "model directory with tiktoken.model (default: the built-in model)");
  std::vector<std::string> args;
  if (Status s = f.Parse(argc, argv, 2, &args); !s.ok()) return Fail("detokenize", s, 2);
  if (f.help_requested()) {
    std::fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (args.size() != 1) return Fail("detokenize", InvalidArgument("give the ids as one argument: 1,2,3"), 2);
  Result<std::string> dir = ModelDir(model_dir);
  if (!dir.ok()) return Fail("detokenize", dir.status());
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(*dir);
  if (!tok.ok()) return Fail("detokenize", tok.status());
  std::vector<int32_t> ids;
  std::stringstream ss(args[0]);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v >= (*tok)->vocab_size()) {
      return Fail("detokenize", InvalidArgument("\"" + part + "\" is not a token id of this tokenizer (0.." +
                                                std::to_string((*tok)->vocab_size() - 1) + ")"),
                  2);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  const std::string bytes = (*tok)->Decode(ids);
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace kimirt
