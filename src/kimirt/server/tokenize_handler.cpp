// POST /tokenize, POST /detokenize, GET /version (tokenize_handler.h).
#include "kimirt/server/tokenize_handler.h"

#include <nlohmann/json.hpp>

#include "kimirt/server/chat_handler.h"
#include "kimirt/server/json_fields.h"
#include "kimirt/server/version.h"
#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {

using namespace json_fields;  // NOLINT: the readers are this file's vocabulary

HttpResponse HandleTokenize(const ServingContext& ctx, const HttpRequest& request) {
  Json body;
  if (auto e = ParseJsonBody(request.body, &body)) return ErrorResponse(*e);
  std::string model;
  if (auto e = ParseModelName(body, ctx.limits, &model)) return ErrorResponse(*e);
  bool token_strs = false;
  if (auto e = ReadBool(body, "return_token_strs", &token_strs)) return ErrorResponse(*e);
  std::vector<int32_t> ids;
  if (Member(body, "messages") != nullptr) {
    ChatRequest req;
    if (auto e = ParseChatBody(ctx, request.body, &req)) return ErrorResponse(*e);
    if (auto e = EncodeChatPrompt(ctx, req, &ids)) return ErrorResponse(*e);
  } else {
    const Json* prompt = Member(body, "prompt");
    if (prompt == nullptr) return ErrorResponse(InvalidRequest("`prompt` or `messages` is required", "prompt"));
    if (!prompt->is_string()) return ErrorResponse(TypeError("prompt", "a string", *prompt));
    ids = ctx.tokenizer->Encode(prompt->get<std::string>(), /*allow_special=*/true);
  }
  Json out = Json::object();
  out["count"] = ids.size();
  out["max_model_len"] = ctx.max_model_len > 0 ? Json(ctx.max_model_len) : Json(nullptr);
  out["tokens"] = ids;
  if (token_strs) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(ReplaceInvalidUtf8(ctx.tokenizer->TokenBytes(id)));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return JsonResponse(out);
}

HttpResponse HandleDetokenize(const ServingContext& ctx, const HttpRequest& request) {
  Json body;
  if (auto e = ParseJsonBody(request.body, &body)) return ErrorResponse(*e);
  std::string model;
  if (auto e = ParseModelName(body, ctx.limits, &model)) return ErrorResponse(*e);
  const Json* tokens = Member(body, "tokens");
  if (tokens == nullptr) return ErrorResponse(InvalidRequest("`tokens` is required", "tokens"));
  if (!tokens->is_array()) return ErrorResponse(TypeError("tokens", "an array of token ids", *tokens));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    int32_t id = 0;
    if (auto e = TokenId((*tokens)[i], Indexed("tokens", i), ctx.limits.vocab_size, &id)) return ErrorResponse(*e);
    ids.push_back(id);
  }
  return JsonResponse(Json{{"prompt", ReplaceInvalidUtf8(ctx.tokenizer->Decode(ids))}});
}

HttpResponse HandleVersion() { return JsonResponse(Json{{"version", kKimirtVersion}}); }

}  // namespace kimirt
