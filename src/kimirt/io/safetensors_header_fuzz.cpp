// libFuzzer target: a safetensors file image (u64 little-endian N, N bytes of header JSON, the
// data section) goes through the same checks as SafetensorsFile::Open and then
// ParseSafetensorsHeader; the whole input also goes through the JSON scanner. Nothing may
// crash, hang or allocate without bound, and whatever the parser accepts must satisfy the
// format's promises (checked below; a violation traps, which libFuzzer reports as a crash).
//
// Seed corpus: run the target with KIMIRT_FUZZ_WRITE_SEEDS=DIR and -runs=0 and it writes
// valid and near-valid file images into DIR (made by SafetensorsWriter, so they are valid by
// construction) before exiting; scripts/fuzz.sh does this and adds the fixture shards' headers:
//   KIMIRT_FUZZ_WRITE_SEEDS=corpus/safetensors_header_fuzz \
//       build-fuzz/fuzz/safetensors_header_fuzz -runs=0
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/io/json_scanner.h"
#include "kimirt/io/safetensors.h"

namespace {

using namespace kimirt;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// A file image from raw header text (for seeds the writer cannot produce: broken ones).
void WriteImage(const std::string& path, std::string_view json, size_t data_size) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  out += json;
  out.append(data_size, '\x5a');
  std::ofstream(path, std::ios::binary) << out;
}

void WriteSeeds(const std::string& dir) {
  std::vector<std::vector<uint8_t>> keep;  // spans handed to writers must outlive Write()
  auto bytes = [&](size_t n) -> std::span<const uint8_t> {
    keep.emplace_back(n);
    for (size_t i = 0; i < n; ++i) keep.back()[i] = static_cast<uint8_t>(i * 31 + 7);
    return keep.back();
  };
  auto add = [&](SafetensorsWriter& w, std::string name, DType dt, Shape shape) {
    const size_t n = static_cast<size_t>(NumElements(shape)) * DTypeSize(dt);
    w.Add(std::move(name), dt, std::move(shape), bytes(n));
  };
  {
    SafetensorsWriter w;
    (void)w.Write(dir + "/empty");
  }
  {
    SafetensorsWriter w;
    add(w, "w", DType::kU8, {4});
    (void)w.Write(dir + "/one");
  }
  {
    SafetensorsWriter w;
    for (int i = 0; i < kNumDTypes; ++i) {
      const auto dt = static_cast<DType>(i);
      add(w, "t." + std::string(DTypeName(dt)), dt, {2, 1});
    }
    add(w, "scalar", DType::kF32, {});
    add(w, "zero", DType::kBF16, {0, 3});
    w.SetMetadata("format", "pt");
    (void)w.Write(dir + "/dtypes");
  }
  {
    SafetensorsWriter w;
    add(w, "q\"b\\s\n\t\x01 \xc3\xa9 \xf0\x9f\x98\x80", DType::kI8, {3});
    w.SetMetadata("k\"ey", "v\\al\xe2\x82\xac");
    (void)w.Write(dir + "/escapes");
  }
  {
    SafetensorsWriter w;  // K3-like names, tiny shapes
    for (int e = 0; e < 4; ++e) {
      for (const char* p : {"w1", "w2", "w3"}) {
        const std::string base = "language_model.model.layers.17.block_sparse_moe.experts." +
                                 std::to_string(e) + "." + p;
        add(w, base + ".weight_packed", DType::kU8, {4, 2});
        add(w, base + ".weight_scale", DType::kF8E8M0, {4, 1});
      }
    }
    add(w, "language_model.model.layers.17.self_attn.kv_a_layernorm.weight", DType::kBF16, {8});
    (void)w.Write(dir + "/k3");
  }
  // Offsets not in key order, and broken headers that stop at different checks.
  WriteImage(dir + "/unsorted",
             R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
             R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
             4);
  WriteImage(dir + "/overlap",
             R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
             6);
  WriteImage(dir + "/gap", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6);
  WriteImage(dir + "/baddtype", R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2);
  WriteImage(dir + "/numbers",
             R"({"a":{"dtype":"U16","shape":[1e3,-1,1.5],"data_offsets":[0,18446744073709551616]}})",
             0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("KIMIRT_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)ValidateJson(input);  // the scanner alone, on arbitrary bytes

  // SafetensorsFile::Open's length checks, on the image in memory.
  if (size < 8) return 0;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n == 0 || n > kMaxSafetensorsHeaderBytes || n > size - 8) return 0;
  const std::string_view json = input.substr(8, n);
  const uint64_t data_size = size - 8 - n;
  Result<SafetensorsHeader> h = ParseSafetensorsHeader(json, data_size);
  if (!h.ok()) return 0;

  // Accepted => valid JSON, and the tensors tile the data section exactly with consistent sizes.
  Check(ValidateJson(json).ok());
  std::vector<const TensorInfo*> byoffset;
  for (const TensorInfo& t : h->tensors) {
    Check(t.begin <= t.end && t.end <= data_size);
    for (int64_t d : t.shape) Check(d >= 0);
    Check(static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype) == t.nbytes());
    Check(t.name != "__metadata__" && IsValidUtf8(t.name));
    byoffset.push_back(&t);
  }
  std::sort(byoffset.begin(), byoffset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  for (const TensorInfo* t : byoffset) {
    Check(t->begin == pos);
    pos = t->end;
  }
  Check(pos == data_size);
  std::vector<std::string_view> names;
  for (const TensorInfo& t : h->tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  Check(std::adjacent_find(names.begin(), names.end()) == names.end());
  for (const auto& [k, v] : h->metadata) Check(IsValidUtf8(k) && IsValidUtf8(v));
  return 0;
}
