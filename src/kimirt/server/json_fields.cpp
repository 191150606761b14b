// Typed readers of JSON request fields (json_fields.h).
#include "kimirt/server/json_fields.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace kimirt::json_fields {

const Json* Member(const Json& obj, std::string_view name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError TypeError(const std::string& param, std::string_view expected, const Json& got) {
  return InvalidRequest("`" + param + "` must be " + std::string(expected) + ", got " + got.type_name(), param);
}

std::string FormatNumber(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

MaybeError AsInt(const Json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out) {
  int64_t value = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    value = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidRequest("`" + param + "` is too large", param);
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
      return InvalidRequest("`" + param + "` must be an integer, got " + FormatNumber(d), param);
    }
    value = static_cast<int64_t>(d);
  } else {
    return TypeError(param, "an integer", v);
  }
  if (value < lo || value > hi) {
    std::string range = hi == std::numeric_limits<int64_t>::max()
                            ? "at least " + std::to_string(lo)
                            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return InvalidRequest("`" + param + "` must be " + range + ", got " + std::to_string(value), param);
  }
  *out = value;
  return std::nullopt;
}

MaybeError ReadInt(const Json& obj, const char* name, int64_t lo, int64_t hi, int64_t* out, bool* set) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  KIMIRT_RETURN_IF_API_ERROR(AsInt(*v, name, lo, hi, out));
  if (set != nullptr) *set = true;
  return std::nullopt;
}

MaybeError ReadInt32(const Json& obj, const char* name, int64_t lo, int64_t hi, int32_t* out, bool* set) {
  int64_t v = *out;
  KIMIRT_RETURN_IF_API_ERROR(ReadInt(obj, name, lo, hi, &v, set));
  *out = static_cast<int32_t>(v);
  return std::nullopt;
}

MaybeError ReadFloat(const Json& obj, const char* name, const FloatRange& range, float* out) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return TypeError(name, "a number", *v);
  const double d = v->get<double>();
  const bool below = range.lo_open ? !(d > range.lo) : !(d >= range.lo);
  if (!std::isfinite(d) || below || d > range.hi) {
    return InvalidRequest("`" + std::string(name) + "` must be " + std::string(range.text) + ", got " +
                              FormatNumber(d),
                          name);
  }
  *out = static_cast<float>(d);
  return std::nullopt;
}

MaybeError ReadBool(const Json& obj, const char* name, bool* out, const std::string& param_prefix) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return TypeError(param_prefix + name, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeError ReadString(const Json& obj, const char* name, std::string* out, const std::string& param_prefix) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return TypeError(param_prefix + name, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

MaybeError TokenId(const Json& v, const std::string& param, int32_t vocab, int32_t* out) {
  int64_t id = 0;
  KIMIRT_RETURN_IF_API_ERROR(AsInt(v, param, 0, std::numeric_limits<int64_t>::max(), &id));
  if (id >= vocab) {
    return InvalidRequest("`" + param + "`: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")",
                          param);
  }
  *out = static_cast<int32_t>(id);
  return std::nullopt;
}


std::string Indexed(std::string_view base, size_t i) { return std::string(base) + "[" + std::to_string(i) + "]"; }

}  // namespace kimirt::json_fields
