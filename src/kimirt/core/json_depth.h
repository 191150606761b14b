// A guard run before recursive JSON parsers and dumpers see untrusted text: true when no array or
// object nests deeper than `max_depth` (strings and their escapes are skipped). Lets a hostile
// body of a million '[' be refused instead of exhausting the stack.
#pragma once

#include <string_view>

namespace kimirt {

bool JsonNestingWithin(std::string_view text, int max_depth);

}  // namespace kimirt
