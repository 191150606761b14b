// Typed readers of JSON request fields, shared by the OpenAI schema parsers (openai_schema.cpp,
// chat_schema.cpp). Each returns an ApiError naming the field (`param`) when the value has the
// wrong type or range; an absent field or JSON null leaves the output untouched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kimirt/server/errors.h"
#include "kimirt/server/openai_schema.h"

namespace kimirt::json_fields {

using MaybeError = std::optional<ApiError>;

#define KIMIRT_RETURN_IF_API_ERROR(expr)             \
  do {                                               \
    if (auto _api_error = (expr)) return _api_error; \
  } while (0)

// The member `name`, or null when absent or JSON null.
const Json* Member(const Json& obj, std::string_view name);
ApiError TypeError(const std::string& param, std::string_view expected, const Json& got);
std::string FormatNumber(double v);
// "base[i]"
std::string Indexed(std::string_view base, size_t i);

// An integer in [lo, hi]; 2.0 counts as 2 (some clients write every number as a float), 2.5 not.
MaybeError AsInt(const Json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out);
MaybeError ReadInt(const Json& obj, const char* name, int64_t lo, int64_t hi, int64_t* out, bool* set = nullptr);
MaybeError ReadInt32(const Json& obj, const char* name, int64_t lo, int64_t hi, int32_t* out, bool* set = nullptr);

struct FloatRange {
  double lo, hi;
  bool lo_open = false;
  std::string_view text;  // as shown in the error, e.g. "in (0, 1]"
};
MaybeError ReadFloat(const Json& obj, const char* name, const FloatRange& range, float* out);
MaybeError ReadBool(const Json& obj, const char* name, bool* out, const std::string& param_prefix = "");
MaybeError ReadString(const Json& obj, const char* name, std::string* out, const std::string& param_prefix = "");
// A token id in [0, vocab).
MaybeError TokenId(const Json& v, const std::string& param, int32_t vocab, int32_t* out);

}  // namespace kimirt::json_fields
