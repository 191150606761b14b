// libFuzzer target: config.json parsing and the layout it implies must never crash, hang or
// allocate without bound, whatever the bytes (scripts/fuzz.sh runs it).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kimirt;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<ModelConfig> c = ParseModelConfig(text, "fuzz");
  if (!c.ok()) return 0;
  // Small layouts only: building K3's 497k names per input would slow the fuzzer to a crawl
  // without testing anything new.
  if (c->num_hidden_layers * (c->num_experts + 8) > 20000) return 0;
  Result<Layout> l = Layout::Build(*c);
  if (!l.ok()) return 0;
  for (int tp : {1, 2, 3, 8}) {
    Parallelism par;
    par.tp = tp;
    if (!l->CheckParallelism(par).ok()) continue;
    for (const TensorSpec& t : l->tensors()) (void)l->SliceFor(t, par, tp - 1);
  }
  return 0;
}
