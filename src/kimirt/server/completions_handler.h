// POST /v1/completions (OpenAI legacy completions, with vLLM's sampling extras).
//
// Prompts are a string, a list of strings, a list of token ids or a list of such lists; each
// prompt gets `n` choices, indexed prompt × n + i as vLLM does. Text prompts are encoded with
// special-token names recognised (Hugging Face's default for Kimi's tokenizer) and no BOS.
// Streams send `data: {text_completion chunk}` events, a usage-only chunk when
// stream_options.include_usage, then `data: [DONE]`; an engine failure mid-stream becomes an
// `data: {"error": …}` event before [DONE], since the status line has already gone out.
#pragma once

#include "kimirt/server/http_server.h"
#include "kimirt/server/serving_context.h"

namespace kimirt {

HttpResponse HandleCompletions(const ServingContext& ctx, const HttpRequest& request);

}  // namespace kimirt
