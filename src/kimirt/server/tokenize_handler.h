// vLLM's utility endpoints, same request and response shapes:
//   POST /tokenize     {"prompt": "text"} or {"messages": [...], chat fields…}
//                      → {"count": N, "max_model_len": M, "tokens": [...], "token_strs": null | [...]}
//                      (`return_token_strs: true` lists each token's text). A prompt is encoded
//                      as /v1/completions encodes it; messages are rendered as
//                      /v1/chat/completions renders them, so the count is the prompt_tokens a
//                      request would be billed.
//   POST /detokenize   {"tokens": [ids]} → {"prompt": "text"}
//   GET  /version      {"version": "0.1.0"}
// `model`, when given, must be the served model's name (404 otherwise), as on /v1/*.
#pragma once

#include "kimirt/server/http_server.h"
#include "kimirt/server/serving_context.h"

namespace kimirt {

HttpResponse HandleTokenize(const ServingContext& ctx, const HttpRequest& request);
HttpResponse HandleDetokenize(const ServingContext& ctx, const HttpRequest& request);
HttpResponse HandleVersion();

}  // namespace kimirt
